"""``satgate-mcp tools pins`` and ``satgate-mcp tools approve``: the operator's side of pinned tool definitions.

Both read the store the daemons use (``SATGATE_REDIS_URL``, else the state folder's database a daemon made,
as ``token revoke`` does) and only the variables that name it, so an unrelated bad setting never blocks an
approval. An approval is written to the store; every daemon on it picks it up within a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from satgate_mcp.config_problems import format_errors
from satgate_mcp.errors import ConfigError
from satgate_mcp.exits import ExitCode
from satgate_mcp.policy import pins
from satgate_mcp.policy.pins import Pin, PinStore
from satgate_mcp.settings import ENV_PREFIX
from satgate_mcp.stores import cli_pins

PROG = "satgate-mcp"


class PinSettings(BaseSettings):
    """Where the pins are: the settings that pick the store, read from the same places as ``Settings``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_file_encoding="utf-8")

    redis_url: str | None = None
    redis_timeout: float = 0.5
    state_dir: str | None = None
    revocation_file: Path | None = None  # unused here; part of the store settings' shape

    @field_validator("redis_url", "state_dir", "revocation_file", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


def add_parser(commands: Any) -> None:
    """The ``tools`` command group, under the CLI's subcommands."""
    tools = commands.add_parser("tools", help="list and approve pinned upstream tool definitions")
    actions = tools.add_subparsers(dest="tools_command", required=True, metavar="ACTION")
    config_help = "env-style file to read SATGATE_STATE_DIR / SATGATE_REDIS_URL from"
    listed = actions.add_parser("pins", help="every pin: upstream/tool, fingerprint, first seen, status")
    listed.add_argument("--json", action="store_true", help="one JSON object per pin, one per line")
    listed.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    approve = actions.add_parser("approve", help="approve changed or new tool definitions (every daemon, within 1 s)")
    which = approve.add_mutually_exclusive_group(required=True)
    which.add_argument("target", nargs="?", metavar="UPSTREAM/TOOL", help="one tool, by the upstream's own name")
    which.add_argument("--upstream", metavar="NAME", help="every pending tool of one upstream")
    which.add_argument("--all", action="store_true", help="every pending tool")
    approve.add_argument("--config", type=Path, metavar="PATH", help=config_help)


def _fail(message: str, code: ExitCode = ExitCode.CONFIG) -> ExitCode:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


P = TypeVar("P", bound=BaseSettings)
S = TypeVar("S")


def open_store(args: argparse.Namespace, settings_type: type[P], opener: Callable[[P], S | str]
               ) -> tuple[P, S] | ExitCode:
    """The settings (``--config``'s file, else the environment) and the store they name; a config problem is
    said in one line and its exit code returned instead."""
    if args.config is not None and not args.config.is_file():
        return _fail(f"config file not found: {args.config}")
    try:
        settings = settings_type(_env_file=args.config) if args.config else settings_type()
        store = opener(settings)
    except ValidationError as exc:
        print(format_errors(exc), file=sys.stderr)
        return ExitCode.CONFIG
    except ConfigError as exc:
        return _fail(str(exc))
    if isinstance(store, str):
        return _fail(store)
    return settings, store


def main(args: argparse.Namespace) -> ExitCode:
    """Run ``tools pins`` or ``tools approve``."""
    opened = open_store(args, PinSettings, cli_pins)
    if isinstance(opened, ExitCode):
        return opened
    _, store = opened
    run = show_pins(store, as_json=args.json) if args.tools_command == "pins" else approve_pins(
        store, target=args.target, upstream=args.upstream)
    try:
        return asyncio.run(run)
    except Exception as exc:  # a store that does not answer: say what, no traceback
        return _fail(f"the pin store did not answer: {type(exc).__name__}: {exc}", ExitCode.FAILED)


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pin_row(pin: Pin) -> dict[str, Any]:
    """What ``tools pins --json`` prints for one pin."""
    return {"upstream": pin.upstream, "tool": pin.tool, "status": pin.status, "fingerprint": pin.approved,
            "pending": pin.pending, "first_seen": _when(pin.first_seen), "changed_at": _when(pin.changed_at),
            "approved_at": _when(pin.approved_at),
            "changed": pins.changed_fields(pin.approved_definition, pin.pending_definition) if pin.pending else []}


def pin_line(pin: Pin) -> str:
    """One line of ``tools pins``: what, status, fingerprints (short), first seen, what changed."""
    row = pin_row(pin)
    fingerprint = (pin.approved or "-")[:16]
    pending = f" -> {pin.pending[:16]} ({', '.join(row['changed'])})" if pin.pending else ""
    return (f"{pin.upstream}/{pin.tool}  {pins.STATUS_TEXT[pin.status]}  {fingerprint}{pending}  "
            f"first seen {row['first_seen']}")


async def show_pins(store: PinStore, *, as_json: bool = False) -> ExitCode:
    """Print every pin (``tools pins``)."""
    try:
        found = await store.pins()
    finally:
        await store.aclose()
    for pin in sorted(found, key=lambda p: (p.upstream, p.tool)):
        print(json.dumps(pin_row(pin)) if as_json else pin_line(pin))
    if not found and not as_json:
        print("no pins yet: a daemon pins each upstream's tools when it first lists them", file=sys.stderr)
    return ExitCode.OK


async def approve_pins(store: PinStore, *, target: str | None = None, upstream: str | None = None,
                       now: float | None = None) -> ExitCode:
    """Approve what is pending on the pins named (``tools approve``); FAILED when none was named or pending."""
    stamp = time.time() if now is None else now
    approved: list[Pin] = []
    try:
        chosen = [pin for pin in await store.pins() if pins.selected(pin, target=target, upstream=upstream)]
        for pin in chosen:
            _, after = await store.update(pin.upstream, pin.tool, lambda found: pins.approve(found, stamp))
            if after is not None and after.approved_at == stamp:
                approved.append(after)
    finally:
        await store.aclose()
    for pin in approved:
        print(f"approved {pin.upstream}/{pin.tool} ({pin.approved})")
    if approved:
        return ExitCode.OK
    named = target or (f"upstream {upstream}" if upstream else "any tool")
    why = "no such pin" if not chosen else "nothing is pending approval"
    return _fail(f"nothing approved for {named}: {why} (satgate-mcp tools pins lists them)", ExitCode.FAILED)

"""``satgate-mcp approvals list|approve|deny``: the operator's side of approval holds.

The commands read the store the daemons use (``SATGATE_REDIS_URL``, else the state folder's database a daemon
made), like ``tools approve``. A decision is written there at once and taken once: a second approve or deny of
the same id, or one after its expiry, is refused and told what happened first. The agent then repeats its
identical call, which runs once, on whichever machine it reaches; a call kept waiting (``wait``) goes on within
half a second.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

from satgate_mcp import events
from satgate_mcp.cli_tools import PinSettings, open_store
from satgate_mcp.exits import ExitCode
from satgate_mcp.policy.approvals import ApprovalStore, HeldCall, decision_text, iso
from satgate_mcp.stores import cli_approvals

PROG = "satgate-mcp"


class ApprovalSettings(PinSettings):
    """The store's settings, and the daemon's events file: a decision is published there as the console's is."""

    events_file: Path | None = None


def add_parser(commands: Any) -> None:
    """The ``approvals`` command group, under the CLI's subcommands."""
    approvals = commands.add_parser("approvals", help="list, approve and deny tool calls held for approval")
    actions = approvals.add_subparsers(dest="approvals_command", required=True, metavar="ACTION")
    config_help = "env-style file to read SATGATE_STATE_DIR / SATGATE_REDIS_URL from"
    listed = actions.add_parser("list", help="held calls, newest first: id, state, tool, token, reason, expiry")
    listed.add_argument("--json", action="store_true", help="one JSON object per held call, one per line")
    listed.add_argument("--all", action="store_true", help="decided and expired ones too (kept for a day)")
    listed.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    for name, what in (("approve", "let the identical call run once"), ("deny", "refuse it")):
        action = actions.add_parser(name, help=f"decide a held call: {what}")
        action.add_argument("approval_id", metavar="ID", help="the id the agent was given (apr_...)")
        action.add_argument("--by", metavar="NAME", help="who decides (default: user@host)")
        if name == "deny":
            action.add_argument("--reason", metavar="TEXT", help="told to the agent with the refusal")
        action.add_argument("--config", type=Path, metavar="PATH", help=config_help)


def _fail(message: str, code: ExitCode = ExitCode.CONFIG) -> ExitCode:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def operator_name() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return "operator"


def main(args: argparse.Namespace) -> ExitCode:
    """Run ``approvals list``, ``approve`` or ``deny``."""
    opened = open_store(args, ApprovalSettings, cli_approvals)
    if isinstance(opened, ExitCode):
        return opened
    settings, store = opened
    if args.approvals_command == "list":
        run = show(store, as_json=args.json, everything=args.all)
    else:
        run = decide(store, args.approval_id, approve=args.approvals_command == "approve",
                     by=args.by or operator_name(), note=getattr(args, "reason", None),
                     events_file=settings.events_file)
    try:
        return asyncio.run(run)
    except Exception as exc:  # a store that does not answer: say what, no traceback
        return _fail(f"the approval store did not answer: {type(exc).__name__}: {exc}", ExitCode.FAILED)


def held_line(record: HeldCall, now: float) -> str:
    """One line of ``approvals list``."""
    state = record.view(now)["state"]
    decided = f" by {record.decided_by}" if record.decided_by else ""
    return (f"{record.id}  {state}{decided}  {record.tool}  token {record.token_id}  ({record.reason})  "
            f"expires {iso(record.expires_at)}  args {record.arguments[:120]}")


async def show(store: ApprovalStore, *, as_json: bool = False, everything: bool = False,
               now: float | None = None) -> ExitCode:
    """Print the held calls (pending ones; ``everything``: those kept after their decision or expiry too)."""
    stamp = time.time() if now is None else now
    try:
        records = await store.listing(stamp)
    finally:
        await store.close()
    shown = [r for r in records if everything or r.view(stamp)["state"] == "pending"]
    for record in shown:
        print(json.dumps(record.view(stamp), sort_keys=True) if as_json else held_line(record, stamp))
    if not shown and not as_json:
        print("no held calls" + ("" if everything else " pending (--all shows decided ones)"), file=sys.stderr)
    return ExitCode.OK


async def decide(store: ApprovalStore, approval_id: str, *, approve: bool, by: str, note: str | None = None,
                 now: float | None = None, events_file: Path | None = None) -> ExitCode:
    """Approve or deny one held call; FAILED (saying what happened first) when it was not pending. The decision is
    published (``approval_decided``) on stderr, and in the daemon's events file when it names one."""
    try:
        result = await store.decide(approval_id, approve, by, note, time.time() if now is None else now)
    finally:
        await store.close()
    if result.outcome != "decided" or result.record is None:
        return _fail(decision_text(approval_id, result), ExitCode.FAILED)
    record = result.record
    print(f"{'approved' if approve else 'denied'} {record.id}: {record.tool} for token {record.token_id}"
          + (" (the identical call runs once)" if approve else ""))
    fields = {"approval_id": record.id, "decision": record.state, "by": record.decided_by, "tool": record.tool,
              "token_id": record.token_id}
    print(json.dumps({"event": events.APPROVAL_DECIDED, **fields}), file=sys.stderr)
    if events_file is not None:
        try:
            sink = events.JsonlFilePublisher(events_file)
            sink.publish(events.APPROVAL_DECIDED, **fields)
            sink.close()
        except OSError as exc:  # the decision is taken; only its event is missing
            print(f"{PROG}: the decision is taken, but {events_file} could not be written: {exc}", file=sys.stderr)
    return ExitCode.OK

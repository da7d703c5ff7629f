"""``satgate-mcp``: run the daemon, mint, inspect and revoke tokens, and test policy files (policy_cli.py).

``serve`` validates every setting at once and refuses to start with one line per problem.
The ``token`` commands read only the variables they use (root key, revocation file, Redis URL),
so an unrelated bad variable never blocks an operator from revoking a leaked token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import structlog
from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from satgate_mcp import __version__, audit_cli, cli_approvals, cli_controls, cli_credentials, cli_tools, policy_cli
from satgate_mcp.auth.base import TokenError
from satgate_mcp.auth.macaroons import add_caveats, inspect_token, mint_token, verify_token
from satgate_mcp.auth.revocation import check_token_id, revocation_folder_problem, warn_missing_revocation_folder
from satgate_mcp.config_problems import format_errors, load_checked, variable_names
from satgate_mcp.config_problems import format_settings_error as format_settings_error  # its old home
from satgate_mcp.errors import ConfigError, StartFailed
from satgate_mcp.exits import ExitCode
from satgate_mcp.settings import (
    ENV_PREFIX,
    MIN_ROOT_KEY_LENGTH,
    Settings,
    StdioUpstreamSpec,
    unknown_variables,
)
from satgate_mcp.stores import cli_grants, cli_revocations, no_cli_revocations_reason
from satgate_mcp.upstream.wire import child_env, command_problem

PROG = "satgate-mcp"


class TokenSettings(BaseSettings):
    """The three settings the token commands need, read from the same places as ``Settings``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_file_encoding="utf-8")

    root_key: SecretStr | None = None
    revocation_file: Path | None = None
    redis_url: str | None = None
    redis_timeout: float = 0.5
    state_dir: str | None = None

    @field_validator("root_key", "revocation_file", "redis_url", "state_dir", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


def _fail(message: str, code: ExitCode = ExitCode.CONFIG) -> ExitCode:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def _number(text: str, *, expected: str, rule: str, ok: Callable[[float], bool]) -> float:
    """A finite number the flag's rule accepts, or the argparse error that names what was wrong."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    return _number(text, expected="a number of seconds", rule="a positive number", ok=lambda v: v > 0)


def _non_negative_float(text: str) -> float:
    return _number(text, expected="a number", rule="a number >= 0", ok=lambda v: v >= 0)


def split_patterns(text: str) -> list[str]:
    """``"a, b,db_*"`` -> ``["a", "b", "db_*"]``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="MCP gateway daemon and its token tools.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, metavar="PATH",
                       help="env-style file of SATGATE_* settings (the environment wins)")
    serve.add_argument("--handover", action="store_true",
                       help="take over a port another satgate-mcp already listens on (SO_REUSEPORT "
                            "handover; same as SATGATE_HANDOVER=true); without it such a start is refused")
    serve.add_argument("--host", metavar="ADDRESS",
                       help="address to listen on (wins over SATGATE_HOST and the config file)")
    serve.add_argument("--port", metavar="PORT",
                       help="port to listen on, 0 to 65535 (wins over SATGATE_PORT and the config file)")

    token = commands.add_parser("token", help="mint, inspect or revoke bearer tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    config_help = "env-style file to read SATGATE_ROOT_KEY / SATGATE_REVOCATION_FILE from"

    mint = token_commands.add_parser("mint", help="print a new token signed with SATGATE_ROOT_KEY")
    mint.add_argument("--id", required=True, dest="token_id", metavar="ID", help="token id (what `token revoke` names)")
    mint.add_argument("--ttl", type=_positive_float, metavar="SECONDS", help="lifetime; no expiry if omitted")
    mint.add_argument("--tools", metavar="PATTERNS", help="comma list of tool names and prefix* patterns")
    mint.add_argument("--resources", metavar="PATTERNS",
                      help="comma list of resource URIs and prefix* patterns (default: every resource)")
    mint.add_argument("--prompts", metavar="PATTERNS",
                      help="comma list of prompt names and prefix* patterns (default: every prompt)")
    mint.add_argument("--budget-id", help="budget to spend from (default: the token id)")
    mint.add_argument("--budget-limit", type=_non_negative_float, metavar="N", help="credits the budget starts with")
    mint.add_argument("--tenant", help="tenant recorded in the token")
    mint.add_argument("--admin", action="store_true", help="may also open the operator console (/console)")
    mint.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    cli_controls.add_argument(mint)

    narrow = token_commands.add_parser(
        "narrow", help="print TOKEN with extra restrictions (no root key needed; can never widen it)")
    narrow.add_argument("token", metavar="TOKEN", help="the token, or - to read it from stdin")
    narrow.add_argument("--ttl", type=_positive_float, metavar="SECONDS", help="expire this many seconds from now")
    narrow.add_argument("--tools", metavar="PATTERNS", help="comma list; intersected with what TOKEN allows")
    narrow.add_argument("--resources", metavar="PATTERNS", help="comma list of URIs and prefix*; intersected")
    narrow.add_argument("--prompts", metavar="PATTERNS", help="comma list of prompt names and prefix*; intersected")
    narrow.add_argument("--budget-limit", type=_non_negative_float, metavar="N", help="lower the budget limit")
    cli_controls.add_argument(narrow)

    insp = token_commands.add_parser("inspect", help="print a token's identity and caveats as JSON")
    insp.add_argument("token", metavar="TOKEN", help="the token, or - to read it from stdin")
    insp.add_argument("--config", type=Path, metavar="PATH", help=config_help)

    revoke = token_commands.add_parser("revoke", help="revoke every token with this id (and its delegates)")
    revoke.add_argument("token_id", metavar="ID")
    revoke.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    policy_cli.add_parser(commands)
    cli_tools.add_parser(commands)
    cli_approvals.add_parser(commands)
    cli_credentials.add_parser(commands)
    audit_cli.add_parser(commands)
    return parser


def _missing_config(path: Path | None) -> str | None:
    if path is not None and not path.is_file():
        return f"config file not found: {path}"
    return None


def _token_settings(config: Path | None) -> TokenSettings:
    if config is not None:
        return TokenSettings(_env_file=config)  # type: ignore[call-arg]
    return TokenSettings()


def _warn_unknown_variables(config: Path | None) -> None:
    """One warning at start naming every ``SATGATE_*`` variable (environment or config file) nothing reads."""
    if unknown := unknown_variables(variable_names(os.environ, config)):
        structlog.get_logger("satgate_mcp.cli").warning(
            "unknown_variables", names=sorted(unknown), did_you_mean={k: v for k, v in unknown.items() if v},
            hint="these SATGATE_* variables are ignored; docs/configuration.md lists every setting")


def _stdio_command_problem(settings: Settings) -> str | None:
    for name, spec in settings.upstreams.items():
        if isinstance(spec, StdioUpstreamSpec):
            env = child_env(os.environ, spec.env)
            if problem := command_problem(name, spec.command[0], spec.cwd, env):
                return problem
    return None


#: ``serve`` flags that set a setting, and win over the environment and the config file.
SERVE_FLAGS = {"host": "--host", "port": "--port", "handover": "--handover"}


def serve_overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the flags give (validated with the rest, so a bad ``--port`` reads like a bad
    ``SATGATE_PORT``), and which flag set each: a problem names the flag, not the variable it beat."""
    given = {field: getattr(args, field) for field in SERVE_FLAGS}
    overrides = {field: value for field, value in given.items() if value is not None and value is not False}
    return overrides, {field: SERVE_FLAGS[field] for field in overrides}


def cmd_serve(args: argparse.Namespace) -> ExitCode:
    if problem := _missing_config(args.config):
        return _fail(problem)
    settings = load_checked(args.config, *serve_overrides(args))
    if isinstance(settings, list):  # one line per problem, each ``satgate-mcp: ...`` like every start-up failure
        for line in settings:
            _fail(line)
        return ExitCode.CONFIG
    if problem := _stdio_command_problem(settings):
        return _fail(problem)
    from satgate_mcp.daemon.runner import serve  # heavy (the aiohttp app): imported only to serve
    from satgate_mcp.logs import configure_logging

    configure_logging(settings)
    _warn_unknown_variables(args.config)
    warn_missing_revocation_folder(settings.revocation_file)
    try:
        return serve(settings)
    except ConfigError as exc:
        # Every start-up failure has the same shape: one JSON event in the log, one line on stderr.
        structlog.get_logger("satgate_mcp.cli").error("config_error", error=str(exc))
        return _fail(str(exc))
    except StartFailed as exc:
        return _fail(str(exc), ExitCode.FAILED)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _root_key(settings: TokenSettings) -> str | None:
    return settings.root_key.get_secret_value() if settings.root_key is not None else None


class Scopes(NamedTuple):
    """What ``--tools``/``--resources``/``--prompts`` ask for; None where the flag was not given."""

    tools: list[str] | None
    resources: list[str] | None
    prompts: list[str] | None


def scope_patterns(args: argparse.Namespace) -> Scopes | str:
    """The scope flags as pattern lists, or what is wrong with them."""
    lists = [None if getattr(args, name) is None else split_patterns(getattr(args, name)) for name in Scopes._fields]
    for name, patterns in zip(Scopes._fields, lists, strict=True):
        if patterns == []:
            return f"--{name} needs at least one name or pattern"
    return Scopes(*lists)


def cmd_mint(args: argparse.Namespace, settings: TokenSettings) -> ExitCode:
    key = _root_key(settings)
    if not key:
        return _fail(f"SATGATE_ROOT_KEY is not set; token mint needs it (at least {MIN_ROOT_KEY_LENGTH} characters)")
    if len(key) < MIN_ROOT_KEY_LENGTH:
        return _fail(f"SATGATE_ROOT_KEY is too short: it must be at least {MIN_ROOT_KEY_LENGTH} characters")
    scopes = scope_patterns(args)
    if isinstance(scopes, str):
        return _fail(scopes)
    try:
        token = mint_token(
            key, args.token_id, ttl=args.ttl, budget_id=args.budget_id,
            budget_limit=args.budget_limit, tenant=args.tenant,
            tools=scopes.tools, resources=scopes.resources, prompts=scopes.prompts, admin=args.admin,
            controls=cli_controls.read_controls(args.controls),
        )
    except ValueError as exc:
        return _fail(str(exc))
    print(token)
    return ExitCode.OK


def _read_token(arg: str) -> str:
    return sys.stdin.read().strip() if arg == "-" else arg.strip()


def cmd_narrow(args: argparse.Namespace) -> ExitCode:
    scopes = scope_patterns(args)
    if isinstance(scopes, str):
        return _fail(scopes)
    if args.ttl is None and args.budget_limit is None and args.controls is None and all(v is None for v in scopes):
        return _fail("nothing to narrow: give --ttl, --tools, --resources, --prompts, --budget-limit and/or --controls")
    try:
        narrowed = add_caveats(_read_token(args.token), ttl=args.ttl, budget_limit=args.budget_limit,
                               tools=scopes.tools, resources=scopes.resources, prompts=scopes.prompts,
                               controls=cli_controls.read_controls(args.controls))
    except TokenError as exc:
        return _fail(f"not a satgate token: {exc.reason}", ExitCode.FAILED)
    except ValueError as exc:
        return _fail(str(exc))
    print(narrowed)
    return ExitCode.OK


async def _revoked_in_store(settings: TokenSettings, ids: Sequence[str]) -> bool:
    store = cli_revocations(settings)
    assert store is not None
    try:
        for token_id in ids:
            if await store.is_revoked(token_id):
                return True
        return False
    finally:
        await store.aclose()


def cmd_inspect(args: argparse.Namespace, settings: TokenSettings) -> ExitCode:
    token = _read_token(args.token)
    now = time.time()
    try:
        info = inspect_token(token, now=now)
    except TokenError as exc:
        return _fail(f"not a satgate token: {exc.reason}", ExitCode.FAILED)
    key = _root_key(settings)
    info["verified"], info["reason"] = None, "SATGATE_ROOT_KEY not set"
    if key:
        try:
            verify_token(key, token, now=now)
            info["verified"], info["reason"] = True, ""
        except TokenError as exc:
            info["verified"], info["reason"] = False, exc.reason
            if exc.hint:  # a root key mismatch: say what to check
                info["hint"] = exc.hint
    info["revoked"] = None
    if not no_cli_revocations_reason(settings):
        try:
            info["revoked"] = asyncio.run(_revoked_in_store(settings, [info["token_id"], *info["ancestors"]]))
        except Exception as exc:  # a down store must not hide the rest of the answer
            info["revocation_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(info, indent=2))
    return ExitCode.FAILED if info["verified"] is False or info["revoked"] else ExitCode.OK


async def _revoke(settings: TokenSettings, token_id: str) -> int:
    """Revoke ``token_id``, and forget the upstream grants its users gave (where the daemons keep them); how many."""
    store = cli_revocations(settings)  # the file and/or Redis, else the state folder's database
    assert store is not None
    try:
        await store.revoke(token_id)
    finally:
        await store.aclose()
    grants = cli_grants(settings)
    if isinstance(grants, str):  # kept in each daemon's memory: unreachable, and the token is refused anyway
        return 0
    try:
        return await grants.revoke(token_id)
    finally:
        await grants.close()


def cmd_revoke(args: argparse.Namespace, settings: TokenSettings) -> ExitCode:
    try:
        token_id = check_token_id(args.token_id)
    except ValueError as exc:
        return _fail(str(exc))
    if problem := no_cli_revocations_reason(settings) or revocation_folder_problem(settings.revocation_file):
        return _fail(problem)
    try:
        dropped = asyncio.run(_revoke(settings, token_id))
    except Exception as exc:  # OSError, a Redis error: say what, no traceback
        return _fail(f"could not revoke {token_id}: {type(exc).__name__}: {exc}", ExitCode.FAILED)
    print(f"revoked {token_id}" + (f" and forgot its {dropped} upstream grant(s)" if dropped else ""))
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "policy":
        return policy_cli.run(args)
    if args.command == "tools":
        return cli_tools.main(args)
    if args.command == "approvals":
        return cli_approvals.main(args)
    if args.command == "credentials":
        return cli_credentials.main(args)
    if args.command == "audit":
        return audit_cli.run(args)
    if args.token_command == "narrow":  # the holder's command: reads no settings at all
        return cmd_narrow(args)
    if problem := _missing_config(args.config):
        return _fail(problem)
    try:
        settings = _token_settings(args.config)
    except ValidationError as exc:
        print(format_errors(exc), file=sys.stderr)
        return ExitCode.CONFIG
    handlers = {"mint": cmd_mint, "inspect": cmd_inspect, "revoke": cmd_revoke}
    return handlers[args.token_command](args, settings)

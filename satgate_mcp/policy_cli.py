"""``satgate-mcp policy check FILE`` and ``satgate-mcp policy explain FILE --token T --tool NAME --args JSON``.

So an operator can test a policy before deploying it: ``check`` compiles the file as ``serve`` would and lists
every problem (exit 2) or none (exit 0); ``explain`` verifies a token the way the daemon would with the
configured settings (the auth mode, the root key or the OAuth issuer) and walks the rules for one call
(exit 0: allowed, 1: denied, 2: a bad file, token setting or argument). cli.py only dispatches here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from satgate_mcp.auth.base import Identity
from satgate_mcp.config_problems import load_checked
from satgate_mcp.errors import ConfigError
from satgate_mcp.exits import ExitCode
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.decide import token_variables, tool_variables
from satgate_mcp.policy.explain import explain, report
from satgate_mcp.policy.rules import METHODS, Effect, PolicyInvalid, load_rules
from satgate_mcp.settings import Settings

PROG = "satgate-mcp"


def add_parser(commands: Any) -> None:
    """The ``policy`` command group, under the top-level parser's subcommands."""
    policy = commands.add_parser("policy", help="check a policy file, or explain its decision on one call")
    actions = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="compile FILE as serve would; exit 0, or 2 listing every problem")
    check.add_argument("file", type=Path, metavar="FILE")
    why = actions.add_parser("explain", help="which rule of FILE decides one call, and why")
    why.add_argument("file", type=Path, metavar="FILE")
    why.add_argument("--token", required=True, metavar="TOKEN", help="the caller's bearer token, or - for stdin")
    why.add_argument("--tool", required=True, metavar="NAME", help="the tool (or prompt name, or resource URI)")
    why.add_argument("--args", default="{}", metavar="JSON", help="the call's arguments, a JSON object")
    why.add_argument("--method", default="tools/call", choices=sorted(METHODS))
    why.add_argument("--annotations", default="{}", metavar="JSON", help="the tool's annotations, a JSON object")
    why.add_argument("--upstream", default="", metavar="NAME", help="the upstream serving the tool")
    why.add_argument("--config", type=Path, metavar="PATH", help="env-style file of SATGATE_* settings")


def _fail(message: str, code: ExitCode = ExitCode.CONFIG) -> ExitCode:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def cmd_check(path: Path, default: Effect = Effect.ALLOW) -> ExitCode:
    try:
        rules = load_rules(path, default)
    except PolicyInvalid as exc:
        for problem in exc.problems:
            _fail(str(problem))
        return ExitCode.CONFIG
    print(f"{path}: {len(rules.rules)} rule{'s' if len(rules.rules) != 1 else ''}, ok")
    return ExitCode.OK


def _json_object(text: str, flag: str) -> JsonObj | str:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"{flag} must be a JSON object: {exc}"
    return value if isinstance(value, dict) else f"{flag} must be a JSON object"


async def verified_identity(settings: Settings, token: str) -> Identity | str:
    """The token's identity as the daemon would verify it with these settings, or why it is refused."""
    from satgate_mcp.auth.factory import authenticator_from_settings  # only explain needs the auth stack

    authenticator = authenticator_from_settings(settings)
    try:
        result = await authenticator.authenticate(f"Bearer {token}")
    finally:
        await authenticator.aclose()
    if not result.ok or result.identity is None:
        return f"the token is refused ({result.outcome.value}): {result.reason}"
    return result.identity


def _variables(args: argparse.Namespace, identity: Identity, arguments: JsonObj, annotations: JsonObj) -> JsonObj:
    return {"token": token_variables(identity),
            "tool": tool_variables(args.tool, args.upstream, {"annotations": annotations}),
            "args": arguments,
            "session": {"id": "", "protocol": "", "client": {"name": "", "version": ""}},
            "request": {"method": args.method, "remote_addr": ""},
            "now": datetime.now(UTC)}


def cmd_explain(args: argparse.Namespace) -> ExitCode:
    if args.config is not None and not args.config.is_file():
        return _fail(f"config file not found: {args.config}")
    settings = load_checked(args.config, {})
    if isinstance(settings, list):
        for line in settings:
            _fail(line)
        return ExitCode.CONFIG
    arguments, annotations = _json_object(args.args, "--args"), _json_object(args.annotations, "--annotations")
    if isinstance(arguments, str):
        return _fail(arguments)
    if isinstance(annotations, str):
        return _fail(annotations)
    try:
        rules = load_rules(args.file, Effect(settings.policy_default))
        token = sys.stdin.read().strip() if args.token == "-" else args.token.strip()
        identity = asyncio.run(verified_identity(settings, token))
    except PolicyInvalid as exc:
        return _fail(str(exc.problems[0]))
    except ConfigError as exc:
        return _fail(str(exc))
    if isinstance(identity, str):
        return _fail(identity, ExitCode.FAILED)
    verdicts, decision = explain(rules, args.method, args.tool, _variables(args, identity, arguments, annotations))
    print("\n".join(report(verdicts, decision)))
    return ExitCode.FAILED if decision.denied else ExitCode.OK


def run(args: argparse.Namespace) -> ExitCode:
    if args.policy_command == "check":
        return cmd_check(args.file)
    return cmd_explain(args)

"""``satgate-mcp credentials list|revoke|authorize``: users' grants to ``"oauth_user"`` upstreams.

The commands read the store the daemons use (``SATGATE_REDIS_URL``, else the state folder's database a daemon made),
like ``approvals``. ``list`` shows whose grant is kept for which upstream, when it was given and last refreshed,
never the sealed token itself. ``revoke SUBJECT [UPSTREAM]`` forgets the subject's grant for one upstream, or all of
its grants: every daemon reads the store on each call, so the next call asks the user to authorize again. (The
authorization server may still honour the refresh token until it is revoked there too.) ``authorize`` starts a
grant from the command line (cli_authorize.py): how an upstream's ``catalogue_subject`` gets the grant its listings use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from satgate_mcp.cli_authorize import authorize_main
from satgate_mcp.cli_tools import PinSettings, open_store
from satgate_mcp.exits import ExitCode
from satgate_mcp.oauth_grants import GrantStore, StoredGrant
from satgate_mcp.stores import cli_grants

PROG = "satgate-mcp"


def add_parser(commands: Any) -> None:
    """The ``credentials`` command group, under the CLI's subcommands."""
    credentials = commands.add_parser("credentials", help="list and revoke users' grants to oauth_user upstreams")
    actions = credentials.add_subparsers(dest="credentials_command", required=True, metavar="ACTION")
    config_help = "env-style file to read SATGATE_STATE_DIR / SATGATE_REDIS_URL from"
    listed = actions.add_parser("list", help="kept grants: subject, upstream, scope, given, last refreshed")
    listed.add_argument("--json", action="store_true", help="one JSON object per grant, one per line")
    listed.add_argument("--subject", metavar="SUBJECT", help="only this subject's (token id or OAuth subject)")
    listed.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    revoke = actions.add_parser("revoke", help="forget a subject's grant for one upstream, or all of its grants")
    revoke.add_argument("subject", metavar="SUBJECT", help="the token id (header mode) or OAuth subject")
    revoke.add_argument("upstream", metavar="UPSTREAM", nargs="?", help="only this upstream's grant")
    revoke.add_argument("--config", type=Path, metavar="PATH", help=config_help)
    authorize = actions.add_parser("authorize", help="print the URL that gives an oauth_user upstream a subject's "
                                                     "grant (its catalogue_subject's, by default)")
    authorize.add_argument("upstream", metavar="UPSTREAM", help="the oauth_user upstream's name")
    authorize.add_argument("--subject", metavar="SUBJECT", help="whose grant (default: the upstream's "
                                                                "catalogue_subject)")
    authorize.add_argument("--config", type=Path, metavar="PATH", help="env-style file to read the settings from")


def _fail(message: str, code: ExitCode = ExitCode.CONFIG) -> ExitCode:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def main(args: argparse.Namespace) -> ExitCode:
    """Run ``credentials list``, ``revoke`` or ``authorize``."""
    if args.credentials_command == "authorize":
        return authorize_main(args)
    opened = open_store(args, PinSettings, cli_grants)
    if isinstance(opened, ExitCode):
        return opened
    _, store = opened
    run = (show(store, as_json=args.json, subject=args.subject) if args.credentials_command == "list"
           else revoke(store, args.subject, args.upstream))
    try:
        return asyncio.run(run)
    except Exception as exc:  # a store that does not answer: say what, no traceback
        return _fail(f"the credential store did not answer: {type(exc).__name__}: {exc}", ExitCode.FAILED)


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def grant_line(grant: StoredGrant) -> str:
    """One line of ``credentials list``."""
    return (f"{grant.owner}  {grant.upstream}  scope {grant.scope or '-'}  given {_when(grant.created_at)}  "
            f"refreshed {_when(grant.refreshed_at)}")


async def show(store: GrantStore, *, as_json: bool = False, subject: str | None = None) -> ExitCode:
    try:
        grants = await store.listing(subject)
    finally:
        await store.close()
    for grant in grants:
        print(json.dumps(grant.view(), sort_keys=True) if as_json else grant_line(grant))
    if not grants and not as_json:
        print("no upstream grants kept" + (f" for {subject}" if subject else ""), file=sys.stderr)
    return ExitCode.OK


async def revoke(store: GrantStore, subject: str, upstream: str | None) -> ExitCode:
    """Forget the grant(s); FAILED when there was none, so a typo does not pass for a revocation."""
    try:
        count = await store.revoke(subject, upstream)
    finally:
        await store.close()
    where = f"for upstream {upstream!r}" if upstream else "for any upstream"
    if count == 0:
        return _fail(f"{subject!r} has no grant {where}", ExitCode.FAILED)
    print(f"revoked {count} grant{'s' if count != 1 else ''} of {subject} {where}: the next call asks again")
    return ExitCode.OK

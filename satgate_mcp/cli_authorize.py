"""``satgate-mcp credentials authorize UPSTREAM [--subject S]``: a grant started from the command line.

An ``oauth_user`` upstream whose authorization server has no client credentials grant (a code host's has none)
lists its tools with the grant of its ``catalogue_subject``. Nobody can call a tool the gateway cannot list, so that
grant cannot start with a call: the operator prints the authorization URL here and opens it as that subject. The
authorization waits in the store the daemons read (Redis or the state folder), so the daemon's
``/oauth/callback/<upstream>`` completes it, as for a URL a client was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import aiohttp
import structlog

from satgate_mcp.cli_tools import open_store
from satgate_mcp.exits import ExitCode
from satgate_mcp.oauth_grants import STATE_TTL_SECONDS, GrantStore
from satgate_mcp.settings import HttpUpstreamSpec, Settings
from satgate_mcp.stores import cli_grants
from satgate_mcp.upstream.credential_box import CredentialBox
from satgate_mcp.upstream.token_client import TokenClient
from satgate_mcp.upstream.user_grants import UserGrants, catalogue_credential
from satgate_mcp.upstream_auth_spec import OAuthUserSpec

PROG = "satgate-mcp"


def _fail(message: str, code: ExitCode = ExitCode.CONFIG) -> ExitCode:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def authorization_problem(settings: Settings, upstream: str, subject: str | None) -> str | None:
    """Why no authorization can be started for ``upstream`` as ``subject`` with these settings; None when one can."""
    spec = settings.upstreams.get(upstream)
    if not isinstance(spec, HttpUpstreamSpec) or not isinstance(spec.auth, OAuthUserSpec):
        return f'upstream {upstream!r} is not an HTTP upstream with "auth": {{"type": "oauth_user"}}'
    if subject is None and spec.auth.catalogue_subject is None:
        return f'upstream {upstream!r} has no "catalogue_subject": say whose grant with --subject'
    if settings.public_base(settings.auth_mode, settings.oauth_audience) is None:
        return "the gateway's public URL is unknown (set SATGATE_PUBLIC_URL): the browser is sent back there"
    return None


def authorize_main(args: argparse.Namespace) -> ExitCode:
    """Print the URL on stdout (alone: a script can take it), everything else on stderr."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    opened = open_store(args, Settings, cli_grants)
    if isinstance(opened, ExitCode):
        return opened
    settings, store = opened
    try:
        return asyncio.run(_begin(settings, store, args.upstream, args.subject))
    except Exception as exc:  # the store or the authorization server did not answer: say what, no traceback
        return _fail(f"could not start the authorization: {type(exc).__name__}: {exc}", ExitCode.FAILED)


async def _begin(settings: Settings, store: GrantStore, name: str, subject: str | None) -> ExitCode:
    try:
        problem = authorization_problem(settings, name, subject)
        if problem is not None:
            return _fail(problem)
        spec = settings.upstreams[name]
        assert isinstance(spec, HttpUpstreamSpec)
        assert isinstance(spec.auth, OAuthUserSpec)
        owner = subject or spec.auth.catalogue_subject
        base = settings.public_base(settings.auth_mode, settings.oauth_audience)
        assert owner is not None
        assert base is not None
        async with aiohttp.ClientSession() as http:
            client = TokenClient(name, spec.auth, timeout=spec.timeout, session=lambda: http)
            grants = UserGrants(name, spec.auth, spec.url, client, store,
                                CredentialBox(tuple(settings.credential_key_list)), timeout=spec.timeout,
                                session=lambda: http)
            started = await grants.begin(catalogue_credential(owner), base)
    finally:
        await store.close()
    print(started.url)
    print(f"open this URL within {int(STATE_TTL_SECONDS // 60)} minutes, signed in as the account {owner!r} "
          f"stands for; a running gateway completes it at {base.rstrip('/')}/oauth/callback/{name}", file=sys.stderr)
    return ExitCode.OK

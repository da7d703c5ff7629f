"""An ``oauth_user`` upstream whose authorization server has no client credentials grant (a code host's has none):
its tools are listed with the grant of its ``catalogue_subject``, which the operator gives once with
``satgate-mcp credentials authorize`` (a real command process, on the daemon's state folder) and a browser.

Until then the upstream is down and says what to run; afterwards its tools are listed, and that grant serves
listings only: a caller's own call still needs the caller's own grant.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.keys import POOL, STORES
from satgate_mcp.upstream.pool import UpstreamPool
from tests.integration.test_upstream_identity import IdentityUpstream
from tests.integration.test_upstream_user_grants import (
    CREDENTIAL_KEY,
    ROOT_KEY,
    Gateway,
    StartGateway,
    browse,
    idp,
    start,
    upstream,
    user_spec,
)
from tests.oauth_server import AuthServer

pytestmark = pytest.mark.process
__all__ = ["idp", "start", "upstream"]

BOT = "catalogue-bot"
READY_TIMEOUT = 20.0


def authorize_command(state_dir: Path, upstreams: str, public_url: str, *extra: str
                      ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATGATE_")} | {
        "SATGATE_AUTH_MODE": "header", "SATGATE_ROOT_KEY": ROOT_KEY, "SATGATE_CREDENTIAL_KEY": CREDENTIAL_KEY,
        "SATGATE_STATE_DIR": str(state_dir), "SATGATE_UPSTREAMS": upstreams, "SATGATE_PUBLIC_URL": public_url}
    return subprocess.run([sys.executable, "-m", "satgate_mcp", "credentials", "authorize", *extra], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


async def tool_names(gw: Gateway, token: str, session: str) -> set[str]:
    status, body = await gw.post(token, jsonrpc.request_message(2, "tools/list", {}), session)
    assert status == 200, body
    return {tool["name"] for tool in body["result"]["tools"]}


async def test_the_catalogue_subjects_grant_lists_the_tools_and_serves_no_callers_call(
        start: StartGateway, idp: AuthServer, upstream: IdentityUpstream, tmp_path: Path) -> None:
    idp.tokens.unsupported = {"client_credentials"}
    upstreams = json.dumps({"files": {"transport": "http", "url": upstream.url, "timeout": 5,
                                      "auth": user_spec(catalogue_subject=BOT)}})
    gw = await start(state_dir=str(tmp_path), upstreams=upstreams)
    pool = gw.http.app[POOL]
    assert isinstance(pool, UpstreamPool)
    files = pool.isolated("files")
    assert files is not None
    assert not await files.wait_settled(READY_TIMEOUT)
    assert "satgate-mcp credentials authorize files" in pool.failures()["files"]["status"]
    alice = mint_token(ROOT_KEY, "alice")
    session = await gw.session(alice)
    assert "whoami" not in await tool_names(gw, alice, session)

    public_url = str(gw.http.make_url("/"))
    unnamed = json.dumps({"files": {"transport": "http", "url": upstream.url, "auth": user_spec()}})
    refused = await asyncio.to_thread(authorize_command, tmp_path, unnamed, public_url, "files")
    assert refused.returncode == 2
    assert "--subject" in refused.stderr  # no catalogue_subject there: whose grant must be said
    done = await asyncio.to_thread(authorize_command, tmp_path, upstreams, public_url, "files")
    assert done.returncode == 0, done.stderr
    idp.authorizations.user = "bot@files"
    status, _ = await browse(done.stdout.strip())
    assert status == 200

    assert await files.wait_ready(READY_TIMEOUT)  # the next handshake uses the bot's grant
    async with asyncio.timeout(READY_TIMEOUT):
        while "whoami" not in await tool_names(gw, alice, session):  # listed once the lists are fetched again
            pass
    refusal = await gw.call(alice, session)
    assert refusal["error"]["code"] == -32042  # the bot's grant lists tools; Alice's call needs her own
    assert [g.owner for g in await gw.http.app[STORES].grants.listing()] == [BOT]

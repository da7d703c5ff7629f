"""Each user authorizes once, against a real ``satgate-mcp serve`` process: the grant is kept in the state folder's
database (it outlives a SIGKILL and a restart), ``credentials list`` shows it, and ``token revoke`` forgets it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from satgate_mcp.auth.macaroons import mint_token
from tests.gateway_process import GatewayProcess
from tests.integration.test_upstream_identity import IdentityUpstream
from tests.integration.test_upstream_user_grants import idp, upstream, user_spec
from tests.integration.test_user_grants_sdk import Browser, session, text_of
from tests.oauth_server import AuthServer

pytestmark = pytest.mark.process
__all__ = ["idp", "upstream"]

ROOT_KEY = "serve-user-grants-root-key-0123456789abcdef"


async def test_a_grant_outlives_a_restart_is_listed_and_token_revoke_forgets_it(
        tmp_path: Path, idp: AuthServer, upstream: IdentityUpstream) -> None:
    state = tmp_path / "state"
    upstreams = {"files": {"transport": "http", "url": upstream.url, "timeout": 5, "auth": user_spec()}}
    gw = GatewayProcess(tmp_path, root_key=ROOT_KEY, settings={
        "SATGATE_UPSTREAMS": json.dumps(upstreams), "SATGATE_STATE_DIR": str(state),
        "SATGATE_CREDENTIAL_KEY": "ab" * 32})
    gw.cli_env["SATGATE_STATE_DIR"] = str(state)
    browser = Browser()
    alice, bob = mint_token(ROOT_KEY, "alice"), mint_token(ROOT_KEY, "bob")
    try:
        gw.start()
        await gw.wait_ready()
        async with asyncio.timeout(60):
            for token, user in ((alice, "alice@files"), (bob, "bob@files")):
                idp.authorizations.user = user
                async with session(gw.url, token, browser) as client:
                    assert text_of(await client.call_tool("whoami", {})) == user
            await gw.kill()
            gw.start()
            await gw.wait_ready()
            async with session(gw.url, bob, browser) as client:  # after a SIGKILL and a restart: not asked again
                assert text_of(await client.call_tool("whoami", {})) == "bob@files"
            assert browser.pages == [200, 200]
            listed = (await gw.cli("credentials", "list")).splitlines()
            assert [line.split()[:2] for line in listed] == [["alice", "files"], ["bob", "files"]]
            assert "forgot its 1 upstream grant(s)" in await gw.cli("token", "revoke", "alice")
            assert [line.split()[:2] for line in (await gw.cli("credentials", "list")).splitlines()] == [
                ["bob", "files"]]
    finally:
        await gw.kill()

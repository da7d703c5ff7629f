"""Each user authorizes once, through the official SDK's clients (issue 28, section 3).

A 2025-11-25 ``ClientSession`` declares URL elicitation (the SDK does with an elicitation callback): its first call to
an ``oauth_user`` upstream asks the callback to open a URL; the callback is the user's browser (an HTTP client that
follows the authorization server's redirect to the gateway's callback), and the very same call then succeeds, as
do the next ones without asking again. A 2026-07-28 ``mcp.Client`` gets the question as an ``input_required`` round
and answers it the same way. The parts are the real ones of test_upstream_user_grants.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
from mcp import types
from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from satgate_mcp.auth.macaroons import mint_token
from tests.integration.test_upstream_identity import UPSTREAM_AUDIENCE, IdentityUpstream
from tests.integration.test_upstream_user_grants import ROOT_KEY, StartGateway, idp, start, upstream, user_spec
from tests.oauth_server import AuthServer

pytestmark = pytest.mark.process
__all__ = ["idp", "start", "upstream"]  # the fixtures, shared with the raw HTTP tests

TIMEOUT = 20.0


class Browser:
    """The user: each URL elicitation is opened (redirects followed to the gateway's page) and then accepted."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.pages: list[int] = []

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams)
        self.opened.append(params.url)
        async with httpx2.AsyncClient(follow_redirects=True, trust_env=False) as browser:
            page = await browser.get(params.url)
        self.pages.append(page.status_code)
        return types.ElicitResult(action="accept")


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


@contextlib.asynccontextmanager
async def session(url: str, token: str, browser: Browser) -> AsyncIterator[ClientSession]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(TIMEOUT))
    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=TIMEOUT,
                              elicitation_callback=browser.elicit) as client):
        await asyncio.wait_for(client.initialize(), TIMEOUT)
        yield client


async def test_the_sdk_client_opens_the_url_and_the_same_call_succeeds(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    url = str(gw.http.make_url("")).rstrip("/")
    browser = Browser()
    idp.authorizations.user = "alice@files"
    async with session(url, mint_token(ROOT_KEY, "alice"), browser) as client:
        assert text_of(await asyncio.wait_for(client.call_tool("whoami", {}), TIMEOUT)) == "alice@files"
        assert text_of(await asyncio.wait_for(client.call_tool("whoami", {}), TIMEOUT)) == "alice@files"
    assert len(browser.opened) == 1  # asked once; the grant serves every later call
    assert browser.pages == [200]
    assert browser.opened[0].startswith(idp.issuer + "/authorize?")
    idp.authorizations.user = "bob@files"
    async with session(url, mint_token(ROOT_KEY, "bob"), browser) as client:  # bob is asked for his own
        assert text_of(await asyncio.wait_for(client.call_tool("whoami", {}), TIMEOUT)) == "bob@files"
    assert len(browser.opened) == 2


async def test_a_2026_client_gets_the_url_as_an_input_required_round(start: StartGateway, idp: AuthServer) -> None:
    gw = await start()
    url = str(gw.http.make_url("")).rstrip("/")
    browser = Browser()
    idp.authorizations.user = "carol@files"
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {mint_token(ROOT_KEY, 'carol')}"},
                              trust_env=False, timeout=httpx2.Timeout(TIMEOUT))
    async with http, contextlib.AsyncExitStack() as stack:
        client = Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=TIMEOUT,
                        elicitation_callback=browser.elicit, mode="2026-07-28")
        async with asyncio.timeout(TIMEOUT):
            await stack.enter_async_context(client)
            assert text_of(await client.call_tool("whoami", {})) == "carol@files"
    assert browser.pages == [200]


async def test_the_callback_may_land_on_another_gateway_process(start: StartGateway, idp: AuthServer,
                                                                upstream: IdentityUpstream, tmp_path: Path) -> None:
    """Two gateways on one state folder (two processes behind one address): the call waits on the first, the user's
    browser comes back to the second, which finishes the authorization; the first finds the grant and goes on."""
    spec = {"transport": "http", "url": upstream.url, "timeout": 5,
            "auth": user_spec(authorization_server=idp.issuer, resource=UPSTREAM_AUDIENCE)}
    overrides = {"state_dir": str(tmp_path), "upstreams": json.dumps({"files": spec})}
    first, second = await start(**overrides), await start(**overrides)
    second_origin = str(second.http.make_url("")).rstrip("/")

    class ElsewhereBrowser(Browser):
        async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            assert isinstance(params, types.ElicitRequestURLParams)
            async with httpx2.AsyncClient(trust_env=False) as browser:
                back = (await browser.get(params.url)).headers["Location"]  # the server sends the user back
                parts = urlsplit(back)
                page = await browser.get(second_origin + parts.path + "?" + parts.query)  # ... to the other one
            self.pages.append(page.status_code)
            return types.ElicitResult(action="accept")

    browser = ElsewhereBrowser()
    idp.authorizations.user = "dana@files"
    async with session(str(first.http.make_url("")).rstrip("/"), mint_token(ROOT_KEY, "dana"), browser) as client:
        assert text_of(await asyncio.wait_for(client.call_tool("whoami", {}), TIMEOUT)) == "dana@files"
    assert browser.pages == [200]
    assert idp.metadata_fetches[idp.rfc8414_path] >= 1  # the configured issuer's metadata named the endpoints

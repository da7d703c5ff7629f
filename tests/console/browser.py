"""What the browser tests share: a gateway on a real port in front of the real test upstream, SDK agents, and a
headless Chromium from Debian (``/usr/bin/chromium``, driven by Playwright; no browser is downloaded) whose every
request and console message is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp.test_utils import TestServer
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from playwright.async_api import Browser, ConsoleMessage, Page, Request, Response, async_playwright

from satgate_mcp.app import create_app
from satgate_mcp.auth.macaroons import mint_token
from satgate_mcp.settings import Settings
from tests.conftest import upstream_command
from tests.fakes import AwaitablePublisher

KEY = "console-browser-root-key-0123456789-abcdefghij"
ADMIN = mint_token(KEY, "ops-admin", admin=True, ttl=3600)
CHROMIUM = "/usr/bin/chromium"
CALL_TIMEOUT = 15.0
#: The rule the policy view shows (and the refusal an agent meets).
POLICY = {"rules": [{"name": "keep-the-users-table", "tools": ["drop_table"], "when": 'args.table == "users"',
                     "effect": "deny", "reason": "the users table is dropped by a migration, not an agent"}]}
#: Where the browser tests leave each view's screenshot: a scratch folder, so a test run changes no tracked file;
#: ``CONSOLE_SCREENSHOTS=docs/console`` refreshes the README's pictures.
SCREENSHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS") or Path(tempfile.gettempdir()) / "satgate-console-shots")


def chromium_path() -> str:
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if found is None:
        pytest.fail("Debian's chromium is not installed: `apt-get install -y chromium` (scripts/test.sh does it)")
    return found


def gateway_settings(tmp_path: Path, sessions: int = 100) -> Settings:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    values: dict[str, Any] = {
        "auth_mode": "header", "root_key": KEY, "state_dir": str(tmp_path / "state"), "tool_pinning": "enforce",
        "policy_file": policy, "budgets": {"team-acme": 100}, "session_cap": max(sessions, 10_000),
        "sessions_per_token": sessions,
        "upstreams": {"demo": {"transport": "stdio", "command": upstream_command("--governance")}}}
    return Settings(**values)


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, sessions: int = 100) -> AsyncIterator[TestServer]:
    """``sessions``: how many one token may hold (the paging test opens 10,000 directly in the registry)."""
    server = TestServer(create_app(gateway_settings(tmp_path, sessions), publisher=AwaitablePublisher()),
                        host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def agent(url: str, token: str, name: str) -> AsyncIterator[ClientSession]:
    """One SDK client session (2025-11-25 Streamable HTTP) holding ``token``, named ``name`` in its clientInfo."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False,
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    from mcp_types import Implementation

    async with (http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
                ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT,
                              client_info=Implementation(name=name, version="1.0")) as session):
        await asyncio.wait_for(session.initialize(), CALL_TIMEOUT)
        yield session


@dataclass
class Watched:
    """Everything one page asked for and said: requests to another origin and console errors must stay empty."""

    origin: str
    foreign: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    loaded: dict[str, int] = field(default_factory=dict)

    def attach(self, page: Page) -> None:
        page.on("request", self._request)
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("response", self._response)

    def _request(self, request: Request) -> None:
        if not (request.url.startswith(self.origin + "/") or request.url.startswith("data:")):
            self.foreign.append(request.url)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    async def _response(self, response: Response) -> None:
        with contextlib.suppress(Exception):  # a redirect has no body
            self.loaded[response.url] = len(await response.body())


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        # Root in a container has no user namespaces for Chromium's sandbox; the pages are our own.
        browser = await playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


async def log_in(page: Page, url: str, token: str) -> Any:
    await page.goto(f"{url}/console")
    await page.get_by_label("Paste").fill(token)
    async with page.expect_response(f"{url}/console/login") as answer:
        await page.get_by_role("button", name="Log in").click()
    return await answer.value

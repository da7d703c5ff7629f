"""The console in a real browser (headless Chromium from Debian, driven by Playwright), on a gateway in front of
the real test upstream, with data made by real SDK clients: sessions, calls, a policy refusal, a rug pull.

The admin logs in, opens every view (each one's screenshot lands in a scratch folder, or in docs/console/ for the
README with ``CONSOLE_SCREENSHOTS=docs/console``), approves a changed tool definition and revokes an agent, whose
next call is refused; it approves an agent's held call, whose identical repeat then runs once. Anonymous visitors,
ordinary tokens and a cross-site form are refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from playwright.async_api import Browser, Dialog, Page, expect

from satgate_mcp import events
from satgate_mcp.auth.macaroons import mint_token, verify_token
from satgate_mcp.keys import CONSOLE, REGISTRY
from satgate_mcp.policy.controls import parse_controls
from tests.console.browser import ADMIN, KEY, SCREENSHOTS, Watched, agent, chromium, gateway, log_in
from tests.fakes import AwaitablePublisher

pytestmark = [pytest.mark.process, pytest.mark.browser]

AGENT_1 = mint_token(KEY, "agent-1", tenant="acme", budget_id="team-acme")
#: Agent 2's large additions wait for an operator: the admin approves one in the approvals view.
AGENT_2 = mint_token(KEY, "agent-2", tenant="globex", controls=parse_controls(json.dumps(
    {"approvals": [{"tools": ["add"], "field": "a", "above": "100"}],
     "spend_limits": [{"tools": ["add"], "field": "b", "max": "1000", "window": "day", "tz": "Europe/Paris"}]})))
AGENT_3 = mint_token(KEY, "agent-3", tenant="globex")
VIEWS = ("overview", "sessions", "upstreams", "tokens", "approvals", "policy")
#: The first page load (page, stylesheet, script, the first API answers) stays under this.
FIRST_LOAD_BYTES = 150 * 1024
#: Bounds: the upstream re-listing after its list_changed; a revocation reaching this process.
SETTLE = 10.0


def accept_dialogs(page: Page) -> None:
    page.on("dialog", lambda dialog: asyncio.ensure_future(_accept(dialog)))


async def _accept(dialog: Dialog) -> None:
    await dialog.accept()


async def test_an_admin_sees_every_view_approves_a_changed_tool_and_revokes_an_agent(tmp_path: Path) -> None:
    async with gateway(tmp_path) as server:
        url = str(server.make_url("")).rstrip("/")
        async with (agent(url, AGENT_1, "claude-code") as one, agent(url, AGENT_2, "cursor") as two,
                    agent(url, AGENT_3, "goose") as three):
            await _with_agents(server, url, one, two, three)


async def _with_agents(server: TestServer, url: str, one: ClientSession, two: ClientSession,
                       three: ClientSession) -> None:
    """Calls, a policy refusal and a rug pull by SDK agents; then the admin's browser; then what it did, as the
    agents meet it: a revoked token and an ended session are refused, the third agent goes on."""
    console = server.app[CONSOLE]
    assert (await one.call_tool("echo", {"text": "hello"})).content[0].text == "hello"  # type: ignore[union-attr]
    await two.call_tool("add", {"a": 1, "b": 2})
    with pytest.raises(MCPError):
        await one.call_tool("drop_table", {"table": "users"})  # refused by the policy rule
    with pytest.raises(MCPError) as held:
        await two.call_tool("add", {"a": 500, "b": 1})  # held for the admin's approval
    assert held.value.data["error"] == "approval_required"
    await two.call_tool("rug_pull", {"tool": "add", "title": "Add (now exfiltrates)"})
    publisher = console.publisher
    assert isinstance(publisher, AwaitablePublisher)
    await publisher.first(events.TOOL_DEFINITION_CHANGED, SETTLE)  # the upstream re-listed: the pin changed
    for _ in range(3):
        await console.sampler.tick()
    async with chromium() as browser:
        await _admin_session(browser, url)
    with pytest.raises(MCPError):
        await one.call_tool("echo", {"text": "after revoke"})
    with pytest.raises(MCPError):
        await three.call_tool("echo", {"text": "after its session ended"})
    assert (await two.call_tool("echo", {"text": "still here"})).content[0].text == "still here"  # type: ignore[union-attr]
    approved = await two.call_tool("add", {"a": 500, "b": 1})  # the identical call, approved in the browser: runs once
    assert not approved.is_error, approved
    with pytest.raises(MCPError):
        await two.call_tool("add", {"a": 500, "b": 1})  # a second copy needs a new approval


async def _admin_session(browser: Browser, url: str) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    watched = Watched(url)
    watched.attach(page)
    accept_dialogs(page)
    answer = await log_in(page, url, ADMIN)
    assert answer.status == 303
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    await expect(page.get_by_text("ops-admin (header)")).to_be_visible()
    assert sum(watched.loaded.values()) < FIRST_LOAD_BYTES
    await _every_view(page)
    await _approve_the_held_call(page)
    await _approve_the_changed_tool(page)
    await _revoke(page, "agent-1")
    await _phone(browser, context, url)
    assert watched.foreign == []
    assert watched.errors == []
    await context.close()


async def _every_view(page: Page) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.get_by_role("link", name="Sessions").click()
    await expect(page.get_by_role("cell", name="agent-1")).to_be_visible()
    await expect(page.get_by_role("cell", name="cursor 1.0")).to_be_visible()
    await page.get_by_label("Search sessions").fill("globex")
    await page.get_by_label("Search sessions").press("Enter")
    await expect(page.get_by_role("cell", name="agent-1")).to_have_count(0)
    await expect(page.get_by_role("cell", name="agent-2")).to_be_visible()
    await page.get_by_label("Search sessions").fill("")
    await page.get_by_label("Search sessions").press("Enter")
    await expect(page.get_by_role("cell", name="agent-1")).to_be_visible()
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name="agent-3", exact=True))
    await row.get_by_role("button", name="End session").click()
    await expect(page.get_by_role("status")).to_contain_text("Done: ended")
    await expect(page.get_by_role("cell", name="agent-3", exact=True)).to_have_count(0)
    texts = {"overview": "Live sessions", "upstreams": "Tools and pins", "tokens": "team-acme",
             "approvals": "a above 100", "policy": "keep-the-users-table"}
    for view in VIEWS:
        await page.goto(page.url.split("#")[0] + f"#{view}")
        await expect(page.get_by_text(texts.get(view, "Sessions ("), exact=False).first).to_be_visible()
        if view == "policy":
            await _explain(page)
        await page.screenshot(path=str(SCREENSHOTS / f"{view}.png"))
    await page.goto(page.url.split("#")[0] + "#policy")
    await expect(page.get_by_role("cell", name="deny: 1")).to_be_visible()


async def _explain(page: Page) -> None:
    """The explain form: the same walk as `policy explain`, for a token and a call typed in."""
    await page.get_by_label("Caller's token").fill(AGENT_2)
    await page.get_by_label("Tool").fill("drop_table")
    await page.get_by_label("Arguments (JSON)").fill('{"table": "users"}')
    await page.get_by_role("button", name="Explain").click()
    await expect(page.locator("#explain-out")).to_contain_text("decision: deny by keep-the-users-table")


async def _approve_the_held_call(page: Page) -> None:
    await page.goto(page.url.split("#")[0] + "#approvals")
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name="agent-2", exact=True))
    await row.get_by_role("button", name="Approve").click()
    await expect(page.get_by_role("status")).to_contain_text("Done")
    await expect(page.get_by_text("Nothing is held.")).to_be_visible()


async def _approve_the_changed_tool(page: Page) -> None:
    await page.goto(page.url.split("#")[0] + "#upstreams")
    await page.get_by_role("button", name="Approve demo/add").click()
    await expect(page.get_by_role("status")).to_contain_text("Done: approved demo/add")
    await expect(page.get_by_role("button", name="Approve demo/add")).to_have_count(0)


async def _revoke(page: Page, token_id: str) -> None:
    await page.goto(page.url.split("#")[0] + "#tokens")
    await page.get_by_label("Token id").fill(token_id)
    await page.get_by_role("button", name="Revoke").click()
    await expect(page.get_by_role("status")).to_contain_text(f"Done: revoked {token_id}")


async def _phone(browser: Browser, desktop: object, url: str) -> None:
    """The overview at phone width, in the same login (the cookie of the desktop context)."""
    state = await desktop.storage_state()  # type: ignore[attr-defined]
    context = await browser.new_context(viewport={"width": 390, "height": 844}, storage_state=state)
    page = await context.new_page()
    await page.goto(f"{url}/console#overview")
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    await page.screenshot(path=str(SCREENSHOTS / "overview-phone.png"))
    await page.get_by_role("link", name="Sessions").click()
    await expect(page.get_by_role("cell", name="agent-2")).to_be_visible()
    await page.screenshot(path=str(SCREENSHOTS / "sessions-phone.png"))
    await context.close()


async def test_an_anonymous_visitor_an_ordinary_token_and_a_cross_site_form_are_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path) as server, chromium() as browser:
        url = str(server.make_url("")).rstrip("/")
        context = await browser.new_context()
        page = await context.new_page()
        api = await page.goto(f"{url}/console/api/sessions")
        assert api is not None
        assert api.status == 401
        answer = await log_in(page, url, AGENT_1)
        assert answer.status == 403
        await expect(page.get_by_role("alert")).to_contain_text("may not open the console")
        assert await context.cookies() == []
        assert (await log_in(page, url, ADMIN)).status == 303
        assert [c["name"] for c in await context.cookies()] == ["satgate_console"]
        await page.set_content(f'<form method="post" action="{url}/console/api/tokens/revoke">'
                               '<input name="token_id" value="agent-2"><button>go</button></form>')
        async with page.expect_response(f"{url}/console/api/tokens/revoke") as crossed:
            await page.get_by_role("button", name="go").click()
        assert (await crossed.value).status in (401, 403)
        assert not await server.app[CONSOLE].stores.revocations.is_revoked("agent-2")
        await context.close()


async def test_ten_thousand_live_sessions_render_in_under_a_second_one_page_at_a_time(tmp_path: Path) -> None:
    async with gateway(tmp_path, sessions=10_000) as server, chromium() as browser:
        url = str(server.make_url("")).rstrip("/")
        registry, identity = server.app[REGISTRY], verify_token(KEY, AGENT_1, now=0)
        for _ in range(10_000):
            registry.open(AGENT_1, identity, "2025-11-25")
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        page = await context.new_page()
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))
        assert (await log_in(page, url, ADMIN)).status == 303
        started = time.monotonic()
        await page.goto(f"{url}/console#sessions")
        await expect(page.get_by_role("heading", name="Sessions (10000 live")).to_be_visible()
        await expect(page.get_by_role("row")).to_have_count(51)  # the header and one page of 50
        assert time.monotonic() - started < 1.0
        pages = [u.removeprefix(url) for u in asked if "/console/api/sessions" in u]
        assert pages == ["/console/api/sessions?q=&offset=0&limit=50"]
        await context.close()

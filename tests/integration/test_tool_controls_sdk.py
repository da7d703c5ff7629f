"""Tool controls through a real gateway (``serve`` in header mode) in front of the real test upstream on the
official SDK, reached by the official SDK client: values outside the list, URL tricks and a narrowed token that
tries to widen its parent's rule are refused -32001 before the upstream (its ledger shows only what passed), the
refusal never echoes the value, and a malformed control is a 401."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pymacaroons import Macaroon

from satgate_mcp.auth.macaroons import add_caveats, mint_token
from satgate_mcp.policy.controls import parse_controls
from tests.conftest import upstream_command
from tests.gateway_process import GatewayProcess, call_text, sdk_session

pytestmark = pytest.mark.process

KEY = "tool-controls-e2e-root-key-0123456789abcdef"
TIMEOUT = 15.0
#: A value that must never be echoed, logged or published.
SECRET = "sk-live-0123456789abcdef"
CONTROLS = {
    "args": [{"tools": ["pay*"], "field": "vendor", "one_of": ["acme", "globex"]},
             {"tools": ["pay"], "field": "amount", "min": "0.01", "max": "500"},
             {"tools": ["fetch"], "field": "url", "url": {"hosts": ["api.example.com"], "path_prefixes": ["/v1/"]}}],
    "spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "200", "window": "day", "tz": "America/New_York"}],
}
WIDER = {"args": [{"tools": ["pay*"], "field": "vendor", "one_of": ["acme", "globex", "evil"]},
                  {"tools": ["fetch"], "field": "url", "url": {"hosts": ["api.example.com", "evil.com"]}}]}
URL_TRICKS = ["https://api.example.com@evil.com/v1/x", "https://api.example.com.evil.com/v1/x",
              "https://api.example.com/v1/../admin", "https://api.example.com/v1/%2e%2e/admin",
              "https://api.example.com:8443/v1/x", "https://api.example.com\\@evil.com/v1/",
              "https://\uff41pi.example.com/v1/x", "http://api.example.com/v1/x", "https://xn--pi-7ba.example.com/v1/"]


async def refused(session: ClientSession, tool: str, arguments: dict[str, object]) -> dict[str, object]:
    with pytest.raises(MCPError) as caught:
        await asyncio.wait_for(session.call_tool(tool, arguments), TIMEOUT)
    assert caught.value.code == -32001
    data = caught.value.data
    assert isinstance(data, dict)
    return data


async def test_rules_hold_against_a_real_upstream_and_a_narrowed_token_cannot_widen_them(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments", "--ledger", str(ledger))}}
    gw = GatewayProcess(tmp_path, root_key=KEY, settings={"SATGATE_UPSTREAMS": json.dumps(upstreams)})
    parent = mint_token(KEY, "agent-7", controls=parse_controls(json.dumps(CONTROLS)))
    child = add_caveats(parent, controls=parse_controls(json.dumps(WIDER)))
    try:
        gw.start()
        await gw.wait_ready()
        async with asyncio.timeout(90):
            for token in (parent, child):
                async with sdk_session(gw.url, token, timeout=TIMEOUT) as session:
                    for vendor in ("evil", "ACME", ["acme"], None, SECRET):
                        data = await refused(session, "pay", {"amount": 1, "vendor": vendor})
                        assert data == {"error": "argument_denied", "tool": "pay", "field": "vendor",
                                        "allowed": ["acme", "globex"]}
                    for amount in ("lots", 500.01, True):
                        assert (await refused(session, "pay", {"amount": amount, "vendor": "acme"}))["field"] \
                            == "amount"
                    for url in URL_TRICKS:
                        data = await refused(session, "fetch", {"url": url})
                        assert data["error"] == "argument_denied"
                        assert url not in json.dumps(data)
                    assert await call_text(session, "fetch", {"url": "https://api.example.com/v1/rates"},
                                           timeout=TIMEOUT) == "fetched https://api.example.com/v1/rates"
                    assert await call_text(session, "pay", {"amount": "99.5", "vendor": "acme"},
                                           timeout=TIMEOUT) == "paid 99.5 to acme"
            # Parent and child spend from one sum: 199 of 200 is gone.
            async with sdk_session(gw.url, child, timeout=TIMEOUT) as session:
                data = await refused(session, "pay", {"amount": 2, "vendor": "globex"})
                assert (data["error"], data["remaining"]) == ("spend_limit_exceeded", "1")
        assert [json.loads(line) for line in ledger.read_text().splitlines()] == [
            {"amount": "99.5", "vendor": "acme"}] * 2
        assert SECRET not in gw.log_tail(1000)
        assert SECRET not in gw.events_file.read_text()
    finally:
        await gw.kill()


async def test_a_token_with_a_malformed_control_is_a_401(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path, root_key=KEY)
    # A holder appends a controls caveat (no root key needed) that this gateway cannot read: an unknown control.
    mac = Macaroon.deserialize(mint_token(KEY, "agent-8"))
    mac.add_first_party_caveat('controls = {"approvals": [{"tools": ["pay"]}], "holds": []}')
    try:
        gw.start()
        await gw.wait_ready()
        async with httpx2.AsyncClient(trust_env=False, timeout=TIMEOUT) as http:
            resp = await http.post(f"{gw.url}/mcp", headers={
                "Authorization": f"Bearer {mac.serialize()}", "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream"}, content=json.dumps({
                    "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                        "protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"}}}))
        assert resp.status_code == 401
    finally:
        await gw.kill()


async def test_an_operators_observe_lets_breaches_through_and_counts_them(tmp_path: Path) -> None:
    upstreams = {"p": {"transport": "stdio", "command": upstream_command("--payments")}}
    gw = GatewayProcess(tmp_path, root_key=KEY, settings={"SATGATE_UPSTREAMS": json.dumps(upstreams),
                                                          "SATGATE_ENFORCEMENT": "observe"})
    token = mint_token(KEY, "agent-9", controls=parse_controls(json.dumps(CONTROLS)))
    try:
        gw.start()
        await gw.wait_ready()
        async with asyncio.timeout(60), sdk_session(gw.url, token, timeout=TIMEOUT) as session:
            assert await call_text(session, "pay", {"amount": 300, "vendor": "evil"}, timeout=TIMEOUT) \
                == "paid 300 to evil"
            async with httpx2.AsyncClient(trust_env=False, timeout=TIMEOUT) as http:
                metrics = (await http.get(f"{gw.url}/metrics")).text
        assert 'satgate_control_breaches_total{error="argument_denied",mode="observed"} 1.0' in metrics
        assert 'satgate_control_breaches_total{error="spend_limit_exceeded",mode="observed"} 1.0' in metrics
        assert [e["enforced"] for e in gw.events("control_breach")] == [False, False]
    finally:
        await gw.kill()

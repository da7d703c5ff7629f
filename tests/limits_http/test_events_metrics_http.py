"""The events file and the metrics over HTTP: one JSON line per event, never a token; the counters."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_aiohttp import AiohttpClient

from satgate_mcp import jsonrpc
from satgate_mcp.app import create_app
from satgate_mcp.metrics import Metrics
from tests.limits_http.deployment import (
    Deploy,
    Gateway,
    ScriptedPool,
    echoed,
    header_settings,
    mint,
    refused_for,
    sample,
)

# --- events and metrics -------------------------------------------------------------------------------


async def test_the_events_file_gets_one_json_line_per_event_and_never_a_token(
        aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    events_file = tmp_path / "events.jsonl"
    settings = header_settings(rate_limit="1/m", rate_burst=2, events_file=events_file)
    pool = ScriptedPool()
    app = create_app(settings, pool=pool)  # publisher and policy built from the settings
    gw = Gateway(app, await aiohttp_client(app), pool)
    token = mint(budget_limit=1)
    sid = await gw.initialize(token)
    assert echoed(await gw.call(token, sid, request_id=1, text="hi"))
    assert refused_for(await gw.call(token, sid, request_id=2)) == "budget_exhausted"
    assert refused_for(await gw.call(token, sid, request_id=3)) == "rate_limited"
    assert (await gw.post("not-a-token", jsonrpc.request_message(0, "initialize", {}))).status == 401
    assert await gw.delete(token, sid) == 200

    text = events_file.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["event"] for r in records] == [
        "session_connect", "budget_spend", "tool_call", "budget_exhausted", "rate_limited", "auth_failure",
        "session_close"]
    by_name = {r["event"]: r for r in records}
    assert by_name["session_connect"]["resumed"] is False
    assert by_name["session_connect"]["session_id"] == sid
    assert by_name["tool_call"]["outcome"] == "ok"
    assert by_name["budget_spend"]["remaining"] == 0
    assert by_name["budget_exhausted"]["tool"] == "echo"
    assert by_name["rate_limited"]["retry_after_seconds"] == 60
    assert by_name["auth_failure"]["outcome"] == "invalid"
    assert by_name["session_close"]["reason"] == "deleted"
    assert all(r["token_id"] == "agent-1" for r in records if "token_id" in r)
    assert token not in text
    assert token[-32:] not in text
    assert "Bearer" not in text


async def test_metrics_count_sessions_requests_tool_calls_latency_and_refusals(deploy: Deploy) -> None:
    deployment = deploy(rate_limit="1/m", rate_burst=2)
    gw = await deployment.start()
    alice, broke = mint("alice"), mint("broke", budget_limit=0)
    alice_sid, broke_sid = await gw.initialize(alice), await gw.initialize(broke)
    samples = await gw.metrics()
    assert sample(samples, "satgate_active_sessions") == 2
    assert sample(samples, "satgate_sessions_opened_total") == 2

    assert echoed(await gw.call(alice, alice_sid, request_id=1, text="hi"))
    assert "error" in (await gw.call(alice, alice_sid, "fail", request_id=2, code=-32603)).body
    assert refused_for(await gw.call(alice, alice_sid, request_id=3)) == "rate_limited"
    assert refused_for(await gw.call(broke, broke_sid, request_id=1)) == "budget_exhausted"
    assert (await gw.call("not-a-token", alice_sid, request_id=4)).status == 401
    assert await gw.delete(alice, alice_sid) == 200

    samples = await gw.metrics()
    assert sample(samples, "satgate_active_sessions") == 1
    assert sample(samples, "satgate_requests_total", method="tools/call", status="200") == 4
    assert sample(samples, "satgate_requests_total", method="tools/call", status="401") == 1
    assert sample(samples, "satgate_requests_total", method="initialize", status="200") == 2
    assert sample(samples, "satgate_tool_calls_total", upstream="fake", outcome="ok") == 1
    assert sample(samples, "satgate_tool_calls_total", upstream="fake", outcome="error") == 1
    assert sample(samples, "satgate_upstream_latency_seconds_count", upstream="fake", method="tools/call") == 2
    assert sample(samples, "satgate_upstream_latency_seconds_bucket", upstream="fake", method="tools/call",
                  le="+Inf") == 2
    assert sample(samples, "satgate_refusals_total", reason="rate_limited") == 1
    assert sample(samples, "satgate_refusals_total", reason="budget_exhausted") == 1
    assert sample(samples, "satgate_refusals_total", reason="invalid") == 1

    second = await deployment.start(metrics=Metrics())
    assert refused_for(await second.call(broke, broke_sid, request_id=2)) == "budget_exhausted"
    samples = await second.metrics()
    assert sample(samples, "satgate_sessions_resumed_total") == 1
    assert sample(samples, "satgate_sessions_opened_total") == 0
    assert sample(samples, "satgate_active_sessions") == 1

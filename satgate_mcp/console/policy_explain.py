"""The policy view's explain form: the same walk as ``satgate-mcp policy explain``, on the rules in force, for a
token the console verifies as ``/mcp`` would and a tool the pool lists (its annotations and upstream from there)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from satgate_mcp.console.parts import Parts
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.policy.decide import token_variables, tool_variables
from satgate_mcp.policy.explain import explain, report
from satgate_mcp.policy.rules import METHODS

#: The arguments of one explained call, as JSON text, at most this long.
MAX_ARGS_CHARS = 64 * 1024


def _asked(body: dict[str, Any]) -> tuple[str, str, str, JsonObj] | str:
    token, tool, method = body.get("token"), body.get("tool"), body.get("method", "tools/call")
    arguments = body.get("args", {})
    if not isinstance(token, str) or not token.strip():
        return "give the caller's token as {\"token\": ...}"
    if not isinstance(tool, str) or not tool or len(tool) > 512:
        return "give the tool's name as {\"tool\": ...}"
    if method not in METHODS:
        return f"method must be one of {', '.join(sorted(METHODS))}"
    if not isinstance(arguments, dict) or len(repr(arguments)) > MAX_ARGS_CHARS:
        return "args must be a JSON object (at most 64 KiB)"
    return token.strip(), tool, method, arguments


async def explain_call(parts: Parts, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status, answer): every rule's verdict and the decision, or why the question cannot be asked."""
    if parts.policy_file is None:
        return 409, {"error": "policy rules are off on this gateway"}
    asked = _asked(body)
    if isinstance(asked, str):
        return 400, {"error": asked}
    token, tool, method, arguments = asked
    identity = await parts.gatekeeper.identity_of(token)
    if isinstance(identity, str):
        return 400, {"error": identity}
    definition = parts.pool.tool(tool) if method == "tools/call" else None
    variables: JsonObj = {
        "token": token_variables(identity), "tool": tool_variables(tool, parts.pool.owner_of_tool(tool), definition),
        "args": arguments, "session": {"id": "", "protocol": "", "client": {"name": "", "version": ""}},
        "request": {"method": method, "remote_addr": ""}, "now": datetime.now(UTC)}
    verdicts, decision = explain(parts.policy_file.rules, method, tool, variables)
    return 200, {"verdicts": [{"rule": v.rule, "outcome": v.outcome, "detail": v.detail} for v in verdicts],
                 "decision": {"effect": decision.effect.value, "rule": decision.rule, "reason": decision.reason,
                              "error": decision.error},
                 "report": report(verdicts, decision)}

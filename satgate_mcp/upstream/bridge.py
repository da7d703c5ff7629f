"""A 2026-07-28 upstream's ``input_required`` put to a 2025 client, and the errors of that bridge.

A 2025 client cannot retry with answers: it is asked each of the upstream's ``inputRequests`` as a real
request on its call's stream, and the connection retries upstream with what it answered. Kept apart from
connection.py, which only decides when this applies.
"""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import Relay


def moved_on_refusal(asked: str, here: str) -> JsonObj:
    """A retry whose sealed state names another upstream than the one the call now routes to."""
    return jsonrpc.error_response(None, jsonrpc.INVALID_PARAMS,
                                  f"Invalid params: this requestState continues a call on upstream {asked!r}, but "
                                  f"the request now goes to {here!r} (or that upstream no longer speaks 2026-07-28); "
                                  "issue the call again without inputResponses and requestState",
                                  {"error": "request_state_refused"})


def missing_capability_reply(upstream: str, required: JsonObj) -> JsonObj:
    """The call's error when a modern upstream asks for input the calling client did not declare it can give."""
    names = ", ".join(sorted(required))
    return jsonrpc.error_response(None, jsonrpc.MISSING_CLIENT_CAPABILITY,
                                  f"This call needs the client capability {names}, which the client did not declare "
                                  f"(upstream {upstream!r} asked for it)",
                                  {"error": "missing_client_capability", "requiredCapabilities": required})


def input_refusal(upstream: str, why: str) -> JsonObj:
    return jsonrpc.error_response(None, jsonrpc.INTERNAL_ERROR,
                                  f"upstream {upstream!r} asked for client input the gateway cannot give: {why}",
                                  {"error": "input_not_relayed", "upstream": upstream})

async def ask_client(upstream: str, relay: Relay, result: JsonObj, timeout: float) -> JsonObj:
    """Put each of a modern upstream's ``inputRequests`` to the 2025 client as a real request.

    ``{"result": inputResponses}``, or the first refusal or error the client gave, as the call's error.
    """
    asked = result.get("inputRequests")
    requests: list[tuple[str, str, JsonObj | None]] = []
    for key, request in (asked.items() if isinstance(asked, dict) else ()):
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return input_refusal(upstream, f"its inputRequests[{key!r}] is not a request")
        params = request.get("params")
        requests.append((str(key), request["method"], params if isinstance(params, dict) else None))
    # Nothing is put to the client before it is known that it can answer every question.
    required: JsonObj = {}
    for _, method, params in requests:
        for capability, detail in (relay.lacks(method, params) or {}).items():
            required[capability] = {**required.get(capability, {}), **detail}
    if required:
        return missing_capability_reply(upstream, required)
    answers: JsonObj = {}
    for key, method, params in requests:
        answer = await relay.ask(method, params, timeout)
        if "error" in answer:
            return jsonrpc.with_id({k: v for k, v in answer.items() if k != "result"}, None)
        if not isinstance(answer.get("result"), dict):
            return input_refusal(upstream, "the client's answer has no result")
        answers[key] = answer["result"]
    return {"result": answers}

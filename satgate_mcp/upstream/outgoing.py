"""The bytes the gateway sends upstream: one place that keeps the no-token-passthrough rule."""

from __future__ import annotations

from satgate_mcp import jsonrpc
from satgate_mcp.jsonrpc import JsonObj


def strip_client_credentials(params: JsonObj | None) -> JsonObj | None:
    """Drop ``_meta.token`` so a client's bearer token never reaches an upstream."""
    if not params or not isinstance(params.get("_meta"), dict) or "token" not in params["_meta"]:
        return params
    meta = {k: v for k, v in params["_meta"].items() if k != "token"}
    out = dict(params)
    if meta:
        out["_meta"] = meta
    else:
        del out["_meta"]
    return out


def encode_message(message: JsonObj) -> bytes:
    """The bytes of one message to an upstream, without the client's credentials.

    Every request, notification and answer the gateway sends upstream, on either transport, is
    encoded here, so this is where the no-token-passthrough rule is kept, and nothing bypasses it.
    """
    params = message.get("params")
    if isinstance(params, dict):
        stripped = strip_client_credentials(params)
        if stripped is not params:
            message = {**message, "params": stripped}
    return jsonrpc.dumps(message)  # compact UTF-8, as json.dumps(ensure_ascii=False) wrote it

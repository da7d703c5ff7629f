"""JSON-RPC 2.0 message shapes, parsing and constructors.

Pure data: nothing here knows about HTTP, sessions or upstreams, so every layer can share it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeAlias

import orjson

JsonObj: TypeAlias = dict[str, Any]
RequestId: TypeAlias = str | int


def dumps(value: Any) -> bytes:
    """Compact JSON bytes: orjson on the hot path; the standard library for what orjson refuses
    (integers beyond 64 bits), so nothing a client sent becomes unanswerable."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


#: 19 digits in a row may be an integer beyond 64 bits, which orjson would turn into a float: those bodies
#: (or any that merely contain such a run, in a string say) take the exact standard-library path. Found by
#: mapping every digit to "1" and anything else to " " (two passes in C, a quarter of a regex search's time).
_DIGITS_AS_ONES = bytes(0x31 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_RUN = b"1" * 19


def has_long_digit_run(raw: bytes) -> bool:
    return raw.translate(_DIGITS_AS_ONES).find(_LONG_RUN) != -1  # `in` would make and drop a TypeError first


#: A ``\\uD800``-``\\uDFFF`` escape: a surrogate, which JSON may spell but Unicode text cannot hold on its own.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(raw: bytes) -> Any:
    """orjson first; the standard library for what it refuses (NaN) or would round (integers beyond 64
    bits), so the gateway reads exactly the JSON it always read. Raises ValueError or RecursionError.

    A lone surrogate (``"\\ud800"``) is refused as orjson refuses it: no later step (a log line, a record's
    key, a digest, an upstream's pipe) could encode it, and each used to fail with a 500."""
    if not has_long_digit_run(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    value = json.loads(raw)
    if _SURROGATE_ESCAPE.search(raw) is not None:
        try:  # a valid pair was joined into one character: only a lone half fails to encode
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a lone UTF-16 surrogate in a JSON string") from None
    return value


PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Implementation-defined server errors (-32000..-32099).
SERVER_ERROR = -32000
TOOL_NOT_ALLOWED = -32001
#: Not -32002: MCP uses that for "resource not found".
UPSTREAM_UNAVAILABLE = -32010
UPSTREAM_TIMEOUT = -32003
RATE_LIMITED = -32004
REQUEST_CANCELLED = -32800
#: 2026-07-28: the call needs a client capability the client did not declare (``data.requiredCapabilities``).
MISSING_CLIENT_CAPABILITY = -32021
#: 2025-11-25: the request needs URL-mode elicitations completed first (``data.elicitations``).
URL_ELICITATION_REQUIRED = -32042


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: JsonObj | None


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: JsonObj | None


@dataclass(frozen=True, slots=True)
class Response:
    """A result or an error reply; exactly one of ``result``/``error`` is set."""

    id: RequestId | None
    result: JsonObj | None
    error: JsonObj | None


Message: TypeAlias = Request | Notification | Response


class InvalidMessage(ValueError):
    """The value parsed as JSON but is not a JSON-RPC 2.0 message."""

    def __init__(self, reason: str, request_id: RequestId | None = None) -> None:
        super().__init__(reason)
        self.request_id = request_id


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def parse_message(value: Any) -> Message:
    """Classify one decoded JSON value; raise InvalidMessage with a readable reason."""
    if not isinstance(value, dict):
        raise InvalidMessage("a JSON-RPC message must be a JSON object")
    raw_id = value.get("id")
    known_id: RequestId | None = raw_id if _valid_id(raw_id) else None
    if value.get("jsonrpc") != "2.0":
        raise InvalidMessage('"jsonrpc" must be "2.0"', known_id)
    params = value.get("params")
    if params is not None and not isinstance(params, dict):
        raise InvalidMessage('"params" must be an object', known_id)
    if "method" in value:
        method = value["method"]
        if not isinstance(method, str) or not method:
            raise InvalidMessage('"method" must be a non-empty string', known_id)
        if "id" not in value:
            return Notification(method, params)
        if known_id is None:
            raise InvalidMessage('"id" must be a string or an integer')
        return Request(known_id, method, params)
    has_result, has_error = "result" in value, "error" in value
    if has_result == has_error:
        raise InvalidMessage("a message needs a method, or exactly one of result/error", known_id)
    if "id" not in value or (raw_id is not None and known_id is None):
        raise InvalidMessage('a response needs a string, integer or null "id"')
    if has_error:
        err = value["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int):
            raise InvalidMessage('"error" must be an object with an integer "code"', known_id)
        return Response(known_id, None, err)
    result = value["result"]
    return Response(known_id, result if isinstance(result, dict) else {"value": result}, None)


def error_object(code: int, message: str, data: JsonObj | None = None) -> JsonObj:
    err: JsonObj = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return err


def error_response(request_id: RequestId | None, code: int, message: str, data: JsonObj | None = None) -> JsonObj:
    return {"jsonrpc": "2.0", "id": request_id, "error": error_object(code, message, data)}


def result_response(request_id: RequestId | None, result: JsonObj) -> JsonObj:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def request_message(request_id: RequestId, method: str, params: JsonObj | None = None) -> JsonObj:
    msg: JsonObj = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def notification_message(method: str, params: JsonObj | None = None) -> JsonObj:
    msg: JsonObj = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def with_id(message: JsonObj, request_id: RequestId | None) -> JsonObj:
    """Copy of a response with its id replaced: how replies travel back under the client's id."""
    out = dict(message)
    out["id"] = request_id
    return out

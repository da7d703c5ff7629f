"""Answers a 2026-07-28 client sends with a new call, matched to what a 2025 upstream then asks (MRTR).

A 2026 server keys its questions and reads answers sent up front by key, ignoring keys it does not know.
A 2025 upstream asks mid-call, unkeyed, and the gateway names the question itself (``elicitation-1``), so
the client's keys mean nothing here. Rather than ask again what the client already answered (a direct
server would not), the gateway takes the one answer that fits the question: its shape is that method's
result and, for a form, its content satisfies the requested schema. None fits, or several do: the
question is asked as usual. The answers are the calling client's own, for its own call.
"""

from __future__ import annotations

from satgate_mcp.jsonrpc import JsonObj

ELICIT_ACTIONS = frozenset({"accept", "decline", "cancel"})
#: JSON Schema primitive type -> the Python types a value of it may have.
SCHEMA_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "number": (int, float), "integer": (int,),
                                             "boolean": (bool,), "array": (list,), "object": (dict,)}


def offered_answer(method: str, params: JsonObj | None, offered: JsonObj) -> str | None:
    """The key of the only answer in ``offered`` that fits this question, else None."""
    fitting = [key for key, answer in offered.items() if isinstance(answer, dict) and fits(method, params, answer)]
    return fitting[0] if len(fitting) == 1 else None


def fits(method: str, params: JsonObj | None, answer: JsonObj) -> bool:
    """Whether ``answer`` has the shape of ``method``'s result (and, for a form, satisfies its schema)."""
    if method == "elicitation/create":
        if answer.get("action") not in ELICIT_ACTIONS:
            return False
        schema = (params or {}).get("requestedSchema")
        if answer["action"] != "accept" or not isinstance(schema, dict):
            return True
        content = answer.get("content")
        return isinstance(content, dict) and satisfies(content, schema)
    if method == "sampling/createMessage":
        return isinstance(answer.get("role"), str) and isinstance(answer.get("content"), (dict, list))
    if method == "roots/list":
        return isinstance(answer.get("roots"), list)
    return False


def satisfies(content: JsonObj, schema: JsonObj) -> bool:
    """A form's flat schema: every required field present, no unknown field, each of its declared type."""
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    if any(name not in content for name in (required if isinstance(required, list) else [])):
        return False
    for name, value in content.items():
        declared = properties.get(name)
        if not isinstance(declared, dict):
            return False
        kinds = SCHEMA_TYPES.get(str(declared.get("type")))
        if kinds is not None and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))):
            return False
    return True

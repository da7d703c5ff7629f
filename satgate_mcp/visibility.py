"""What a token's ``tools``, ``resources`` and ``prompts`` caveats let it name and see.

Pure decisions over a verified identity, apart from the dispatcher that acts on them: the target a
forwarded request names, whether the token may name it, and an upstream listing without what it may not.
"""

from __future__ import annotations

from satgate_mcp.auth.base import Identity
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.catalog import LISTINGS, Kind

#: Upstream listings filtered by the token's caveats: method -> (what the pool lists, caveat kind).
FILTERED_LISTS: dict[str, tuple[Kind, str]] = {
    "resources/list": ("resources", "resource"),
    "resources/templates/list": ("templates", "resource"),
    "prompts/list": ("prompts", "prompt"),
}
RESOURCE_METHODS = frozenset({"resources/read", "resources/subscribe", "resources/unsubscribe"})


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def named_target(method: str, params: JsonObj | None) -> tuple[str, str] | None:
    """What a forwarded request names, as the pool routes it: ``("resource", uri)`` or ``("prompt", name)``.

    A completion's ref names a prompt (``ref/prompt``) or else a resource (template) URI. None for lists.
    """
    params = params if isinstance(params, dict) else {}
    if method in RESOURCE_METHODS:
        return "resource", _text(params.get("uri"))
    if method == "prompts/get":
        return "prompt", _text(params.get("name"))
    if method == "completion/complete":
        ref = params.get("ref")
        ref = ref if isinstance(ref, dict) else {}
        if ref.get("type") == "ref/prompt":
            return "prompt", _text(ref.get("name"))
        return "resource", _text(ref.get("uri"))
    return None


def allows(identity: Identity, kind: str, name: str) -> bool:
    return identity.allows_prompt(name) if kind == "prompt" else identity.allows_resource(name)


def visible_listing(identity: Identity, method: str, reply: JsonObj) -> JsonObj:
    """An upstream listing without the items the token may not name (unnamed items count as not allowed)."""
    spec = FILTERED_LISTS.get(method)
    if spec is None:
        return reply
    listed, kind = spec
    key, item_key = LISTINGS[listed].key, LISTINGS[listed].names_by
    if not (identity.prompt_filters if kind == "prompt" else identity.resource_filters):
        return reply
    result = reply.get("result")
    if not isinstance(result, dict) or not isinstance(result.get(key), list):
        return reply
    items = [item for item in result[key]
             if isinstance(item, dict) and allows(identity, kind, _text(item.get(item_key)))]
    return {**reply, "result": {**result, key: items}}

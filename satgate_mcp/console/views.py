"""What each view shows, as plain rows: pure functions over the gateway's own objects, tested from tables.

Nothing here reads a credential: a session row names its token id, never its token or hash, and the
rows of features that are not configured say so instead of being empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from satgate_mcp.policy import pins
from satgate_mcp.policy.pins import Pin
from satgate_mcp.sessions import Session

#: The largest page the sessions API answers: 10,000 live sessions never travel at once.
MAX_PAGE = 100
DEFAULT_PAGE = 50
#: A search longer than this is refused (it could match nothing a row holds).
MAX_QUERY = 200


@dataclass(frozen=True, slots=True)
class Page:
    offset: int
    limit: int
    query: str


def page_of(params: Mapping[str, str]) -> Page | str:
    """The page a request asks for (offset, limit at most ``MAX_PAGE``, search text), or what is wrong with it."""
    try:
        offset = int(params.get("offset", "0"))
        limit = int(params.get("limit", str(DEFAULT_PAGE)))
    except ValueError:
        return "offset and limit must be whole numbers"
    query = params.get("q", "").strip()
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        return f"offset must be 0 or more and limit from 1 to {MAX_PAGE}"
    if len(query) > MAX_QUERY:
        return f"the search may be at most {MAX_QUERY} characters"
    return Page(offset, limit, query.lower())


def client_of(session: Session) -> tuple[str, str]:
    info = session.client_info if isinstance(session.client_info, dict) else {}
    name, version = info.get("name"), info.get("version")
    return (name if isinstance(name, str) else "", version if isinstance(version, str) else "")


def session_row(session: Session, now: float) -> dict[str, Any]:
    """One row of the sessions view; ``now`` on the registry's clock (ages, not timestamps, cross processes)."""
    name, version = client_of(session)
    return {"id": session.id, "token_id": session.identity.token_id, "tenant": session.identity.tenant,
            "client": name, "client_version": version, "protocol": session.protocol_version,
            "age_s": round(max(0.0, now - session.created_at)), "idle_s": round(max(0.0, now - session.last_seen)),
            "resumed": session.resumed, "inflight": session.inflight}


def _matches(session: Session, query: str) -> bool:
    name, version = client_of(session)
    fields = (session.id, session.identity.token_id, session.identity.tenant or "", name, version,
              session.protocol_version)
    return any(query in field.lower() for field in fields)


def sessions_page(sessions: Iterable[Session], page: Page, now: float) -> dict[str, Any]:
    """The newest sessions first, filtered by the search, one bounded page of rows."""
    found = [s for s in sessions if not page.query or _matches(s, page.query)]
    found.sort(key=lambda s: (-s.created_at, s.id))
    rows = [session_row(s, now) for s in found[page.offset:page.offset + page.limit]]
    return {"matched": len(found), "offset": page.offset, "limit": page.limit, "items": rows}


def pin_row(pin: Pin) -> dict[str, Any]:
    return {"upstream": pin.upstream, "tool": pin.tool, "status": pin.status,
            "status_text": pins.STATUS_TEXT[pin.status],
            "fingerprint": pin.approved, "pending": pin.pending,
            "changed": pins.changed_fields(pin.approved_definition, pin.pending_definition) if pin.pending else []}


def upstream_rows(specs: Mapping[str, Any], ready: Mapping[str, bool], failures: Mapping[str, Mapping[str, str]],
                  pids: Mapping[str, int | None], restarts: Mapping[str, float], tools: Mapping[str, list[str]],
                  pinned: Iterable[Pin] | None) -> list[dict[str, Any]]:
    """One row per configured upstream; ``pinned`` None: pinning is off (each tool says so)."""
    by_tool = {(p.upstream, p.tool): p for p in pinned or ()}
    rows = []
    for name, spec in specs.items():
        listed = []
        for tool in tools.get(name, []):
            pin = by_tool.get((name, tool))
            status = "off" if pinned is None else (pin.status if pin is not None else "unpinned")
            listed.append({"name": tool, "pin": status})
        rows.append({"name": name, "transport": spec.transport, "state": "ready" if ready.get(name) else "down",
                     "pid": pids.get(name), "restarts": int(restarts.get(name, 0)),
                     "last_error": dict(failures[name]) if name in failures else None,
                     "isolation": getattr(spec, "isolation", "shared"), "tools": listed,
                     "breaker": None})
    return rows


def budget_rows(limits: Mapping[str, float | None], remaining: Mapping[str, float | None],
                holders: Mapping[str, set[str]]) -> list[dict[str, Any]]:
    """Spend against limit per budget id: what is left as the budget store says, and who spends from it here."""
    rows = []
    for key in sorted(limits):
        limit, left = limits[key], remaining.get(key)
        spent = None if limit is None or left is None else round(max(0.0, limit - left), 6)
        rows.append({"budget_id": key, "limit": limit, "remaining": left, "spent": spent,
                     "tokens": sorted(holders.get(key, set()))[:20]})
    return rows


def rule_rows(rules: Iterable[Any], counts: Mapping[tuple[str, str], float]) -> list[dict[str, Any]]:
    """Each loaded rule with how many calls it decided, by effect, since this process started."""
    rows = []
    for rule in rules:
        decided = {effect: int(n) for (name, effect), n in counts.items() if name == rule.name}
        rows.append({"name": rule.name, "effect": str(rule.effect), "methods": sorted(rule.methods),
                     "tools": list(rule.tools) if rule.tools is not None else None,
                     "when": rule.when.source if rule.when is not None else None, "reason": rule.reason,
                     "decisions": decided})
    return rows

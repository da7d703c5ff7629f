"""The console's JSON API under ``/console/api/``: what the page reads, and what scripts may call with
``Authorization: Bearer <admin token>``. Reads what the gateway already counts; acts as the CLI does
(``token revoke``, ``tools approve``, a session's DELETE).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from satgate_mcp.auth.revocation import is_valid_token_id
from satgate_mcp.console import views
from satgate_mcp.console.features import off
from satgate_mcp.console.gatekeeper import Admin
from satgate_mcp.console.guard import admin_only, json_answer, json_body, secured
from satgate_mcp.console.pages import record
from satgate_mcp.console.parts import Parts
from satgate_mcp.console.policy_explain import explain_call
from satgate_mcp.console.reads import budgets, pins_or_none, policy_view, rate_refusals, upstreams_view
from satgate_mcp.policy import pins as pin_rules

#: Reasons of the ``satgate_refusals`` counter that are rate or quota refusals (the tokens view shows them).
RATE_REASONS = ("rate_limited", "too_many_in_flight")


class Api:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts

    def add_routes(self, app: web.Application) -> None:
        settings, gate = self._parts.settings, self._parts.gatekeeper
        routes = [("GET", "me", self.me), ("GET", "overview", self.overview), ("GET", "sessions", self.sessions),
                  ("POST", "sessions/end", self.end_session), ("GET", "upstreams", self.upstreams),
                  ("POST", "upstreams/approve", self.approve_tool), ("GET", "tokens", self.tokens),
                  ("POST", "tokens/revoke", self.revoke), ("GET", "approvals", self.approvals),
                  ("POST", "approvals/approve", self.approve_call), ("POST", "approvals/deny", self.deny_call),
                  ("GET", "policy", self.policy), ("POST", "policy/explain", self.explain)]
        for method, path, handler in routes:
            app.router.add_route(method, f"/console/api/{path}", secured(settings, admin_only(gate, handler)))

    async def me(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        rules = self._parts.gatekeeper.rules
        return json_answer({"who": admin.who, "via": admin.via, "csrf": admin.csrf, "expires": admin.expires,
                            "auth_mode": rules.auth_mode, "open": admin.via == "open",
                            "process": self._parts.sampler.name})

    async def overview(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        sampler = self._parts.sampler
        processes = await sampler.read_all()
        return json_answer({"processes": processes, "series": sampler.ring.series(),
                            "latency": sampler.ring.latency(), "store": {"kind": self._parts.stores.kind,
                                                                          "state": sampler.store_state},
                            "cluster": self._parts.stores.board is not None})

    async def sessions(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        page = views.page_of(request.query)
        if isinstance(page, str):
            return json_answer({"error": page}, 400)
        registry = self._parts.registry
        found = views.sessions_page(registry, page, self._parts.clock())
        return json_answer({**found, "total": len(registry), "process": self._parts.sampler.name})

    async def end_session(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        body = await json_body(request)
        session_id = body.get("id") if body else None
        if not isinstance(session_id, str) or not session_id:
            return json_answer({"error": "give the session's id as {\"id\": ...}"}, 400)
        session = self._parts.registry.get(session_id)
        if session is None:
            return json_answer({"error": "no such session on this process"}, 404)
        await self._parts.end_session(session)
        await record(self._parts, admin, "end_session", f"{session_id} (token {session.identity.token_id})")
        return json_answer({"ended": session_id})

    async def upstreams(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        return json_answer(await upstreams_view(self._parts))

    async def approve_tool(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        store = self._parts.pins
        if store is None:
            return json_answer({"error": off("pins")["message"]}, 409)
        body = await json_body(request)
        target = body.get("target") if body else None
        if not isinstance(target, str) or "/" not in target:
            return json_answer({"error": "give the tool as {\"target\": \"UPSTREAM/TOOL\"}"}, 400)
        stamp = self._parts.gatekeeper.now()
        chosen = [pin for pin in await store.pins() if pin_rules.selected(pin, target=target)]
        approved = []
        for pin in chosen:
            _, after = await store.update(pin.upstream, pin.tool, lambda found: pin_rules.approve(found, stamp))
            if after is not None and after.approved_at == stamp:
                approved.append(f"{after.upstream}/{after.tool}")
        if not approved:
            return json_answer({"error": f"nothing pending for {target}"}, 409)
        await record(self._parts, admin, "approve_tool", target)
        return json_answer({"approved": approved})

    async def tokens(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        limits = self._parts.features.spend_limits
        return json_answer({"budgets": await budgets(self._parts),
                            "rate_refusals": rate_refusals(self._parts.metrics, RATE_REASONS),
                            "rate_limit": self._parts.settings.rate_limit,
                            "spend_limits": {"enabled": True, "rows": await limits.list()} if limits is not None
                            else off("spend_limits"),
                            "revocable": self._parts.settings.auth_mode in ("header", "oauth")})

    async def revoke(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        if self._parts.settings.auth_mode not in ("header", "oauth"):
            return json_answer({"error": "no token ids to revoke in this auth mode"}, 409)
        body = await json_body(request)
        token_id = body.get("token_id") if body else None
        if not isinstance(token_id, str) or not is_valid_token_id(token_id):
            return json_answer({"error": "give a token id as {\"token_id\": ...}"}, 400)
        await self._parts.stores.revocations.revoke(token_id)
        await record(self._parts, admin, "revoke", token_id)
        return json_answer({"revoked": token_id})

    async def approvals(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        held = self._parts.features.approvals
        if held is None:
            return json_answer(off("approvals"))
        return json_answer({"enabled": True, "held": await held.list()})

    async def approve_call(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        return await self._decide(request, admin, approve=True)

    async def deny_call(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        return await self._decide(request, admin, approve=False)

    async def _decide(self, request: web.Request, admin: Admin, *, approve: bool) -> web.StreamResponse:
        held = self._parts.features.approvals
        if held is None:
            return json_answer({"error": off("approvals")["message"]}, 409)
        body = await json_body(request)
        approval_id = body.get("id") if body else None
        if not isinstance(approval_id, str) or not approval_id:
            return json_answer({"error": "give the held call's id as {\"id\": ...}"}, 400)
        try:
            await (held.approve if approve else held.deny)(approval_id, by=admin.who, family=admin.family)
        except PermissionError as exc:
            return json_answer({"error": str(exc) or "an admin may not decide its own token's call"}, 403)
        except KeyError:
            return json_answer({"error": "no such held call"}, 404)
        except ValueError as exc:
            return json_answer({"error": str(exc)}, 409)
        await record(self._parts, admin, "approve_call" if approve else "deny_call", approval_id)
        return json_answer({"approved" if approve else "denied": approval_id})

    async def explain(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        body = await json_body(request)
        if body is None:
            return json_answer({"error": "a JSON object: {\"token\", \"tool\", \"args\"}"}, 400)
        status, answer = await explain_call(self._parts, body)
        return json_answer(answer, status)

    async def policy(self, request: web.Request, admin: Admin) -> web.StreamResponse:
        found: dict[str, Any] = policy_view(self._parts)
        audit = self._parts.features.audit
        if audit is None:
            found["audit"] = off("audit")
        else:
            filters = {k: v for k, v in request.query.items() if k in ("token_id", "tool", "decision", "action")}
            found["audit"] = {"enabled": True, "lines": await audit.tail(100, filters), "chain": await audit.verify()}
        pinned = await pins_or_none(self._parts)
        found["pins"] = None if pinned is None else [views.pin_row(pin) for pin in pinned]
        return json_answer(found)

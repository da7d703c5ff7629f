"""Every console handler runs inside ``secured``: the Host check, the security headers, and, for the API, the
admin check and (for a POST) the same-origin and CSRF checks. Per console handler, never a middleware: the
console adds nothing to a request for ``/mcp``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from satgate_mcp.console import access
from satgate_mcp.console.access import Denied
from satgate_mcp.console.gatekeeper import Admin, Gatekeeper
from satgate_mcp.settings import Settings
from satgate_mcp.transport.origins import check_host

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
AdminHandler = Callable[[web.Request, Admin], Awaitable[web.StreamResponse]]


def with_headers(response: web.StreamResponse) -> web.StreamResponse:
    for name, value in access.HEADERS.items():
        response.headers[name] = value
    return response


def json_answer(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def refusal(denied: Denied) -> web.Response:
    return json_answer({"error": denied.reason}, denied.status)


def secured(settings: Settings, handler: Handler) -> Handler:
    """The DNS-rebinding guard (a Host the gateway does not serve is refused) and the headers, on every answer."""

    async def run(request: web.Request) -> web.StreamResponse:
        host = check_host(request.headers.get("Host"), settings.allowed_hosts, settings.host)
        if host is not None:
            return with_headers(json_answer({"error": host.message}, host.status))
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            response = json_answer({"error": exc.reason}, exc.status)
        return with_headers(response)

    return run


def post_denied(request: web.Request, admin: Admin) -> Denied | None:
    """A state-changing request: from this console's own origin, and with the cookie's CSRF token (a bearer
    header is no ambient credential: a script holds it, a foreign page cannot send it without CORS)."""
    origin = request.headers.get("Origin")
    if admin.via in ("token", "secret"):
        if origin is None:
            return None
        return access.check_post(origin=origin, host_header=request.host, scheme=request.scheme,
                                 fetch_site=request.headers.get("Sec-Fetch-Site"))
    if admin.csrf is None:
        return access.BAD_CSRF
    crossed = access.check_post(origin=origin, host_header=request.host, scheme=request.scheme,
                                fetch_site=request.headers.get("Sec-Fetch-Site"))
    return crossed or access.check_csrf(admin.csrf, request.headers.get("X-CSRF-Token"))


def admin_only(gatekeeper: Gatekeeper, handler: AdminHandler) -> Handler:
    """The API: an admin (bearer header, cookie, or the open mode), and every POST from the console's origin."""

    async def run(request: web.Request) -> web.StreamResponse:
        admin = await gatekeeper.admin_of(request)
        if isinstance(admin, Denied):
            return refusal(admin)
        if request.method != "GET":
            denied = post_denied(request, admin)
            if denied is not None:
                log.warning("console_post_refused", reason=denied.reason, who=admin.who,
                            origin=request.headers.get("Origin"))
                return refusal(denied)
        return await handler(request, admin)

    return run


async def json_body(request: web.Request) -> dict[str, Any] | None:
    """The POSTed JSON object, or None (bad JSON, not an object): the handler answers 400."""
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None

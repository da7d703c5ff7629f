"""``GET /oauth/callback/<upstream>``: where an ``oauth_user`` upstream's authorization server sends the user back.

The browser brings ``code`` and ``state`` (or ``error``); the upstream's grants (upstream/user_grants.py) take the
state once, exchange the code and keep the grant, and the user reads a small page saying they can return to
their agent. Nothing else is shown: not the state, the code, the grant's owner, nor the server's own words. The
page is never cached and sends no referrer (its URL held the code).
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import structlog
from aiohttp import web

from satgate_mcp.errors import GatewayError
from satgate_mcp.upstream.user_grants import CALLBACK_PREFIX, CallbackRefused, UserGrants

log = structlog.get_logger("satgate_mcp.transport.oauth_callback")

HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'", "X-Frame-Options": "DENY"}
DONE = "Authorized. You can close this page and return to your agent."


def page(status: int, title: str, text: str) -> web.Response:
    body = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
            f"<body><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p></body></html>")
    return web.Response(status=status, text=body, content_type="text/html", headers=HEADERS)


def add_routes(app: web.Application, grants: Mapping[str, UserGrants]) -> None:
    async def callback(request: web.Request) -> web.Response:
        user = grants.get(request.match_info["upstream"])
        if user is None:
            return page(404, "Unknown upstream", "No upstream of this gateway is authorized here.")
        state = request.query.get("state", "")
        if not state or len(state) > 200:
            return page(400, "Authorization failed", "This link carries no authorization state.")
        try:
            await user.finish(state, request.query.get("code"), request.query.get("error"))
        except CallbackRefused as refused:
            return page(refused.status, "Authorization failed", refused.reason)
        except GatewayError as exc:  # the store is down, or the authorization server unreachable
            log.warning("upstream_authorization_unfinished", upstream=user.name, error=exc.message)
            return page(503, "Try again", "The gateway cannot complete this authorization right now; open the "
                        "link again in a moment.")
        return page(200, "Authorized", DONE)

    app.router.add_get(CALLBACK_PREFIX + "{upstream}", callback)

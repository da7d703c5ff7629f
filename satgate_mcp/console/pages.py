"""The console's page, its login and logout, and its two static files (CSS and our own small script).

The page is one HTML file; every figure on it comes from the JSON API. The login form posts the token in
its body (never a URL); an admin gets a sealed ``HttpOnly``, ``SameSite=Strict`` cookie scoped to
``/console``; anyone else gets the form again with why, and no cookie.
"""

from __future__ import annotations

import html
from importlib import resources

import structlog
from aiohttp import web

from satgate_mcp import events
from satgate_mcp.console import access
from satgate_mcp.console.access import Denied
from satgate_mcp.console.gatekeeper import Admin
from satgate_mcp.console.guard import post_denied, secured
from satgate_mcp.console.parts import Parts

log = structlog.get_logger(__name__)

#: Static files by name (nothing else under /console/static is served), with their content types.
ASSETS = {"console.css": "text/css", "console.js": "text/javascript"}
#: The login form is at most this big: a token, a field name, nothing else.
MAX_LOGIN_BYTES = 16 * 1024


def _read(name: str) -> str:
    return (resources.files("satgate_mcp.console") / "static" / name).read_text(encoding="utf-8")


OPEN_NOTICE = ('<p class="notice" role="status">Open console: SATGATE_AUTH_MODE=none on loopback with no '
               'SATGATE_CONSOLE_TOKEN, so anyone who can reach this port can use it (the same trust as /mcp '
               'here).</p>')


class Pages:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self._gate = parts.gatekeeper
        self._app_page = _read("console.html")
        self._login_page = _read("login.html")
        self._assets = {name: _read(name) for name in ASSETS}

    def add_routes(self, app: web.Application) -> None:
        settings = self._parts.settings
        app.router.add_get("/console", secured(settings, self.page))
        app.router.add_get("/console/", secured(settings, self.page))
        app.router.add_post("/console/login", secured(settings, self.login))
        app.router.add_post("/console/logout", secured(settings, self.logout))
        app.router.add_get("/console/static/{name}", secured(settings, self.asset))

    def _login(self, message: str = "", status: int = 200) -> web.Response:
        rules = self._gate.rules
        if rules.auth_mode == "config" and not rules.console_token:
            message = message or "No console login is set up: set SATGATE_CONSOLE_TOKEN (config mode)."
        what = {"header": "an admin token (satgate-mcp token mint --id ID --admin)",
                "oauth": f"an access token with the scope {rules.scope}"}.get(rules.auth_mode, "SATGATE_CONSOLE_TOKEN")
        body = self._login_page.replace("{{what}}", html.escape(what)).replace(
            "{{message}}", f'<p class="error" role="alert">{html.escape(message)}</p>' if message else "")
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    async def page(self, request: web.Request) -> web.StreamResponse:
        admin = await self._gate.admin_of(request)
        if isinstance(admin, Denied):
            return self._login()
        body = self._app_page.replace("{{notice}}", OPEN_NOTICE if admin.via == "open" else "")
        response = web.Response(text=body, content_type="text/html", charset="utf-8")
        if admin.via == "open" and admin.csrf is None:  # the open mode's CSRF token, for its page to act
            value, expires = self._gate.open_cookie()
            self._set_cookie(request, response, value, expires)
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        crossed = access.check_post(origin=request.headers.get("Origin"), host_header=request.host,
                                    scheme=request.scheme, fetch_site=request.headers.get("Sec-Fetch-Site"))
        if crossed is not None:
            return self._login(crossed.reason, crossed.status)
        if (request.content_length or 0) > MAX_LOGIN_BYTES:
            return self._login("The form is too large.", 413)
        form = await request.post()
        token = form.get("token")
        presented = token.strip() if isinstance(token, str) else ""
        found = await self._gate.check(presented) if presented else access.NOT_LOGGED_IN
        if isinstance(found, Denied):
            log.warning("console_login_refused", reason=found.reason, remote=request.remote)
            return self._login(found.reason, found.status)
        value, expires = self._gate.cookie_for(presented, found)
        response = web.Response(status=303, headers={"Location": "/console"})
        self._set_cookie(request, response, value, expires)
        await record(self._parts, found, "login", "console")
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        admin = await self._gate.admin_of(request)
        if isinstance(admin, Admin):
            denied = post_denied(request, admin)
            if denied is not None:
                return web.json_response({"error": denied.reason}, status=denied.status)
            await record(self._parts, admin, "logout", "console")
        response = web.Response(status=303, headers={"Location": "/console"})
        response.del_cookie(access.COOKIE_NAME, path=access.COOKIE_PATH)
        return response

    async def asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound(reason="no such file")
        return web.Response(text=self._assets[name], content_type=ASSETS[name], charset="utf-8")

    def _set_cookie(self, request: web.Request, response: web.StreamResponse, value: str, expires: float) -> None:
        max_age = max(1, int(expires - self._gate.now()))
        response.set_cookie(access.COOKIE_NAME, value, path=access.COOKIE_PATH, max_age=max_age, httponly=True,
                            samesite="Strict", secure=request.secure)


async def record(parts: Parts, admin: Admin, action: str, target: str) -> None:
    """Every console action: a log line and an event always, a line of the audit trail when it is on."""
    log.info("console_action", who=admin.who, via=admin.via, action=action, target=target)
    parts.publisher.publish(events.CONSOLE_ACTION, who=admin.who, action=action, target=target)
    if parts.features.audit is not None:
        await parts.features.audit.record(who=admin.who, action=action, target=target)

"""A real MCP upstream, on the official SDK over Streamable HTTP, that wants an OAuth bearer token on every request.

``python tests/identity_upstream.py --jwks-url URL --issuer ISS --audience AUD`` prints ``READY <url>`` once it
listens. Every HTTP request must carry a JWT the authorization server signed (its JWKS at ``--jwks-url``) for
``--audience``; anything else gets 401 before MCP sees it, except its RFC 9728 protected resource metadata
(``/.well-known/oauth-protected-resource/mcp``: ``--audience`` as the resource, ``--issuer`` its server). Tools:

- ``whoami``: the ``sub`` of the bearer token this very request carried;
- ``identity``: the ``X-Satgate-Identity`` header as received ("" without one), for the test to verify;
- ``sessions``: every ``Mcp-Session-Id`` seen with the subjects whose tokens came on it, and the 401s answered
  (``refused``; ``refused_posts`` those to POSTs);
- ``reject_my_token``: the bearer token of this request is refused from now on (the upstream revoked it);
- ``reject_me``: every token of this request's subject is refused from now on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from typing import Any

import jwt
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

JsonObj = dict[str, Any]
TOOLS = ("whoami", "identity", "sessions", "reject_my_token", "reject_me")


class Seen:
    def __init__(self) -> None:
        self.sessions: dict[str, set[str]] = defaultdict(set)
        self.refused = 0
        #: The refused POSTs alone (a listen stream's GET reconnecting with a refused token counts in ``refused``).
        self.refused_posts = 0
        self.rejected: set[str] = set()
        self.rejected_subjects: set[str] = set()


RESOURCE_METADATA_PATH = "/.well-known/oauth-protected-resource/mcp"


def bearer_guard(app: Any, jwks: jwt.PyJWKClient, issuer: str, audience: str, seen: Seen) -> Any:
    """The ASGI app behind a resource server's check: a valid token for this audience, or 401."""
    metadata = json.dumps({"resource": audience, "authorization_servers": [issuer],
                           "bearer_methods_supported": ["header"]}).encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        if scope.get("path") == RESOURCE_METADATA_PATH:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": metadata})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        try:
            key = await asyncio.to_thread(jwks.get_signing_key_from_jwt, token)
            claims = jwt.decode(token, key.key, algorithms=["RS256", "ES256", "EdDSA"], issuer=issuer,
                                audience=audience)
            if claims.get("jti") in seen.rejected or claims.get("sub") in seen.rejected_subjects:
                raise jwt.InvalidTokenError("revoked here")
        except jwt.PyJWTError:
            seen.refused += 1
            seen.refused_posts += scope.get("method") == "POST"
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer error="invalid_token"')]})
            await send({"type": "http.response.body", "body": b""})
            return
        if "mcp-session-id" in headers:
            seen.sessions[headers["mcp-session-id"]].add(str(claims.get("sub")))
        await app(scope, receive, send)

    return guarded


def _header(ctx: ServerRequestContext[Any], name: str) -> str:
    request = ctx.request
    found = request.headers.get(name) if request is not None and hasattr(request, "headers") else None
    return str(found or "")


def build_server(seen: Seen) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        schema: JsonObj = {"type": "object", "properties": {}}
        return types.ListToolsResult.model_validate({"tools": [{"name": t, "inputSchema": schema} for t in TOOLS]})

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "whoami":
            token = _header(ctx, "authorization").removeprefix("Bearer ")
            text = str(jwt.decode(token, options={"verify_signature": False}).get("sub"))  # verified by the guard
        elif params.name == "reject_my_token":
            token = _header(ctx, "authorization").removeprefix("Bearer ")
            seen.rejected.add(str(jwt.decode(token, options={"verify_signature": False}).get("jti")))
            text = "rejected"
        elif params.name == "reject_me":
            token = _header(ctx, "authorization").removeprefix("Bearer ")
            seen.rejected_subjects.add(str(jwt.decode(token, options={"verify_signature": False}).get("sub")))
            text = "rejected"
        elif params.name == "identity":
            text = _header(ctx, "x-satgate-identity")
        else:
            text = json.dumps({"sessions": {k: sorted(v) for k, v in seen.sessions.items()}, "refused": seen.refused,
                               "refused_posts": seen.refused_posts})
        return types.CallToolResult.model_validate({"content": [{"type": "text", "text": text}]})

    return Server("identity-upstream", on_list_tools=list_tools, on_call_tool=call_tool)


async def run(args: argparse.Namespace) -> None:
    import uvicorn

    seen = Seen()
    app = build_server(seen).streamable_http_app(host="127.0.0.1")
    guarded = bearer_guard(app, jwt.PyJWKClient(args.jwks_url), args.issuer, args.audience, seen)
    server = uvicorn.Server(uvicorn.Config(guarded, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving
            raise SystemExit("identity upstream failed to start")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"READY http://127.0.0.1:{port}/mcp", flush=True)
    await serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jwks-url", required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--audience", required=True)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

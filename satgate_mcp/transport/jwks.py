"""``/.well-known/jwks.json``: the public half of ``SATGATE_IDENTITY_KEY``, served when it is set.

Upstreams with ``"forward_identity": true`` verify the ``X-Satgate-Identity`` JWT against it with any JWT library.
"""

from __future__ import annotations

from aiohttp import web

from satgate_mcp.upstream.signing import JWKS_PATH, SigningKey, jwks

#: The key set changes only with the configuration (a restart): verifiers may keep it ten minutes.
CACHE_CONTROL = "public, max-age=600"


def add_routes(app: web.Application, key: SigningKey) -> None:
    document = jwks([key])

    async def serve(request: web.Request) -> web.Response:
        return web.json_response(document, headers={"Access-Control-Allow-Origin": "*",
                                                    "Cache-Control": CACHE_CONTROL})

    app.router.add_get(JWKS_PATH, serve)

"""RFC 9728 protected resource metadata, served when SATGATE_OAUTH_RESOURCE_METADATA_URL is set."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web

from satgate_mcp.jsonrpc import JsonObj

WELL_KNOWN = "/.well-known/oauth-protected-resource"


#: The document changes only with the configuration; clients and proxies may keep it an hour.
CACHE_CONTROL = "public, max-age=3600"


def resource_metadata(metadata_url: str, authorization_servers: list[str], mcp_path: str = "/mcp",
                      scopes: Iterable[str] = ()) -> JsonObj:
    """The resource is the metadata URL with the well-known segment removed (RFC 9728 section 3.1)."""
    parts = urlsplit(metadata_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    suffix = parts.path[len(WELL_KNOWN):] if parts.path.startswith(WELL_KNOWN) else ""
    document: JsonObj = {
        "resource": origin + (suffix or mcp_path),
        "authorization_servers": authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": "satgate-mcp",
    }
    if supported := sorted(set(scopes)):
        document["scopes_supported"] = supported
    return document


def add_routes(app: web.Application, metadata_url: str, authorization_servers: list[str],
               scopes: Iterable[str] = ()) -> None:
    document = resource_metadata(metadata_url, authorization_servers, scopes=scopes)

    async def serve(request: web.Request) -> web.Response:
        return web.json_response(document, headers={"Access-Control-Allow-Origin": "*",
                                                    "Cache-Control": CACHE_CONTROL})

    app.router.add_get(WELL_KNOWN, serve)
    app.router.add_get(WELL_KNOWN + "/mcp", serve)
    path = urlsplit(metadata_url).path
    if path not in (WELL_KNOWN, WELL_KNOWN + "/mcp"):
        app.router.add_get(path, serve)

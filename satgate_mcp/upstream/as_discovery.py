"""Where an ``oauth_user`` upstream's users authorize: the authorization server's endpoints, found once.

As configured when the spec names both endpoints; else from the issuer's RFC 8414 (or OpenID Connect) metadata,
the issuer being the spec's ``authorization_server`` or the first the upstream's RFC 9728 protected resource
metadata lists. The metadata must name the issuer it was fetched for (RFC 8414 section 3.3: a mix-up otherwise),
endpoints must be https (http on loopback only), and a server that lists PKCE methods must list ``S256``. The
reading is pure; ``discover`` only fetches.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from satgate_mcp.addresses import secure_url_problem
from satgate_mcp.errors import UpstreamAuthFailed
from satgate_mcp.settings import resource_metadata_url_for
from satgate_mcp.upstream_auth_spec import OAuthUserSpec

RFC8414_WELL_KNOWN = "/.well-known/oauth-authorization-server"
OIDC_WELL_KNOWN = "/.well-known/openid-configuration"
MAX_DOCUMENT = 256 * 1024


class DiscoveryProblem(Exception):
    """What is wrong with a metadata document, in words for the operator's log."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    authorization_endpoint: str
    token_endpoint: str
    #: RFC 8707 resource indicator the grant is for.
    resource: str


def server_metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 inserts its well-known segment before the issuer's path; OpenID Connect appends its own."""
    parts = urlsplit(issuer)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
    return [origin + RFC8414_WELL_KNOWN + path, origin + path + OIDC_WELL_KNOWN]


def read_resource_metadata(document: Any) -> tuple[str, str | None]:
    """RFC 9728: (the first authorization server, the ``resource`` it names)."""
    if not isinstance(document, dict):
        raise DiscoveryProblem("the protected resource metadata is not a JSON object")
    servers = document.get("authorization_servers")
    if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
        raise DiscoveryProblem("the protected resource metadata lists no authorization_servers")
    if problem := secure_url_problem(servers[0]):
        raise DiscoveryProblem(f"its authorization server {servers[0][:100]!r} {problem}")
    resource = document.get("resource")
    return servers[0], resource if isinstance(resource, str) and resource else None


def read_server_metadata(document: Any, issuer: str) -> tuple[str, str]:
    """RFC 8414: (authorization endpoint, token endpoint), for exactly this issuer."""
    if not isinstance(document, dict):
        raise DiscoveryProblem("the authorization server metadata is not a JSON object")
    if document.get("issuer") != issuer:
        raise DiscoveryProblem(f"the metadata names issuer {str(document.get('issuer'))[:100]!r}, not {issuer!r}")
    found = []
    for name in ("authorization_endpoint", "token_endpoint"):
        value = document.get(name)
        if not isinstance(value, str) or not value:
            raise DiscoveryProblem(f"the metadata has no {name}")
        if problem := secure_url_problem(value):
            raise DiscoveryProblem(f"its {name} {problem}")
        found.append(value)
    methods = document.get("code_challenge_methods_supported")
    if isinstance(methods, list) and "S256" not in methods:
        raise DiscoveryProblem("the server does not support PKCE with S256")
    return found[0], found[1]


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any | None:
    """The document at ``url``, None when it is not there (any status but 200)."""
    async with session.get(url, headers={"Accept": "application/json"}, allow_redirects=False) as resp:
        if resp.status != 200:
            return None
        body = await resp.content.read(MAX_DOCUMENT + 1)
    try:
        return json.loads(body[:MAX_DOCUMENT])
    except ValueError:
        raise DiscoveryProblem(f"{url} is not JSON") from None


async def _first(session: aiohttp.ClientSession, urls: list[str]) -> Any:
    for url in urls:
        document = await _get_json(session, url)
        if document is not None:
            return document
    raise DiscoveryProblem(f"nothing at {' or '.join(urls)}")


async def discover(upstream: str, spec: OAuthUserSpec, upstream_url: str, *, timeout: float,
                   session: Callable[[], aiohttp.ClientSession]) -> Endpoints:
    """The endpoints and resource of ``upstream``'s grants; UpstreamAuthFailed (``discovery_failed``) if unknown."""
    resource = spec.resource
    try:
        async with asyncio.timeout(timeout):
            if spec.authorization_endpoint is not None and spec.token_endpoint is not None:
                return Endpoints(spec.authorization_endpoint, spec.token_endpoint, resource or upstream_url)
            issuer = spec.authorization_server
            if issuer is None:
                metadata_url = resource_metadata_url_for([upstream_url])
                if metadata_url is None:
                    raise DiscoveryProblem("the upstream's URL is not https (nor http on loopback)")
                issuer, named = read_resource_metadata(await _first(session(), [metadata_url]))
                resource = resource or named
            authorize, token = read_server_metadata(await _first(session(), server_metadata_urls(issuer)), issuer)
    except TimeoutError:
        raise UpstreamAuthFailed(upstream, "temporarily_unavailable", f"upstream {upstream!r}: its authorization "
                                 f"server's metadata did not come within {timeout:g}s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamAuthFailed(upstream, "temporarily_unavailable", f"upstream {upstream!r}: its authorization "
                                 f"server's metadata cannot be fetched ({type(exc).__name__})") from None
    except DiscoveryProblem as exc:
        raise UpstreamAuthFailed(upstream, "discovery_failed", f"upstream {upstream!r}: where its users "
                                 f"authorize is unknown: {exc}") from None
    return Endpoints(authorize, token, resource or upstream_url)

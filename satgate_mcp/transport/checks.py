"""What every request meets before anything knows about sessions or calls: Host/Origin, body size, credential.

Each step answers a value or a ``Refusal``, and the transport answers the first refusal. The credential is
verified in ``RequestChecks.principal`` only, for every transport (2025 sessions, 2026-07-28 stateless
requests, the legacy /sse): one place counts and publishes authentication failures.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from aiohttp import web

from satgate_mcp import events, jsonrpc
from satgate_mcp.addresses import is_loopback_host
from satgate_mcp.auth.base import Authenticator, Identity, bearer_from_header
from satgate_mcp.events import Publisher
from satgate_mcp.keys import CLOSE_CONNECTION, TOKEN_ID
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import Settings
from satgate_mcp.transport import origins, rules
from satgate_mcp.transport.rules import Refusal
from satgate_mcp.upstream.credential import CREDENTIAL, LOOPBACK_BASE, CallerCredential
from satgate_mcp.upstream_auth_spec import per_caller

#: Distinct (Host, Origin) pairs whose verdict is kept: a client chooses them, so the cache is bounded.
HOST_ORIGIN_CACHE = 256


def host_origin_refusal(request: web.Request, settings: Settings) -> Refusal | None:
    """The DNS-rebinding guard every browser-reachable endpoint shares (/mcp, /sse, /readyz, /metrics)."""
    return _host_origin_verdict(settings, request.headers.get("Host"), request.headers.get("Origin"))


def _host_origin_verdict(settings: Settings, host: str | None, origin: str | None) -> Refusal | None:
    return (origins.check_host(host, settings.allowed_hosts, settings.host)
            or origins.check_origin(origin, settings.allowed_origins))


@dataclass(frozen=True, slots=True)
class Principal:
    """A verified credential: the bearer as presented (only ever hashed) and what it says."""

    token: str
    identity: Identity

    @property
    def quota_key(self) -> str:
        return self.identity.family_id


class RequestChecks:
    def __init__(self, *, settings: Settings, authenticator: Authenticator, publisher: Publisher,
                 metrics: Metrics) -> None:
        self._settings = settings
        self._auth = authenticator
        self._publisher = publisher
        self._metrics = metrics
        #: The authenticator's mode: whether tokens tell clients apart (not in ``none``), and which verify alone.
        self.auth_mode = authenticator.mode
        #: What a modern client may share a cached answer with: nobody once tokens decide what is seen.
        self.cache_scope = "public" if authenticator.mode == "none" else "private"
        # The guard is a pure function of the two headers and the settings, and parses an IP address per
        # request: decided once per pair of values.
        self._host_origin = functools.lru_cache(maxsize=HOST_ORIGIN_CACHE)(partial(_host_origin_verdict, settings))
        #: Whether an upstream's auth is per caller: only then does a request carry its credential to upstreams.
        self._carries_credential = any(per_caller(getattr(spec, "auth", None)) for spec in settings.upstreams.values())

    def check_host_origin(self, request: web.Request) -> Refusal | None:
        headers = request.headers
        return self._host_origin(headers.get("Host"), headers.get("Origin"))

    async def read_body(self, request: web.Request) -> bytes | Refusal:
        """The body, or 413 once it passes the limit (we never buffer more than limit + one chunk), or 408 when
        it does not arrive within ``SATGATE_READ_TIMEOUT``: a body trickled byte by byte holds nothing for long."""
        limit = self._settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return rules.body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._settings.read_timeout):
                async for chunk in request.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > limit:
                        return rules.body_too_large(limit)
                    chunks.append(chunk)
        except TimeoutError:
            request[CLOSE_CONNECTION] = True  # the rest of the body would be waited for on a kept-alive connection
            return rules.read_timeout(self._settings.read_timeout)
        return b"".join(chunks)

    async def principal(self, request: web.Request) -> Principal | Refusal:
        """The one place a credential is verified."""
        authorization = request.headers.get("Authorization")
        result = await self._auth.authenticate(authorization)
        if result.ok and result.identity is not None:
            identity = result.identity
            request[TOKEN_ID] = identity.token_id
            if not self._carries_credential:
                return Principal(result.token, identity)
            # The handler's context from here on: an upstream whose auth is per caller finds the bearer there
            # (``result.token`` is what a session binds to, in OAuth mode not the bearer itself).
            CREDENTIAL.set(CallerCredential(bearer_from_header(authorization) or "", identity.token_id,
                                            identity.subject or identity.token_id, identity.tenant))
            if (host := request.url.host) is not None and is_loopback_host(host):
                LOOPBACK_BASE.set(f"{request.scheme}://{request.host}")  # where a user comes back to, on loopback
            return Principal(result.token, identity)
        self._metrics.refusals.labels(reason=str(result.outcome)).inc()
        # A revoked or expired token verified its signature: its id is the holder's, and worth logging.
        named: dict[str, str] = {"token_id": result.identity.token_id} if result.identity is not None else {}
        if result.hint:  # what the operator can fix (a root key mismatch); the client's answer stays the same
            named["hint"] = result.hint
        self._publisher.publish(events.AUTH_FAILURE, outcome=str(result.outcome), reason=result.reason,
                                path=request.path, remote=request.remote, **named)
        return rules.auth_refusal(result.outcome, self._settings.oauth_resource_metadata_url)

    def scope_refusal(self, principal: Principal, requests: Sequence[jsonrpc.Request]) -> Refusal | None:
        refusal = rules.scope_refusal(principal.identity, requests, self._settings.oauth_resource_metadata_url)
        if refusal is not None:
            self._metrics.refusals.labels(reason="insufficient_scope").inc()
            self._publisher.publish(events.NOT_ALLOWED, token_id=principal.identity.token_id, method="tools/call",
                                    kind="scope", scope=refusal.extra.get("scope"))
        return refusal

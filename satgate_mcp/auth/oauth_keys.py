"""The issuer's keys for OAuth mode: discovered from its metadata, fetched, cached and refreshed.

Key rotation: keys are fetched on first use and kept ``KEYS_MAX_AGE`` seconds; a token naming an
unknown ``kid`` refetches at once (at most once per ``REFETCH_INTERVAL``), and an unknown ``kid`` is
never remembered as absent, so a key published a moment later is found by the next token. Apart from
the verification (oauth.py) because it is I/O: what a verified token means does not depend on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt
import structlog
from aiohttp import ClientError, ClientSession, ClientTimeout

from satgate_mcp.addresses import secure_url_problem

#: Asymmetric signatures only: ``none`` and HMAC would let anyone holding the public key sign.
ALLOWED_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                "ES256", "ES384", "ES512", "EdDSA"})
KEYS_MAX_AGE = 300.0
REFETCH_INTERVAL = 2.0
FETCH_TIMEOUT_SECONDS = 5.0
MAX_DOCUMENT_BYTES = 1024 * 1024
RFC8414_WELL_KNOWN = "/.well-known/oauth-authorization-server"
OIDC_WELL_KNOWN = "/.well-known/openid-configuration"

_log = structlog.get_logger("satgate_mcp.auth.oauth")


class DiscoveryError(Exception):
    """The issuer's metadata or keys could not be had; the token is refused, the gateway goes on."""


def discovery_urls(issuer: str) -> list[str]:
    """RFC 8414 inserts its well-known segment before the issuer's path; OpenID Connect appends its own."""
    parts = urlsplit(issuer)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
    return [origin + RFC8414_WELL_KNOWN + path, origin + path + OIDC_WELL_KNOWN]



_FAMILIES = {"RSA": ("RS", "PS"), "EC": ("ES",), "OKP": ("EdDSA",)}


@dataclass(frozen=True, slots=True)
class PublishedKey:
    key: jwt.PyJWK
    #: The ``alg`` the JWK itself declares: a token must then use exactly that one.
    alg: str | None

    def verifies(self, alg: str) -> bool:
        if self.alg is not None:
            return alg == self.alg
        family = _FAMILIES.get(self.key.key_type or "", ())
        return bool(family) and alg.startswith(family)


@dataclass
class _KeySet:
    keys: dict[str, PublishedKey]
    #: Keys without a ``kid``: usable only when exactly one fits the token's algorithm.
    anonymous: list[PublishedKey]
    fetched_at: float


def parse_jwks(document: Any, now: float) -> _KeySet:
    """The usable signing keys of a JWKS; a key of a type or algorithm we do not take is skipped."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise DiscoveryError("the JWKS is not an object with a 'keys' list")
    keys: dict[str, PublishedKey] = {}
    anonymous: list[PublishedKey] = []
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        alg = entry.get("alg")
        if alg is not None and alg not in ALLOWED_ALGORITHMS:
            continue
        if entry.get("kty") == "oct":  # a symmetric key has no place in a public key set
            continue
        try:
            key = PublishedKey(jwt.PyJWK(entry), alg if isinstance(alg, str) else None)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError, KeyError):
            continue
        kid = entry.get("kid")
        if isinstance(kid, str) and kid:
            keys[kid] = key
        else:
            anonymous.append(key)
    return _KeySet(keys, anonymous, now)


class KeySource:
    """The issuer's keys: discovered, fetched, cached, refetched on an unknown ``kid`` (bounded)."""

    def __init__(self, issuer: str, jwks_url: str | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 session_factory: Callable[[], ClientSession] | None = None) -> None:
        self._issuer = issuer
        self._jwks_url = jwks_url
        self._clock = clock
        self._session_factory = session_factory or (
            lambda: ClientSession(timeout=ClientTimeout(total=FETCH_TIMEOUT_SECONDS)))
        self._session: ClientSession | None = None
        self._keys: _KeySet | None = None
        self._last_fetch = float("-inf")
        self._last_refetch = float("-inf")
        self._task: asyncio.Task[None] | None = None

    async def key_for(self, kid: str | None, alg: str) -> PublishedKey | None:
        """The published key for this token, or None when the issuer has none (after one refetch if due)."""
        now = self._clock()
        waited = False
        if self._keys is None:
            waited = await self._fetch(self._start_fetch(now, since=self._last_fetch))  # nothing to verify with yet
        elif now - self._keys.fetched_at >= KEYS_MAX_AGE:
            self._start_fetch(now, since=self._last_fetch)  # in the background: the keys held verify meanwhile
        found = self._lookup(kid, alg)
        if found is None and not waited:
            # A rotation: the new key may be published already. Bounded on its own clock, so tokens naming
            # made-up key ids cannot make the gateway hammer the issuer.
            task = self._start_fetch(now, since=self._last_refetch)
            if task is not None:
                self._last_refetch = now
            await self._fetch(task)
            found = self._lookup(kid, alg)
        return found

    def _lookup(self, kid: str | None, alg: str) -> PublishedKey | None:
        if self._keys is None:
            return None
        if kid is not None:
            return self._keys.keys.get(kid)
        fitting = [k for k in [*self._keys.keys.values(), *self._keys.anonymous] if k.verifies(alg)]
        return fitting[0] if len(fitting) == 1 else None

    def _start_fetch(self, now: float, *, since: float) -> asyncio.Task[None] | None:
        """The fetch in progress, or a new one unless ``since`` (the last of its kind) is under
        ``REFETCH_INTERVAL`` ago."""
        if self._task is not None and not self._task.done():
            return self._task
        if now - since < REFETCH_INTERVAL:
            return None
        self._last_fetch = now
        self._task = asyncio.ensure_future(self._fetch_keys())
        return self._task

    @staticmethod
    async def _fetch(task: asyncio.Task[None] | None) -> bool:
        """Wait for ``task`` (a caller that gives up does not cancel the others' fetch); whether there was one."""
        if task is None:
            return False
        await asyncio.shield(task)
        return True

    async def _fetch_keys(self) -> None:
        """Keys already held survive a failed fetch: an issuer outage must not turn every token away."""
        try:
            document = await self._get_json(await self._jwks_location())
            self._keys = parse_jwks(document, self._clock())
            _log.info("oauth_keys_fetched", issuer=self._issuer, keys=len(self._keys.keys) + len(self._keys.anonymous))
        except DiscoveryError as exc:
            _log.warning("oauth_keys_unavailable", issuer=self._issuer, error=str(exc),
                         keeping=0 if self._keys is None else len(self._keys.keys) + len(self._keys.anonymous))
        except Exception:
            _log.exception("oauth_keys_failed", issuer=self._issuer)

    async def _jwks_location(self) -> str:
        if self._jwks_url is None:
            self._jwks_url = await self._discover()
        return self._jwks_url

    async def _discover(self) -> str:
        problems = []
        for url in discovery_urls(self._issuer):
            try:
                metadata = await self._get_json(url)
            except DiscoveryError as exc:
                problems.append(str(exc))
                continue
            if not isinstance(metadata, dict) or metadata.get("issuer") != self._issuer:
                problems.append(f"{url}: its issuer is not {self._issuer}")
                continue  # a mix-up: another issuer's document must not name our keys
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str) or secure_url_problem(jwks_uri):
                problems.append(f"{url}: no usable jwks_uri")
                continue
            return jwks_uri
        raise DiscoveryError("; ".join(problems))

    async def _get_json(self, url: str) -> Any:
        if self._session is None:
            self._session = self._session_factory()
        try:
            async with self._session.get(url, allow_redirects=False, headers={"Accept": "application/json"}) as resp:
                if resp.status != 200:
                    raise DiscoveryError(f"{url}: HTTP {resp.status}")
                body = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
        except (ClientError, TimeoutError) as exc:
            raise DiscoveryError(f"{url}: {type(exc).__name__}") from None
        if len(body) > MAX_DOCUMENT_BYTES:
            raise DiscoveryError(f"{url}: larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError:
            raise DiscoveryError(f"{url}: not JSON") from None

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()
            self._session = None

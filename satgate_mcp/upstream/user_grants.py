"""An ``oauth_user`` upstream's grants: each caller's own, asked for once, kept sealed, refreshed as needed.

- ``begin``: a caller without a grant gets an authorization URL (authorization code with PKCE S256 and the RFC 8707
  ``resource``); its ``state`` is kept in the state store bound to the caller (token id, or OAuth subject) and this
  upstream, single use, for ten minutes, with the PKCE verifier sealed beside it, so any gateway process can finish.
- ``finish``: the callback's code, exchanged with that verifier; the refresh token is sealed (credential_box.py,
  bound to owner and upstream) and stored, replacing any earlier grant; the access token is cached here.
- ``access_token``: the caller's stored grant, read on every call (so a revocation anywhere counts at once), and
  an access token for it from the cache, refreshed by one request at a time; a grant the authorization server
  refuses (``invalid_grant``) or that no longer opens is forgotten, and the caller is asked again.

The decisions (the URL, the PKCE pair, whose grant serves a call) are the small functions at the top.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar
from urllib.parse import quote, urlencode

import aiohttp
import structlog

from satgate_mcp import events
from satgate_mcp.errors import GatewayError, UpstreamAuthFailed, store_unavailable
from satgate_mcp.events import Publisher
from satgate_mcp.oauth_grants import (
    STATE_TTL_SECONDS,
    GrantStore,
    PendingAuthorization,
    StoredGrant,
    callback_refusal,
    new_grant_id,
    new_state,
)
from satgate_mcp.upstream.as_discovery import Endpoints, discover
from satgate_mcp.upstream.credential import CallerCredential
from satgate_mcp.upstream.credential_box import CredentialBox, Unreadable
from satgate_mcp.upstream.token_client import IssuedToken, TokenClient
from satgate_mcp.upstream_auth_spec import OAuthUserSpec

log = structlog.get_logger("satgate_mcp.upstream")
T = TypeVar("T")

#: Where the authorization server sends the user's browser back, under the gateway's public URL.
CALLBACK_PREFIX = "/oauth/callback/"
#: How often a call waiting for its user's authorization looks for a grant another process stored.
POLL_SECONDS = 0.5


class AuthorizationNeeded(Exception):
    """This caller has no usable grant for this upstream: the user must authorize (again)."""


class CallbackRefused(Exception):
    """A callback that may not complete; ``reason`` is shown to the browser, ``status`` its HTTP status."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class Started:
    """An authorization URL for one caller, and the id its elicitation carries (not the state itself)."""

    url: str
    elicitation_id: str


def owner_of(caller: CallerCredential) -> str:
    """Whose grant a call uses: the OAuth subject, or in header mode the token id (what ``subject`` holds then)."""
    return caller.subject


def catalogue_credential(subject: str) -> CallerCredential:
    """The spec's ``catalogue_subject`` as a caller: no token of its own (nothing is exchanged or forwarded), only
    the owner whose grant lists the tools, and whom ``credentials authorize`` asks to authorize."""
    return CallerCredential(token="", token_id=subject, subject=subject)


def pkce_pair() -> tuple[str, str]:
    """RFC 7636: a 256-bit verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(32)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def callback_url(base: str, upstream: str) -> str:
    return base.rstrip("/") + CALLBACK_PREFIX + quote(upstream, safe="")


def authorize_url(endpoints: Endpoints, spec: OAuthUserSpec, *, redirect_uri: str, state: str,
                  challenge: str) -> str:
    """The URL the user opens: RFC 6749 section 4.1.1 with PKCE (S256) and the RFC 8707 resource."""
    query = {"response_type": "code", "client_id": spec.client_id, "redirect_uri": redirect_uri, "state": state,
             "code_challenge": challenge, "code_challenge_method": "S256", "resource": endpoints.resource}
    if spec.scope:
        query["scope"] = spec.scope
    joiner = "&" if "?" in endpoints.authorization_endpoint else "?"
    return endpoints.authorization_endpoint + joiner + urlencode(query)


def elicitation_id(state: str) -> str:
    """What the client sees as the elicitation's id: derived from the state, and not enough to complete it."""
    return hashlib.sha256(b"satgate-mcp elicitation\0" + state.encode("ascii")).hexdigest()[:32]


REFUSALS = {"unknown": "This authorization link is unknown or was already used. Ask your agent to try again.",
            "expired": "This authorization link has expired. Ask your agent to try again.",
            "other_upstream": "This authorization link belongs to another upstream."}


class UserGrants:
    """One ``oauth_user`` upstream's users' grants over the state store; ``cache`` holds access tokens by
    (owner, upstream, scope), each bound to the grant it came from."""

    def __init__(self, name: str, spec: OAuthUserSpec, upstream_url: str, client: TokenClient, store: GrantStore,
                 box: CredentialBox, *, timeout: float, session: Callable[[], aiohttp.ClientSession],
                 store_timeout: float | None = None, clock: Callable[[], float] = time.time,
                 publisher: Publisher | None = None) -> None:
        self.name = name
        self._publisher = publisher
        self.spec = spec
        self._url = upstream_url
        self.client = client
        self.store = store
        self._box = box
        self._timeout = timeout
        self._session = session
        self._store_timeout = store_timeout
        self._clock = clock
        self._endpoints: Endpoints | None = None
        self._discovery = asyncio.Lock()
        #: Told of each grant a callback in this process completes (owner, grant id, the tokens): the token cache.
        self.on_granted: Callable[[str, str, IssuedToken], None] | None = None
        #: Calls of this process waiting for an owner's authorization, woken when its callback lands here.
        self._landed: dict[str, tuple[asyncio.Event, int]] = {}

    def _published(self, outcome: str, subject: str | None, **fields: str | None) -> None:
        if self._publisher is not None:
            self._publisher.publish(events.UPSTREAM_AUTHORIZATION, upstream=self.name, subject=subject,
                                    outcome=outcome, **fields)
        else:
            log.info(events.UPSTREAM_AUTHORIZATION, upstream=self.name, subject=subject, outcome=outcome, **fields)

    async def endpoints(self) -> Endpoints:
        """Found once (configured, or discovered); a failed discovery is tried again by the next call."""
        if self._endpoints is None:
            async with self._discovery:
                if self._endpoints is None:
                    found = await discover(self.name, self.spec, self._url, timeout=self._timeout,
                                           session=self._session)
                    self.client.token_endpoint = found.token_endpoint
                    self._endpoints = found
        return self._endpoints

    async def own_token(self) -> IssuedToken:
        """The gateway's own token (its listings): client credentials at the same authorization server."""
        endpoints = await self.endpoints()
        return await self.client.client_credentials(endpoints.resource)

    async def _bounded(self, operation: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._store_timeout):
                return await operation
        except Exception as exc:
            log.warning("grant_store_failed", upstream=self.name, error=f"{type(exc).__name__}: {exc}"[:300])
            raise store_unavailable() from None

    async def begin(self, caller: CallerCredential, base: str) -> Started:
        """A new authorization for ``caller``: its URL (the state kept in the store for any process to finish)."""
        endpoints = await self.endpoints()
        state, (verifier, challenge) = new_state(), pkce_pair()
        redirect_uri, now, owner = callback_url(base, self.name), self._clock(), owner_of(caller)
        sealed = self._box.seal(verifier, purpose="pkce_verifier", owner=owner, upstream=f"{self.name}\0{state}")
        pending = PendingAuthorization(state, owner, self.name, sealed, redirect_uri, now, now + STATE_TTL_SECONDS)
        if not await self._bounded(self.store.begin(pending, now)):
            raise GatewayError(f"upstream {self.name!r}: this caller already has too many authorizations waiting; "
                               "complete one, or try again once they expire",
                               {"error": "upstream_authorization_pending", "upstream": self.name}, code=-32001)
        url = authorize_url(endpoints, self.spec, redirect_uri=redirect_uri, state=state, challenge=challenge)
        self._published("started", owner)
        return Started(url, elicitation_id(state))

    async def finish(self, state: str, code: str | None, error: str | None) -> str:
        """The callback: take the state (once), exchange the code, keep the grant; the owner it was for."""
        pending = await self._bounded(self.store.take(state, self._clock()))
        refusal = callback_refusal(pending, self.name, self._clock())
        if refusal is not None or pending is None:
            self._published("refused", pending.owner if pending is not None else None, reason=refusal)
            raise CallbackRefused(REFUSALS[refusal or "unknown"])
        if error is not None or not code:
            raise CallbackRefused("The authorization was not granted. Ask your agent to try again if you want to.")
        try:
            verifier = self._box.open(pending.verifier, purpose="pkce_verifier", owner=pending.owner,
                                      upstream=f"{self.name}\0{state}")
        except Unreadable:
            raise CallbackRefused("This authorization link can no longer be completed.") from None
        endpoints = await self.endpoints()
        try:
            issued = await self.client.authorization_code(code, verifier, pending.redirect_uri, endpoints.resource)
        except UpstreamAuthFailed as exc:
            raise CallbackRefused(f"The authorization server refused the code ({exc.oauth_error}).", 502) from None
        if issued.refresh_token is None:
            raise CallbackRefused("The authorization server gave no refresh token: the gateway cannot keep this "
                                  "grant (ask its operator to allow offline access for this client).", 502)
        now = self._clock()
        grant = StoredGrant(pending.owner, self.name, new_grant_id(), self._seal(issued, pending.owner), now, now,
                            issued.scope)
        await self._bounded(self.store.put(grant))
        if self.on_granted is not None:
            self.on_granted(pending.owner, grant.grant_id, issued)
        if (waiting := self._landed.get(pending.owner)) is not None:
            waiting[0].set()
        self._published("granted", pending.owner)
        return pending.owner

    def _seal(self, issued: IssuedToken, owner: str) -> str:
        assert issued.refresh_token is not None
        return self._box.seal(issued.refresh_token, purpose="refresh_token", owner=owner, upstream=self.name)

    async def grant_of(self, caller: CallerCredential) -> StoredGrant | None:
        return await self._bounded(self.store.get(owner_of(caller), self.name))

    async def access_token(self, caller: CallerCredential, get: Callable[..., Awaitable[str]]) -> str:
        """The caller's access token, through ``get`` (the token cache's): AuthorizationNeeded without a grant."""
        grant = await self.grant_of(caller)
        if grant is None:
            raise AuthorizationNeeded(self.name)
        return await get(grant.grant_id.encode("ascii"), partial(self._refreshed, grant))

    async def _refreshed(self, grant: StoredGrant) -> IssuedToken:
        """A fresh access token for ``grant``; a rotated refresh token is written back onto that very grant."""
        try:
            refresh = self._box.open(grant.sealed, purpose="refresh_token", owner=grant.owner, upstream=self.name)
        except Unreadable as exc:
            self._published("forgotten", grant.owner, reason=f"unreadable: {exc}")
            await self._bounded(self.store.drop(grant.owner, self.name, grant.grant_id))
            raise AuthorizationNeeded(self.name) from None
        endpoints = await self.endpoints()
        try:
            issued = await self.client.refresh(refresh, endpoints.resource)
        except UpstreamAuthFailed as exc:
            if exc.oauth_error != "invalid_grant":
                raise
            self._published("forgotten", grant.owner, reason="refused by the authorization server")
            await self._bounded(self.store.drop(grant.owner, self.name, grant.grant_id))
            raise AuthorizationNeeded(self.name) from None
        if issued.refresh_token is not None and issued.refresh_token != refresh:
            rotated = replace(grant, sealed=self._seal(issued, grant.owner), refreshed_at=self._clock())
            await self._bounded(self.store.update(rotated))
        return issued

    async def wait(self, caller: CallerCredential, seconds: float) -> bool:
        """Until the caller's grant is there (True) or ``seconds`` pass: woken by a callback landing in this
        process, and looking at the store for one another process took."""
        owner = owner_of(caller)
        event, waiting = self._landed.get(owner, (asyncio.Event(), 0))
        self._landed[owner] = (event, waiting + 1)
        deadline = time.monotonic() + seconds
        try:
            while True:
                event.clear()
                if await self.grant_of(caller) is not None:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    async with asyncio.timeout(min(POLL_SECONDS, left)):
                        await event.wait()
                except TimeoutError:
                    pass
        finally:
            current, count = self._landed.get(owner, (None, 0))
            if current is event:
                if count <= 1:
                    del self._landed[owner]
                else:
                    self._landed[owner] = (event, count - 1)

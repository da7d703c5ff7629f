"""An HTTP upstream with ``"auth"``: each request carries the credential its caller earns (identity.py).

The connection itself is http.py's; this subclass only answers ``_configured_headers`` per call, turns an
upstream's 401 into a retry with a fresh token (once), and builds its 2026-07-28 twin the same way.

Where the auth is per caller (token exchange, a forwarded identity), the pool wraps these in an
``IsolatedUpstream`` with ``"isolation": "token"``: one connection, so one upstream ``Mcp-Session-Id``, per
gateway token id, capped by ``"max_instances"`` and reaped when idle like a stdio child; the catalogue
connection lists tools as the gateway itself (client credentials) and never carries a caller's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar

import aiohttp

from satgate_mcp.errors import UpstreamAuthFailed, UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.upstream.authorize_call import authorize
from satgate_mcp.upstream.base import NotificationCallback, ProgressCallback
from satgate_mcp.upstream.credential import CREDENTIAL, LOOPBACK_BASE, CallerCredential
from satgate_mcp.upstream.credential_box import CredentialBox
from satgate_mcp.upstream.http import HttpUpstream
from satgate_mcp.upstream.identity import RevocationCheck, UpstreamAuth, UpstreamIdentity, refresh_in
from satgate_mcp.upstream.isolated import CATALOGUE_METHODS, IsolatedUpstream
from satgate_mcp.upstream.signing import IDENTITY_HEADER
from satgate_mcp.upstream.token_client import TokenClient
from satgate_mcp.upstream.user_grants import AuthorizationNeeded, UserGrants
from satgate_mcp.upstream_auth_spec import OAuthUserSpec, per_caller

#: The credential headers of the call running in this context. A holder emptied when the call ends: a task the
#: call started (a listen stream) copies the holder, not the headers, and falls back to the connection's own.
_CALL_HEADERS: ContextVar[list[dict[str, str]] | None] = ContextVar("satgate_upstream_call_headers", default=None)
_CREDENTIAL_HEADERS = frozenset({"authorization", IDENTITY_HEADER.lower()})


def merged_headers(configured: Mapping[str, str], credential: Mapping[str, str]) -> dict[str, str]:
    """The operator's headers with the credential's in place of any of the same name."""
    return {**{k: v for k, v in configured.items() if k.lower() not in _CREDENTIAL_HEADERS}, **credential}


class CredentialsRefused(UpstreamUnavailable):
    """The upstream answered 401 to the token sent: nothing ran there."""


class TokenSession:
    """One client session for an upstream's token requests, opened on first use (inside the running loop)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def __call__(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class AuthorizedHttpUpstream(HttpUpstream):
    """``callers``: a call's own credential is used (a per-caller connection); else the gateway's alone."""

    def __init__(self, name: str, spec: HttpUpstreamSpec, *, auth: UpstreamAuth, owner: CallerCredential | None,
                 callers: bool, publisher: Publisher, metrics: Metrics,
                 client_session_factory: Callable[[], aiohttp.ClientSession] | None = None,
                 listen: bool = True, token_session: TokenSession | None = None) -> None:
        """A per-caller connection connects on its owner's first call (in that call, with that caller's token), not
        in the background; ``token_session`` is closed with it (the shared connection owns its token client's)."""
        super().__init__(name, spec, publisher=publisher, metrics=metrics,
                         client_session_factory=client_session_factory, listen=listen)
        self.auth = auth
        self._auth = auth
        self._owner = owner if callers else None
        self._callers = callers
        self._lazy = callers
        self._token_session = token_session
        self._refresher: asyncio.Task[None] | None = None
        #: What requests outside any call carry (the handshake in the background, the listen stream, DELETE).
        self._background: dict[str, str] = {}
        self._started = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return None

    def _reconnect(self) -> None:
        if self._lazy:  # the first time, from start(): wait_ready connects, in the owner's call
            self._lazy = False
            return
        super()._reconnect()

    async def wait_ready(self, timeout: float) -> bool:
        """A per-caller connection handshakes here, within its owner's call: the call hears why it failed."""
        if not self._callers or self._ready.is_set():
            return await super().wait_ready(timeout)
        for attempt in (0, 1):
            try:
                async with asyncio.timeout(timeout):
                    await self._started.wait()  # a call that found this connection just made waits for its start
                    await self._ensure_ready()
                return True
            except CredentialsRefused:
                if attempt:
                    raise
            except UpstreamAuthFailed:
                raise
            except (UpstreamUnavailable, TimeoutError):
                return False
        return False

    async def start(self, on_notification: NotificationCallback) -> None:
        await super().start(on_notification)
        self._started.set()
        if not self._callers and self._refresher is None:
            self._refresher = asyncio.create_task(self._keep_own_token(), name=f"upstream-token-{self.name}")

    async def _keep_own_token(self) -> None:
        """The gateway's own token, fetched again as it nears expiry, so what runs outside any call (the listen
        stream reopening, the background handshake) never carries an expired one."""
        loop = asyncio.get_running_loop()
        while not self._closing.is_set():
            try:
                self._background = await self._auth.headers(None)
            except UpstreamUnavailable as exc:  # logged where it failed; the next call or this loop tries again
                self._log.debug("upstream_token_refresh_failed", error=exc.message)
            await self._pause(refresh_in(self._auth.own_token_expires(), loop.time(),
                                         retry=min(30.0, self._spec.timeout)))

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await super().close()
        if self._token_session is not None:
            await self._token_session.close()

    def _caller(self) -> CallerCredential | None:
        """Whose credential this call carries: the caller's own on a per-caller connection, else nobody's."""
        if not self._callers:
            return None
        found = CREDENTIAL.get()
        if found is not None:
            self._owner = found  # the newest token of this connection's owner, for what runs in the background
        return found or self._owner

    def _configured_headers(self) -> Mapping[str, str]:
        holder = _CALL_HEADERS.get()
        return merged_headers(self._spec.headers, holder[0] if holder else self._background)

    async def _request(self, method: str, params: JsonObj | None, budget: float,
                       on_progress: ProgressCallback | None) -> JsonObj:
        caller = self._caller()
        retried = False
        while True:
            headers = await self._auth.headers(caller)
            self._background = {k: v for k, v in headers.items() if k != IDENTITY_HEADER}
            holder = [headers]
            token = _CALL_HEADERS.set(holder)
            try:
                return await super()._request(method, params, budget, on_progress)
            except CredentialsRefused:
                if retried:
                    raise
                self._auth.forget(caller, headers)
                self._log.info("upstream_token_refused", method=method, retry=True)
            finally:
                holder.clear()
                _CALL_HEADERS.reset(token)
            retried = True

    async def _ensure_ready(self) -> None:
        if not self._ready.is_set() and not _CALL_HEADERS.get():
            self._background = await self._auth.headers(self._owner)
        await super()._ensure_ready()

    async def _handshake(self, reason: str) -> None:
        try:
            await super()._handshake(reason)
        except CredentialsRefused:
            if not _CALL_HEADERS.get():  # a call retries itself; in the background the next attempt gets a new one
                self._auth.forget(self._owner, self._background)
            raise

    async def _post(self, message: JsonObj, route: str | None = None) -> tuple[int, JsonObj | None, str | None]:
        status, reply, session_id = await super()._post(message, route)
        if status == 401:
            raise CredentialsRefused(f"upstream {self.name!r} refused the token the gateway got for this caller "
                                     "(HTTP 401)", {"upstream": self.name, "status": 401}, sent=False)
        return status, reply, session_id

    def _make_twin(self) -> HttpUpstream:
        twin = AuthorizedHttpUpstream(self.name, self._spec.model_copy(update={"protocol": "2026"}), auth=self._auth,
                                      owner=self._owner, callers=self._callers, publisher=self._publisher,
                                      metrics=self._metrics, client_session_factory=self._factory,
                                      listen=self._listen_enabled)
        twin._discover_only = True
        twin._lazy = False  # looked for with wait_settled: it connects in the background, as its owner
        return twin


def upstream_auth(name: str, spec: HttpUpstreamSpec, identity: UpstreamIdentity,
                  session: Callable[[], aiohttp.ClientSession], publisher: Publisher | None = None) -> UpstreamAuth:
    assert spec.auth is not None
    client = TokenClient(name, spec.auth, timeout=spec.timeout, session=session)
    user = None
    if isinstance(spec.auth, OAuthUserSpec):
        assert identity.grants is not None
        assert identity.credential_keys
        user = identity.user_grants[name] = UserGrants(
            name, spec.auth, spec.url, client, identity.grants, CredentialBox(identity.credential_keys),
            timeout=spec.timeout, session=session, store_timeout=identity.store_timeout, publisher=publisher)
    return UpstreamAuth(name, spec.auth, client, identity_key=identity.identity_key, audience=spec.url, user=user)


class AuthorizedIsolated(IsolatedUpstream):
    """The per-caller form: a connection per token id; closing it closes the token client's session too."""

    token_session: TokenSession
    auth: UpstreamAuth
    #: The revocation store's question: a swept caller whose token was revoked loses its cached upstream tokens.
    is_revoked: RevocationCheck | None = None
    #: Where browsers come back to after authorizing (``oauth_user``); None: the calling request's loopback Host.
    public_base: str | None = None
    _revocation_sweep: asyncio.Task[None] | None = None

    async def request(self, method: str, params: JsonObj | None, *, on_progress: ProgressCallback | None = None,
                      timeout: float | None = None) -> JsonObj:
        """On an ``oauth_user`` upstream, a caller without a grant is asked to authorize first (authorize_call.py),
        then the call goes on; a grant gone between the look and the call is asked for the same way, once."""
        user, caller = self.auth.user, CREDENTIAL.get()
        if user is None or caller is None or method in CATALOGUE_METHODS:
            return await super().request(method, params, on_progress=on_progress, timeout=timeout)
        for attempt in (0, 1):
            if attempt or await user.grant_of(caller) is None:
                base = self.public_base or LOOPBACK_BASE.get()
                if base is None:
                    raise UpstreamAuthFailed(self.name, "no_public_url", "the gateway does not know its public "
                                             "URL (set SATGATE_PUBLIC_URL) to send the user back to")
                await authorize(user, caller, on_progress, base)
            try:
                return await super().request(method, params, on_progress=on_progress, timeout=timeout)
            except AuthorizationNeeded:
                if attempt:
                    raise UpstreamAuthFailed(self.name, "invalid_grant", f"upstream {self.name!r}: the grant "
                                             "just given was refused; authorize again") from None
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._revocation_sweep is not None:
            self._revocation_sweep.cancel()
        await super().close()
        await self.token_session.close()

    def sweep(self, now: float | None = None) -> list[str]:
        """Idle connections go, and so do the tokens no call can use any more: expired, or a revoked caller's."""
        self.auth.cache.sweep()
        if self.is_revoked is not None and (self._revocation_sweep is None or self._revocation_sweep.done()):
            self._revocation_sweep = asyncio.create_task(self.drop_revoked(self.is_revoked))
        return super().sweep(now)

    async def revocations_swept(self) -> None:
        """Until the revocation sweep the last ``sweep`` started is done (tests await this instead of sleeping)."""
        if self._revocation_sweep is not None:
            await self._revocation_sweep

    async def drop_revoked(self, is_revoked: RevocationCheck) -> None:
        try:
            dropped = await self.auth.cache.drop_revoked(is_revoked)
        except Exception as exc:  # a store fault: the next sweep asks again; the tokens stay unreachable meanwhile
            self._log.warning("upstream_token_revocation_sweep_failed", error=type(exc).__name__)
            return
        if dropped:
            self._log.info("upstream_tokens_dropped", reason="revoked", tokens=dropped)


def make_authorized(name: str, spec: HttpUpstreamSpec, *, identity: UpstreamIdentity, publisher: Publisher,
                    metrics: Metrics, idle_ttl: float, clock: Callable[[], float] = time.monotonic
                    ) -> AuthorizedHttpUpstream | AuthorizedIsolated:
    """The connection(s) for an upstream with ``"auth"``: one shared, or one per caller under a catalogue."""
    sessions = TokenSession()
    auth = upstream_auth(name, spec, identity, sessions, publisher)

    def connection(owner: CallerCredential | None, callers: bool, owns: TokenSession | None = None
                   ) -> AuthorizedHttpUpstream:
        return AuthorizedHttpUpstream(name, spec, auth=auth, owner=owner, callers=callers, publisher=publisher,
                                      metrics=metrics, token_session=owns)

    if not per_caller(spec.auth):
        return connection(None, False, sessions)
    isolated = AuthorizedIsolated(name, spec, publisher=publisher, metrics=metrics, idle_ttl=idle_ttl, clock=clock,
                                  factory=lambda label: connection(CREDENTIAL.get(), True),
                                  catalogue=connection(None, False), isolation="token")
    isolated.token_session, isolated.auth, isolated.is_revoked = sessions, auth, identity.is_revoked
    isolated.public_base = identity.public_base
    return isolated

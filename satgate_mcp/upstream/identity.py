"""What an HTTP upstream with ``"auth"`` is sent per call: its access token, and (``forward_identity``) who calls.

Tokens are cached per (subject, upstream, scope) until ``REFRESH_MARGIN`` seconds before they expire, and a
missing or ageing one is fetched by one request however many calls want it at once (single flight: the
others await the same fetch). An exchanged token is bound to the very access token it was exchanged for: a
caller presenting another token (refreshed, or a second one of the same subject) gets its own exchange, so a
revoked token's upstream token, unreachable once the gateway refuses that token, is never used for anyone else.

The decisions (which grant, whether a cached token is still good, which headers) are the small functions at
the top; ``TokenCache`` and ``UpstreamAuth`` only carry them out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.oauth_grants import GrantStore
from satgate_mcp.upstream.credential import CallerCredential
from satgate_mcp.upstream.signing import IDENTITY_HEADER, SigningKey, identity_claims
from satgate_mcp.upstream.token_client import IssuedToken, TokenClient
from satgate_mcp.upstream.user_grants import AuthorizationNeeded, UserGrants, catalogue_credential
from satgate_mcp.upstream_auth_spec import AuthSpec, ClientCredentialsSpec, per_caller

#: A cached token is replaced this many seconds before the server said it expires.
REFRESH_MARGIN = 30.0
#: Cached tokens kept per upstream at most (oldest first out).
MAX_CACHED = 10_000

Grant = Literal["token_exchange", "client_credentials", "oauth_user"]
#: Whether a token id (or subject) is revoked: the revocation store's question, handed down by the app.
RevocationCheck = Callable[[str], Awaitable[bool]]
#: (subject, upstream, scope): "" as the subject for the gateway's own token.
CacheKey = tuple[str, str, str]


def grant_for(auth_type: str, has_caller: bool) -> Grant:
    """Token exchange needs a caller's token, a user's grant a caller; without one (the gateway's own listings) the
    gateway is the client."""
    if not has_caller or auth_type not in ("token_exchange", "oauth_user"):
        return "client_credentials"
    return "token_exchange" if auth_type == "token_exchange" else "oauth_user"


def is_fresh(expires_at: float, now: float, margin: float = REFRESH_MARGIN) -> bool:
    """Whether a cached token may still be sent: not within ``margin`` seconds of its expiry."""
    return now < expires_at - margin


def usable(entry: CachedToken | None, origin: bytes | None, now: float) -> bool:
    """A cached token serves this call when it is fresh and was obtained for this very caller token (or none)."""
    return entry is not None and entry.origin == origin and is_fresh(entry.expires_at, now)


def refresh_in(expires_at: float | None, now: float, *, retry: float, margin: float = REFRESH_MARGIN) -> float:
    """Seconds until the gateway's own token is fetched again: as it enters the margin, or ``retry`` after a failure.

    At least one second, so a server that issues tokens shorter-lived than the margin is not asked in a loop."""
    if expires_at is None:
        return retry
    return max(1.0, expires_at - margin - now)


def sends_identity(forward_identity: bool, has_caller: bool) -> bool:
    """The signed identity header goes with a client's call only: the gateway's own requests name nobody."""
    return forward_identity and has_caller


@dataclass(frozen=True)
class UpstreamIdentity:
    """What the app hands the pool for upstreams with ``"auth"``: the key identities are signed with, the revocation
    store's question, and for ``oauth_user`` the grant store, the credential keys and the public URL."""

    identity_key: SigningKey | None = None
    is_revoked: RevocationCheck | None = None
    grants: GrantStore | None = None
    credential_keys: tuple[bytes, ...] = ()
    #: Where browsers come back to; None: the calling request's Host (on loopback only).
    public_base: str | None = None
    #: The bound of one grant store wait (``SATGATE_REDIS_TIMEOUT``).
    store_timeout: float | None = None
    #: Each ``oauth_user`` upstream's grants, as the pool makes them: the callback finishes authorizations there.
    user_grants: dict[str, UserGrants] = field(default_factory=dict)


@dataclass(slots=True)
class CachedToken:
    value: str = field(repr=False)
    expires_at: float
    #: SHA-256 of the caller token it was exchanged for; None for the gateway's own token.
    origin: bytes | None = field(repr=False)
    #: The caller's token id and subject: revoking either drops the token (none for the gateway's own).
    owners: tuple[str, ...] = ()


class TokenCache:
    """Tokens by key, each fetched by one request at a time; the clock is monotonic seconds."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, cap: int = MAX_CACHED) -> None:
        self._clock = clock
        self._cap = cap
        self._entries: dict[CacheKey, CachedToken] = {}
        self._flights: dict[tuple[CacheKey, bytes | None], asyncio.Task[str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: CacheKey, origin: bytes | None, fetch: Callable[[], Awaitable[IssuedToken]],
                  owners: tuple[str, ...] = ()) -> str:
        entry = self._entries.get(key)
        if usable(entry, origin, self._clock()):
            assert entry is not None
            return entry.value
        flight = self._flights.get((key, origin))
        if flight is None:
            flight = asyncio.ensure_future(self._fetch(key, origin, fetch, owners))
            self._flights[(key, origin)] = flight
            flight.add_done_callback(partial(self._landed, (key, origin)))
        # Shielded: a caller that gives up does not cancel the fetch the others wait for.
        return await asyncio.shield(flight)

    async def _fetch(self, key: CacheKey, origin: bytes | None, fetch: Callable[[], Awaitable[IssuedToken]],
                     owners: tuple[str, ...]) -> str:
        issued = await fetch()
        self.put(key, origin, issued, owners)
        return issued.value

    def put(self, key: CacheKey, origin: bytes | None, issued: IssuedToken, owners: tuple[str, ...] = ()) -> None:
        self._entries.pop(key, None)  # re-inserted last: the oldest entry is the first in the dict
        self._entries[key] = CachedToken(issued.value, self._clock() + issued.expires_in, origin, owners)
        while len(self._entries) > self._cap:
            self._entries.pop(next(iter(self._entries)))

    def _landed(self, flight_key: tuple[CacheKey, bytes | None], task: asyncio.Task[str]) -> None:
        if self._flights.get(flight_key) is task:
            del self._flights[flight_key]
        if not task.cancelled():
            task.exception()  # retrieved: a refusal nobody awaited any more is not "never retrieved"

    def expires_at(self, key: CacheKey) -> float | None:
        entry = self._entries.get(key)
        return entry.expires_at if entry is not None else None

    def drop(self, key: CacheKey, value: str) -> bool:
        """Forget ``key``'s token if it is still ``value`` (the upstream refused it); a newer one stays."""
        entry = self._entries.get(key)
        if entry is None or entry.value != value:
            return False
        del self._entries[key]
        return True

    async def drop_revoked(self, is_revoked: RevocationCheck) -> int:
        """Forget every token obtained for a caller whose token id or subject is revoked now; how many."""
        doomed = []
        for key, entry in list(self._entries.items()):
            for owner in entry.owners:
                if await is_revoked(owner):
                    doomed.append((key, entry))
                    break
        for key, entry in doomed:
            if self._entries.get(key) is entry:
                del self._entries[key]
        return len(doomed)

    def sweep(self, now: float | None = None) -> int:
        """Forget the tokens no call can use any more; how many."""
        now = self._clock() if now is None else now
        stale = [key for key, entry in self._entries.items() if not is_fresh(entry.expires_at, now)]
        for key in stale:
            del self._entries[key]
        return len(stale)


class UpstreamAuth:
    """One upstream's ``"auth"``: the headers a request carries for a caller (None: the gateway's own request)."""

    def __init__(self, name: str, spec: AuthSpec, client: TokenClient, *,
                 identity_key: SigningKey | None, audience: str, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, user: UserGrants | None = None) -> None:
        """``user``: an ``oauth_user`` upstream's grants (each caller's token comes from its own)."""
        self.name = name
        self.spec = spec
        self.client = client
        self.per_caller = per_caller(spec)
        self.cache = TokenCache(clock=clock)
        self._identity_key = identity_key
        #: The identity JWT's ``aud``: the upstream as it names itself (``audience``, ``resource``, else its URL).
        self._audience = getattr(spec, "audience", None) or spec.resource or audience
        self._wall = wall_clock
        self.user = user
        if user is not None:
            user.on_granted = self._granted

    def _key(self, caller: CallerCredential | None, grant: Grant) -> CacheKey:
        return (caller.subject if caller is not None and grant != "client_credentials" else "", self.name,
                self.spec.scope or "")

    def _granted(self, owner: str, grant_id: str, issued: IssuedToken) -> None:
        """A user's authorization completed here: its access token serves the retried call without a refresh."""
        self.cache.put((owner, self.name, self.spec.scope or ""), grant_id.encode("ascii"), issued, (owner,))

    async def headers(self, caller: CallerCredential | None) -> dict[str, str]:
        """``Authorization: Bearer`` with the token for this caller (and ``X-Satgate-Identity`` when forwarded)."""
        grant = grant_for(self.spec.type, caller is not None)
        owners = tuple(dict.fromkeys((caller.token_id, caller.subject))) if caller is not None else ()
        if grant == "token_exchange":
            assert caller is not None
            token = await self.cache.get(self._key(caller, grant), caller.digest,
                                         partial(self.client.exchange, caller.token), owners)
        elif grant == "oauth_user":
            assert caller is not None
            assert self.user is not None
            token = await self.user.access_token(caller, partial(self.cache.get, self._key(caller, grant),
                                                                 owners=owners))
        elif self.user is not None:
            token = await self._catalogue_token(self.user)
        else:
            token = await self.cache.get(self._key(caller, grant), None, self.client.client_credentials)
        headers = {"Authorization": f"Bearer {token}"}
        forward = isinstance(self.spec, ClientCredentialsSpec) and self.spec.forward_identity
        if sends_identity(forward, caller is not None) and self._identity_key is not None:
            assert caller is not None
            claims = identity_claims(subject=caller.subject, tenant=caller.tenant, token_id=caller.token_id,
                                     audience=self._audience, now=self._wall())
            headers[IDENTITY_HEADER] = self._identity_key.sign(claims)
        return headers

    async def _catalogue_token(self, user: UserGrants) -> str:
        """An ``oauth_user`` upstream's own requests (its listings): the catalogue subject's grant when the spec
        names one, else the client credentials grant at the same server."""
        subject = user.spec.catalogue_subject
        if subject is None:
            return await self.cache.get(self._key(None, "client_credentials"), None, user.own_token)
        try:
            return await user.access_token(catalogue_credential(subject),
                                           partial(self.cache.get, self._catalogue_key(), owners=(subject,)))
        except AuthorizationNeeded:
            raise UpstreamUnavailable(
                f"upstream {self.name!r} lists its tools with the grant of {subject!r}, which has not authorized it "
                f"yet: run `satgate-mcp credentials authorize {self.name}` and open the URL as {subject!r}",
                {"reason": "catalogue_not_authorized", "upstream": self.name}, sent=False) from None

    def _catalogue_key(self) -> CacheKey:
        subject = self.user.spec.catalogue_subject if self.user is not None else None
        return self._key(None, "client_credentials") if subject is None else (subject, self.name, self.spec.scope or "")

    def own_token_expires(self) -> float | None:
        """When the gateway's own cached token expires (monotonic seconds), None when none is cached."""
        return self.cache.expires_at(self._catalogue_key())

    def forget(self, caller: CallerCredential | None, headers: dict[str, str]) -> bool:
        """The upstream refused the token in ``headers``: the next request fetches another."""
        sent = headers.get("Authorization", "").removeprefix("Bearer ")
        grant = grant_for(self.spec.type, caller is not None)
        return self.cache.drop(self._key(caller, grant), sent)

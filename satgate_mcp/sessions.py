"""The session registry: sessions under token-bound ids (``session_ids``), cap, idle TTL, tombstones, sweep, resume.

No HTTP and no I/O here (events go to the publisher; one warning to the log), and the clock is injected,
so every rule is testable by calling methods.
Every public method is synchronous: on the asyncio event loop each call is one critical section,
which is the registry's lock. In particular the tombstone check in ``resume`` and the insert it
guards happen in the same uninterrupted call, so a DELETE that completed first always wins.
"""

from __future__ import annotations

import hmac
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import structlog

from satgate_mcp import events
from satgate_mcp.auth.base import Identity, token_hash
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.session_ids import make_session_id, session_id_matches_token
from satgate_mcp.session_rules import QuotaAction, TombstoneAction, live_quota_action, tombstone_action

log = structlog.get_logger("satgate_mcp.sessions")

#: The warning logged when a token's session quota starts evicting its sessions (once per token id).
QUOTA_EVICTING = "session_quota_evicting"
QUOTA_EVICTING_HINT = ("this token id holds SATGATE_SESSIONS_PER_TOKEN live sessions: each new one closes its least "
                       "recently used idle session, whose client gets 404 session_not_found and must initialize "
                       "again; raise SATGATE_SESSIONS_PER_TOKEN if these are distinct clients")
#: Token ids remembered as warned. Only a root token id holding a full quota gets here (children count as their
#: root), so real deployments stay far below it; past it the set starts over, keeping memory bounded.
QUOTA_WARNED_BOUND = 10_000


class CloseReason(StrEnum):
    DELETED = "deleted"
    IDLE = "idle_timeout"
    DISCONNECTED = "disconnected"
    SHUTDOWN = "shutdown"
    #: The token opened more sessions than its quota: its least recently used idle one made room.
    EVICTED = "evicted"


class ResumeRefusal(StrEnum):
    """Why an id was not served again; the transport answers every one of these like an unknown id."""

    TAG_MISMATCH = "tag_mismatch"
    DELETED = "deleted"
    #: This token deleted more sessions than its tombstone quota: its own resumes wait until those expire.
    TOMBSTONE_QUOTA = "tombstone_quota"
    #: Last resort, only when ``cap`` distinct tokens are blocked at once: nothing can be recorded any more.
    TOMBSTONES_FULL = "tombstones_full"


class RegistryFull(Exception):
    """No room even after sweeping; the caller answers 503 with Retry-After."""

    reason = "session_cap_reached"

    def __init__(self, retry_after: int) -> None:
        super().__init__("session cap reached")
        self.retry_after = retry_after


class TokenSessionsBusy(RegistryFull):
    """The token holds its quota of sessions and every one has a request in flight: nothing to evict."""

    reason = "session_quota_reached"


#: Retry-After when a token's sessions are all busy: calls end in seconds, not an idle TTL.
BUSY_RETRY_AFTER = 1


@dataclass(slots=True)
class Session:
    """One client's session. Its fields are read anywhere but change only through the methods below,
    so every writer is one grep away (tests/test_session_writes.py keeps it so)."""

    id: str
    token_hash: str
    identity: Identity
    protocol_version: str
    created_at: float
    last_seen: float
    resumed: bool = False
    #: The pool's tools_version when this client last saw the tool list; older means it should re-list.
    tools_seen: int = 0
    #: Requests (or a legacy SSE stream) running on this session now; a busy session is never evicted.
    inflight: int = 0
    #: The verified token id its quotas are counted under, fixed when the registry takes it in.
    quota_key: str = ""
    #: What the client declared at initialize; None when unknown (a resumed session): relay, and relay its refusal.
    client_capabilities: dict[str, object] | None = None
    #: The ``clientInfo`` it declared at initialize (policy and audit name the client by it); None: unknown.
    client_info: object = None
    #: The level this client asked for with ``logging/setLevel`` (None: everything).
    log_level: str | None = None

    def answers_to(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, token_hash(token))

    def declare(self, init_params: JsonObj | None) -> None:
        """The client's ``initialize`` params: the capabilities it offers, parsed here only (not an object: none)."""
        declared = (init_params or {}).get("capabilities")
        self.client_capabilities = dict(declared) if isinstance(declared, dict) else {}
        self.client_info = (init_params or {}).get("clientInfo")

    def rebind(self, identity: Identity) -> None:
        """The identity of the token this request presented (its scopes and caveats decide this request)."""
        self.identity = identity

    def seen(self, now: float) -> None:
        self.last_seen = now

    def saw_tools(self, tools_version: int) -> None:
        """The client now knows the tool list as of this version: a change is no longer owed to it."""
        self.tools_seen = tools_version

    def set_log_level(self, level: str) -> None:
        self.log_level = level

    def call_started(self) -> None:
        """A call (or the legacy stream that is the session) runs on it: a busy session is never evicted."""
        self.inflight += 1

    def call_ended(self) -> None:
        self.inflight -= 1


@dataclass(frozen=True, slots=True)
class Resumed:
    session: Session
    created: bool


def least_recently_used_idle(sessions: Iterable[Session]) -> Session | None:
    """The eviction victim: no request in flight, oldest ``last_seen``."""
    return min((s for s in sessions if s.inflight == 0), key=lambda s: s.last_seen, default=None)


class TombstoneStore(Protocol):
    """Where DELETEs outlive this process (a restart, another process on the state folder); synchronous,
    so ``resume`` keeps its check and its insert in one uninterrupted call."""

    def bury(self, session_id: str, ttl: float) -> None: ...

    def is_buried(self, session_id: str) -> bool: ...


class SessionRegistry:
    def __init__(
        self,
        *,
        cap: int,
        idle_ttl: float,
        publisher: Publisher,
        clock: Callable[[], float] = time.monotonic,
        per_token: int | None = None,
        tombstones: TombstoneStore | None = None,
    ) -> None:
        self.cap = cap
        self.idle_ttl = idle_ttl
        #: Live sessions, and separately tombstones, one token id may hold (None: only the cap limits).
        self.per_token = per_token if per_token is not None else sys.maxsize
        self._clock = clock
        self._publisher = publisher
        #: Written through on every recorded DELETE, asked on resume after the map below.
        self._durable = tombstones
        self._sessions: dict[str, Session] = {}
        #: token id -> its live sessions (the per-token quota and its LRU eviction look only here).
        self._by_token: dict[str, dict[str, Session]] = {}
        #: session id -> (time its tombstone expires, token id). Bounded by ``cap``; every entry lives
        #: exactly idle_ttl, so insertion order is expiry order.
        self._tombstones: dict[str, tuple[float, str]] = {}
        #: token id -> its tombstones (session id -> expiry), for the per-token tombstone quota.
        self._tombstones_by_token: dict[str, dict[str, float]] = {}
        #: token id -> until when its resumes are refused: its deletes could not all be recorded.
        self._blocked: dict[str, float] = {}
        #: Only when ``cap`` tokens are blocked at once can nothing be recorded: refuse every resume until then.
        self._resume_blocked_until = 0.0
        #: Called for every session that ends, however it ends (its stream and subscriptions end with it).
        self.on_close: list[Callable[[Session, CloseReason], None]] = []
        #: Token ids already warned that their quota evicts: once per token id for the life of the process.
        self._quota_warned: set[str] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[Session]:  # the console pages them; nothing on a call's path walks them
        return iter(self._sessions.values())

    @property
    def tombstone_count(self) -> int:
        return len(self._tombstones)

    def held_by(self, token_id: str) -> int:
        """Live sessions of one token id on this process."""
        return len(self._by_token.get(token_id, ()))

    def tombstones_of(self, token_id: str) -> int:
        return len(self._tombstones_by_token.get(token_id, ()))

    def open(self, token: str, identity: Identity, protocol_version: str) -> Session:
        """A new session for ``initialize``; raises RegistryFull (TokenSessionsBusy for the token's quota)."""
        now = self._clock()
        self._admit(identity.family_id, now)
        sid = make_session_id(token)
        session = Session(sid, token_hash(token), identity, protocol_version, now, now, quota_key=identity.family_id)
        self._insert(session)
        self._publisher.publish(events.SESSION_CONNECT, session_id=sid, token_id=identity.token_id,
                                protocol_version=protocol_version, resumed=False, **_client_of(identity))
        return session

    def log_levels(self) -> list[str]:
        """The levels live sessions asked for with ``logging/setLevel`` (upstreams get the most verbose)."""
        return [s.log_level for s in self._sessions.values() if s.log_level is not None]

    def get(self, session_id: str) -> Session | None:
        """The live session, or None if unknown or idle past its TTL (an expired one is closed now)."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_seen >= self.idle_ttl:
            self._drop(session_id, CloseReason.IDLE)
            return None
        return session

    def touch(self, session: Session) -> None:
        session.seen(self._clock())

    def resume(self, session_id: str, token: str, identity: Identity, protocol_version: str) -> Resumed | ResumeRefusal:
        """Serve an id this process does not hold again, if the token that opened it is presenting it.

        Raises RegistryFull when there is no room (a resume counts toward the token's live quota like
        an initialize). Concurrent callers with the same id get the same session: the first call
        inserts it, later ones find it.
        """
        if not session_id_matches_token(session_id, token):
            return ResumeRefusal.TAG_MISMATCH
        now = self._clock()
        existing = self._sessions.get(session_id)
        if existing is not None and now - existing.last_seen < self.idle_ttl:
            if not existing.answers_to(token):  # unreachable with a matching tag; kept as a guard
                return ResumeRefusal.TAG_MISMATCH
            return Resumed(existing, created=False)
        self._expire_tombstones(now)
        if session_id in self._tombstones or (self._durable is not None and self._durable.is_buried(session_id)):
            return ResumeRefusal.DELETED
        if self._blocked.get(identity.family_id, 0.0) > now:
            return ResumeRefusal.TOMBSTONE_QUOTA
        if now < self._resume_blocked_until:
            return ResumeRefusal.TOMBSTONES_FULL
        if existing is not None:
            self._drop(session_id, CloseReason.IDLE)
        self._admit(identity.family_id, now)
        session = Session(session_id, token_hash(token), identity, protocol_version, now, now, resumed=True,
                          quota_key=identity.family_id)
        self._insert(session)
        self._publisher.publish(events.SESSION_CONNECT, session_id=session_id, token_id=identity.token_id,
                                protocol_version=protocol_version, resumed=True, **_client_of(identity))
        return Resumed(session, created=True)

    def delete(self, session_id: str) -> bool:
        """End a session for good on this process: it leaves a tombstone for the idle TTL."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        now = self._clock()
        owner = session.quota_key
        self._drop(session_id, CloseReason.DELETED)
        self._expire_tombstones(now)
        largest_other = max((len(t) for k, t in self._tombstones_by_token.items() if k != owner), default=0) \
            if len(self._tombstones) >= self.cap else 0
        action = tombstone_action(self.tombstones_of(owner), self.per_token, len(self._tombstones), self.cap,
                                  largest_other)
        if action is TombstoneAction.BLOCK_LARGEST:
            largest = max((k for k in self._tombstones_by_token if k != owner),
                          key=lambda k: len(self._tombstones_by_token[k]))
            self._block(largest, max(self._tombstones_by_token[largest].values()))
            action = TombstoneAction.RECORD
        if action is TombstoneAction.RECORD:
            until = now + self.idle_ttl
            self._tombstones[session_id] = (until, owner)
            self._tombstones_by_token.setdefault(owner, {})[session_id] = until
            if self._durable is not None:
                self._durable.bury(session_id, self.idle_ttl)
        else:
            self._block(owner, now + self.idle_ttl)
        return True

    def close(self, session_id: str, reason: CloseReason) -> bool:
        """Forget a session without a tombstone: for sessions that can never be resumed (legacy SSE streams)."""
        if session_id not in self._sessions:
            return False
        self._drop(session_id, reason)
        return True

    def sweep(self, now: float | None = None) -> list[tuple[str, CloseReason]]:
        """Close idle sessions and forget expired tombstones and blocks; returns what was closed."""
        now = self._clock() if now is None else now
        idle = [sid for sid, s in self._sessions.items() if now - s.last_seen >= self.idle_ttl]
        for sid in idle:
            self._drop(sid, CloseReason.IDLE)
        self._expire_tombstones(now)
        for token_id in [k for k, until in self._blocked.items() if until <= now]:
            del self._blocked[token_id]
        return [(sid, CloseReason.IDLE) for sid in idle]

    def close_all(self) -> None:
        for sid in list(self._sessions):
            self._drop(sid, CloseReason.SHUTDOWN)

    def retry_after(self) -> int:
        """Seconds until the oldest idle session would be swept: an honest Retry-After."""
        if not self._sessions:
            return 1
        now = self._clock()
        soonest = min(s.last_seen for s in self._sessions.values()) + self.idle_ttl
        return max(1, int(soonest - now) + 1)

    def _admit(self, token_id: str, now: float) -> None:
        """Room for one more session of this token: its own quota first (evicting its LRU idle one), then the cap.

        The global cap never evicts: a session of one token is never closed to make room for another's.
        """
        own = self._by_token.get(token_id, {})
        victim = least_recently_used_idle(own.values()) if len(own) >= self.per_token else None
        action = live_quota_action(len(own), self.per_token, victim is not None)
        if action is QuotaAction.BUSY:
            raise TokenSessionsBusy(BUSY_RETRY_AFTER)
        if action is QuotaAction.EVICT:
            assert victim is not None
            self._warn_evicting(token_id)
            self._drop(victim.id, CloseReason.EVICTED)
        if len(self._sessions) >= self.cap:
            self.sweep(now)
        if len(self._sessions) >= self.cap:
            raise RegistryFull(self.retry_after())

    def _warn_evicting(self, token_id: str) -> None:
        """One warning per token id when its quota starts evicting: each eviction is only an info event, and
        a quota set too low for the clients sharing a token looks like random 404s otherwise."""
        if token_id in self._quota_warned:
            return
        if len(self._quota_warned) >= QUOTA_WARNED_BOUND:
            self._quota_warned.clear()
        self._quota_warned.add(token_id)
        log.warning(QUOTA_EVICTING, token_id=token_id, quota=self.per_token, hint=QUOTA_EVICTING_HINT)

    def _insert(self, session: Session) -> None:
        self._sessions[session.id] = session
        self._by_token.setdefault(session.quota_key, {})[session.id] = session

    def _block(self, token_id: str, until: float) -> None:
        """Refuse this token's resumes until ``until``; its tombstones are covered by that and go."""
        for sid in self._tombstones_by_token.pop(token_id, {}):
            del self._tombstones[sid]
        if token_id in self._blocked or len(self._blocked) < self.cap:
            self._blocked[token_id] = max(self._blocked.get(token_id, 0.0), until)
        else:
            self._resume_blocked_until = max(self._resume_blocked_until, until)

    def _expire_tombstones(self, now: float) -> None:
        # Insertion order is expiry order: drop from the front and stop at the first one still alive.
        while self._tombstones:
            sid, (until, owner) = next(iter(self._tombstones.items()))
            if until > now:
                break
            del self._tombstones[sid]
            own = self._tombstones_by_token.get(owner)
            if own is not None:
                own.pop(sid, None)
                if not own:
                    del self._tombstones_by_token[owner]

    def _drop(self, session_id: str, reason: CloseReason) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            own = self._by_token.get(session.quota_key)
            if own is not None:
                own.pop(session_id, None)
                if not own:
                    del self._by_token[session.quota_key]
            self._publisher.publish(events.SESSION_CLOSE, session_id=session_id,
                                    token_id=session.identity.token_id, reason=str(reason))
            for listener in self.on_close:
                listener(session, reason)


def _client_of(identity: Identity) -> dict[str, str]:
    """OAuth: which client the token was issued to, recorded beside the token id."""
    return {"client_id": identity.client_id} if identity.client_id else {}

"""The session registry: token-bound session ids, cap, idle TTL, tombstones, sweep, resume.

No HTTP and no I/O here, and the clock is injected, so every rule is testable by calling methods.
Every public method is synchronous: on the asyncio event loop each call is one critical section,
which is the registry's lock. In particular the tombstone check in ``resume`` and the insert it
guards happen in the same uninterrupted call, so a DELETE that completed first always wins.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from satgate_mcp import events
from satgate_mcp.auth.base import Identity, token_hash
from satgate_mcp.events import Publisher

_ID_RE = re.compile(r"^mcp-([0-9a-f]{32})-([0-9a-f]{32})$")


def session_tag(token: str, random_hex: str) -> str:
    """First 16 bytes of HMAC-SHA256(key=SHA-256(token), msg=random part), as hex (DESIGN.md section 3)."""
    key = hashlib.sha256(token.encode("utf-8")).digest()
    return hmac.new(key, random_hex.encode("ascii"), hashlib.sha256).digest()[:16].hex()


def make_session_id(token: str, random_hex: str | None = None) -> str:
    rnd = random_hex if random_hex is not None else secrets.token_bytes(16).hex()
    return f"mcp-{rnd}-{session_tag(token, rnd)}"


def session_id_matches_token(session_id: str, token: str) -> bool:
    """True only for a well-formed id whose tag was made with this token; untagged ids never match."""
    m = _ID_RE.fullmatch(session_id)
    if m is None:
        return False
    return hmac.compare_digest(session_tag(token, m.group(1)), m.group(2))


def is_valid_session_id_syntax(value: str) -> bool:
    """The spec allows visible ASCII only; anything else is a malformed header (400), not an unknown id."""
    return 0 < len(value) <= 256 and all(0x21 <= ord(c) <= 0x7E for c in value)


class CloseReason(StrEnum):
    DELETED = "deleted"
    IDLE = "idle_timeout"
    DISCONNECTED = "disconnected"
    SHUTDOWN = "shutdown"


class ResumeRefusal(StrEnum):
    """Why an id was not served again; the transport answers every one of these like an unknown id."""

    TAG_MISMATCH = "tag_mismatch"
    DELETED = "deleted"
    TOMBSTONES_FULL = "tombstones_full"


class RegistryFull(Exception):
    """No room even after sweeping; the caller answers 503 with Retry-After."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("session cap reached")
        self.retry_after = retry_after


@dataclass(slots=True)
class Session:
    id: str
    token_hash: str
    identity: Identity
    protocol_version: str
    created_at: float
    last_seen: float
    resumed: bool = False
    #: The pool's tools_version when this client last saw the tool list; older means it should re-list.
    tools_seen: int = 0

    def answers_to(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, token_hash(token))


@dataclass(frozen=True, slots=True)
class Resumed:
    session: Session
    created: bool


class SessionRegistry:
    def __init__(
        self,
        *,
        cap: int,
        idle_ttl: float,
        publisher: Publisher,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cap = cap
        self.idle_ttl = idle_ttl
        self._clock = clock
        self._publisher = publisher
        self._sessions: dict[str, Session] = {}
        #: session id -> time its tombstone expires. Bounded by ``cap``; unexpired entries are never evicted.
        self._tombstones: dict[str, float] = {}
        #: A DELETE that found the tombstone map full could not record its id: refuse every resume until then.
        self._resume_blocked_until = 0.0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def tombstone_count(self) -> int:
        return len(self._tombstones)

    def open(self, token: str, identity: Identity, protocol_version: str) -> Session:
        """A new session for ``initialize``; raises RegistryFull."""
        now = self._clock()
        self._make_room(now)
        sid = make_session_id(token)
        session = Session(sid, token_hash(token), identity, protocol_version, now, now)
        self._sessions[sid] = session
        self._publisher.publish(events.SESSION_CONNECT, session_id=sid, token_id=identity.token_id,
                                protocol_version=protocol_version, resumed=False)
        return session

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
        session.last_seen = self._clock()

    def resume(self, session_id: str, token: str, identity: Identity, protocol_version: str) -> Resumed | ResumeRefusal:
        """Serve an id this process does not hold again, if the token that opened it is presenting it.

        Raises RegistryFull when there is no room. Concurrent callers with the same id get the same
        session: the first call inserts it, later ones find it.
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
        if session_id in self._tombstones:
            return ResumeRefusal.DELETED
        if now < self._resume_blocked_until or len(self._tombstones) >= self.cap:
            return ResumeRefusal.TOMBSTONES_FULL
        if existing is not None:
            self._drop(session_id, CloseReason.IDLE)
        self._make_room(now)
        session = Session(session_id, token_hash(token), identity, protocol_version, now, now, resumed=True)
        self._sessions[session_id] = session
        self._publisher.publish(events.SESSION_CONNECT, session_id=session_id, token_id=identity.token_id,
                                protocol_version=protocol_version, resumed=True)
        return Resumed(session, created=True)

    def delete(self, session_id: str) -> bool:
        """End a session for good on this process: it leaves a tombstone for the idle TTL."""
        if session_id not in self._sessions:
            return False
        now = self._clock()
        self._drop(session_id, CloseReason.DELETED)
        self._expire_tombstones(now)
        if len(self._tombstones) < self.cap:
            self._tombstones[session_id] = now + self.idle_ttl
        else:
            self._resume_blocked_until = max(self._resume_blocked_until, now + self.idle_ttl)
        return True

    def close(self, session_id: str, reason: CloseReason) -> bool:
        """Forget a session without a tombstone: for sessions that can never be resumed (legacy SSE streams)."""
        if session_id not in self._sessions:
            return False
        self._drop(session_id, reason)
        return True

    def sweep(self, now: float | None = None) -> list[tuple[str, CloseReason]]:
        """Close idle sessions and forget expired tombstones; returns what was closed."""
        now = self._clock() if now is None else now
        idle = [sid for sid, s in self._sessions.items() if now - s.last_seen >= self.idle_ttl]
        for sid in idle:
            self._drop(sid, CloseReason.IDLE)
        self._expire_tombstones(now)
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

    def _make_room(self, now: float) -> None:
        if len(self._sessions) >= self.cap:
            self.sweep(now)
        if len(self._sessions) >= self.cap:
            raise RegistryFull(self.retry_after())

    def _expire_tombstones(self, now: float) -> None:
        # Every tombstone lives exactly idle_ttl from its insert, so insertion order is expiry order:
        # drop from the front and stop at the first one still alive.
        while self._tombstones:
            sid, until = next(iter(self._tombstones.items()))
            if until > now:
                break
            del self._tombstones[sid]

    def _drop(self, session_id: str, reason: CloseReason) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._publisher.publish(events.SESSION_CLOSE, session_id=session_id,
                                    token_id=session.identity.token_id, reason=str(reason))

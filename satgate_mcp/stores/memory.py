"""The stores of ``SATGATE_STATE_DIR=memory``: everything in this process, gone with it.

Also what tests and a policy built without stores use. No method awaits before it has decided, so on
the event loop each one is atomic without a lock. Every map here is bounded (a cap, an expiry, or the
number of live tokens).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from satgate_mcp.auth.revocation import check_token_id
from satgate_mcp.policy.budget import Charge, decide
from satgate_mcp.policy.duplicates import DUPLICATE_TTL_SECONDS, Record, State, Table
from satgate_mcp.policy.limits import Bucket, BucketState, RateSpec, refill, wait_for_token
from satgate_mcp.policy.pins import Change, Pin


@dataclass(slots=True)
class _Account:
    limit: float
    spent: float = 0.0

    @property
    def remaining(self) -> float:
        return self.limit - self.spent


class MemoryBudgetStore:
    """Budgets in this process; a restart starts them afresh. Methods never await, so each is atomic."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._accounts: dict[str, _Account] = {}
        #: (expiry, key) of accounts that expire (delegated children), soonest first.
        self._expiring: list[tuple[float, str]] = []

    def __len__(self) -> int:
        self._expire()
        return len(self._accounts)

    def _expire(self) -> None:
        if not self._expiring:
            return
        now = self._clock()
        while self._expiring and self._expiring[0][0] <= now:
            _, key = heapq.heappop(self._expiring)
            self._accounts.pop(key, None)

    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool,
                     charge_id: str = "") -> Charge:
        self._expire()
        account = self._accounts.get(key)
        if account is None:
            if limit is None:
                return Charge(True, None)
            account = self._accounts[key] = _Account(limit)
        charge, account.spent = decide(account.limit, account.spent, cost, enforce=enforce)
        return charge

    async def refund(self, key: str, amount: float, *, refund_id: str = "") -> None:
        account = self._accounts.get(key)
        if account is not None:
            account.spent = max(0.0, account.spent - amount)

    async def remaining(self, key: str, *, limit: float | None) -> float | None:
        self._expire()
        account = self._accounts.get(key)
        if account is None:
            return limit
        return account.remaining

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None,
                       ttl: float | None = None) -> Charge:
        self._expire()
        if child in self._accounts:
            return Charge(False, None)
        account = self._accounts.get(parent)
        if account is None and parent_limit is not None:
            account = self._accounts[parent] = _Account(parent_limit)
        taken = Charge(True, None)
        if account is not None:
            taken, spent = decide(account.limit, account.spent, amount, enforce=True)
            if not taken.allowed:
                return taken
            account.spent = spent
        self._accounts[child] = _Account(amount)
        if ttl is not None:
            heapq.heappush(self._expiring, (self._clock() + ttl, child))
        return taken

    async def close(self) -> None:
        return None


class MemoryDuplicateStore:
    """Records in this process, in expiry order (one TTL for all), bounded by ``cap``.

    Past the cap the oldest record goes first: a re-send of a call that old is then charged as new.
    """

    def __init__(self, *, ttl: float = DUPLICATE_TTL_SECONDS, cap: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._cap = cap
        self._clock = clock
        self._records: OrderedDict[str, tuple[Record, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> State:
        self._expire(self._clock())
        entry = self._records.get(key)
        return entry[0] if entry else None

    async def apply(self, key: str, table: Table) -> str:
        return self._apply(key, table)

    def apply_behind(self, key: str, table: Table) -> None:
        self._apply(key, table)

    def _apply(self, key: str, table: Table) -> str:
        now = self._clock()
        self._expire(now)
        entry = self._records.get(key)
        current = entry[0] if entry else None
        new, outcome = table[current]
        if new is None:
            self._records.pop(key, None)
        elif new is not current:
            self._records[key] = (new, now + self._ttl)
            self._records.move_to_end(key)
            while len(self._records) > self._cap:
                self._records.popitem(last=False)
        return outcome

    def _expire(self, now: float) -> None:
        while self._records:
            oldest, (_, expires) = next(iter(self._records.items()))
            if expires > now:
                break
            del self._records[oldest]

    async def close(self) -> None:
        self._records.clear()


class MemoryRateLimiter:
    """Buckets in this process; a restart starts every bucket full.

    Memory stays bounded by the number of active tokens: when the map passes ``cap`` buckets,
    those idle long enough to be full again are dropped (a dropped bucket and a new one are the
    same thing); if most are busy, the next sweep waits until the map has doubled.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, cap: int = 100_000) -> None:
        self._clock = clock
        self._cap = cap
        self._next_sweep = cap
        self._states: dict[str, tuple[BucketState, RateSpec]] = {}

    def __len__(self) -> int:
        return len(self._states)

    async def acquire(self, buckets: Sequence[Bucket]) -> float:
        # No await inside: check-and-take is atomic on the event loop.
        now = self._clock()
        current = []
        wait = 0.0
        for b in buckets:
            known = self._states.get(b.key)
            state = refill(known[0] if known else None, b.spec, now)
            current.append((b, state))
            wait = max(wait, wait_for_token(state, b.spec))
        if wait > 0:
            return wait
        for b, state in current:
            self._states[b.key] = (BucketState(state.tokens - 1.0, state.updated), b.spec)
        if len(self._states) > self._next_sweep:
            self._drop_full(now)
        return 0.0

    def _drop_full(self, now: float) -> None:
        for key, (state, spec) in list(self._states.items()):
            if now - state.updated >= spec.full_after:
                del self._states[key]
        self._next_sweep = max(self._cap, 2 * len(self._states))

    async def close(self) -> None:
        self._states.clear()


class MemoryRevocationStore:
    """One process, nothing persisted: tests, and ``auth_mode=header`` without a file or Redis."""

    def __init__(self, revoked: Iterable[str] = ()) -> None:
        self._ids = set(revoked)

    async def is_revoked(self, token_id: str) -> bool:
        return token_id in self._ids

    async def revoke(self, token_id: str) -> None:
        self._ids.add(check_token_id(token_id))

    def start(self) -> None:
        return None  # nothing to follow

    async def aclose(self) -> None:
        return None


class MemoryPinStore:
    """Pins in this process (``SATGATE_STATE_DIR=memory``, tests): a restart pins afresh. Never awaits, so atomic."""

    def __init__(self) -> None:
        self._pins: dict[tuple[str, str], Pin] = {}
        self._pinned_upstreams: set[str] = set()
        self._version = 0

    async def pins(self) -> list[Pin]:
        return list(self._pins.values())

    async def version(self) -> int:
        return self._version

    async def first_pinning(self, upstream: str, pins: Sequence[Pin]) -> bool:
        if upstream in self._pinned_upstreams:
            return False
        self._pinned_upstreams.add(upstream)
        for pin in pins:
            self._pins.setdefault((pin.upstream, pin.tool), pin)
        self._version += 1
        return True

    async def update(self, upstream: str, tool: str, change: Change) -> tuple[Pin | None, Pin | None]:
        before = self._pins.get((upstream, tool))
        after = change(before)
        if after is None:
            return before, before
        self._pins[(upstream, tool)] = after
        self._version += 1
        return before, after

    async def aclose(self) -> None:
        return None

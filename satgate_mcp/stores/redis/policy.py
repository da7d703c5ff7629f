"""Redis-backed rate limiter, budget store and duplicate guard, shared by every gateway process.

Each check-and-change is one Lua script, so it is atomic on the Redis server however many
processes call it. Numbers travel as ``%.17g`` strings (Lua numbers returned to Redis would be
truncated to integers). Keys live under one prefix; the budget transfer touches two keys, so on
a Redis Cluster both would need one hash slot (a single Redis, or a proxy, is assumed here).
Rate buckets take ``now`` from the caller's wall clock, so machines need roughly synced clocks.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis

from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import DUPLICATE_TTL_SECONDS, Table
from satgate_mcp.policy.limits import Bucket
from satgate_mcp.stores.redis.client import DEFAULT_MAX_CONNECTIONS, connect

DEFAULT_PREFIX = "satgate:"

#: Takes one token from each of ``n`` buckets, all or none: KEYS[k0 + i] for bucket i, ARGV[a0] now (seconds),
#: then (rate per second, burst) per bucket. Returns the seconds to wait (0: taken).
TAKE_RATE_LUA = """
local function take_rate(k0, a0, n)
  local now = tonumber(ARGV[a0])
  local wait = 0
  local tokens, stamps = {}, {}
  for i = 1, n do
    local rate, burst = tonumber(ARGV[a0 + 2 * i - 1]), tonumber(ARGV[a0 + 2 * i])
    local st = redis.call('HMGET', KEYS[k0 + i], 't', 'ts')
    local t, ts = tonumber(st[1]), tonumber(st[2])
    if t == nil or ts == nil then t, ts = burst, now end
    if now > ts then t = math.min(burst, t + (now - ts) * rate); ts = now end
    tokens[i], stamps[i] = t, ts
    local missing = 1 - t
    if missing > 1e-9 and missing / rate > wait then wait = missing / rate end
  end
  if wait > 0 then return wait end
  for i = 1, n do
    local rate, burst = tonumber(ARGV[a0 + 2 * i - 1]), tonumber(ARGV[a0 + 2 * i])
    redis.call('HSET', KEYS[k0 + i], 't', string.format('%.17g', tokens[i] - 1),
               'ts', string.format('%.17g', stamps[i]))
    redis.call('PEXPIRE', KEYS[k0 + i], math.ceil(burst / rate * 1000) + 1000)
  end
  return 0
end
"""

_RATE_LUA = TAKE_RATE_LUA + """
local wait = take_rate(0, 1, #KEYS)
if wait > 0 then return string.format('%.17g', wait) end
return '0'
"""


def rate_args(now: float, buckets: Sequence[Bucket]) -> list[str]:
    """``TAKE_RATE_LUA``'s arguments: now, then each bucket's rate and burst."""
    args = [num_arg(now)]
    for b in buckets:
        args += [num_arg(b.spec.per_second), str(b.spec.burst)]
    return args


#: ``policy.budget.decide``, line for line: returns allowed, remaining, exceeded, spent afterwards.
DECIDE_LUA = """
local function decide(limit, spent, cost, enforce)
  local exceeded = cost > limit - spent + 1e-9
  if exceeded and enforce then return false, limit - spent, true, spent end
  spent = spent + cost
  return true, limit - spent, exceeded, spent
end
local function num(value) return string.format('%.17g', value) end
"""

#: How long a charge id's ledger entry (its answer, or "void") outlives it: a charge whose answer was lost is
#: looked for within seconds; a command queued in a paused Redis longer than this could still land unseen.
LEDGER_TTL_MS = 600_000

#: Wraps a script's body (``local function body() ... end`` before it) in its charge id's ledger entry, the
#: key after the script's own: a script that ran answers again from the entry without running twice; one whose
#: charge id was voided (``LANDED_LUA``) answers ``{'void'}`` and changes nothing.
LEDGER_LUA = """
local ledger = KEYS[LEDGER_AT]
if ledger then
  local seen = redis.call('GET', ledger)
  if seen == 'void' then return {'void'} end
  if seen then return cjson.decode(seen) end
end
local reply = body()
if ledger then redis.call('SET', ledger, cjson.encode(reply), 'PX', LEDGER_TTL) end
return reply
""".replace("LEDGER_TTL", str(LEDGER_TTL_MS))

#: KEYS[1] a charge id's ledger entry: its answer when the charge landed, else "void" from now on (so a charge
#: still on its way never lands). Asked once an answer was lost; asked again, it answers the same.
LANDED_LUA = """
local seen = redis.call('GET', KEYS[1])
if seen then return seen end
redis.call('SET', KEYS[1], 'void', 'PX', LEDGER_TTL)
return 'void'
""".replace("LEDGER_TTL", str(LEDGER_TTL_MS))


def ledger_script(body: str, at: int) -> str:
    """``body`` (a script that returns a list) run once per charge id, its ledger entry at ``KEYS[at]``."""
    return "local function body()\n" + body + "\nend\n" + LEDGER_LUA.replace("LEDGER_AT", str(at))


# KEYS[1] budget, KEYS[2] the charge id's ledger entry (optional); ARGV cost, limit ('' = unlimited), enforce.
# Returns {status, remaining, exceeded}: status ok | refused | unlimited.
_CHARGE_LUA = DECIDE_LUA + ledger_script("""
local limit = redis.call('HGET', KEYS[1], 'limit')
local spent = 0
if limit then
  spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
else
  if ARGV[2] == '' then return {'unlimited', '', '0'} end
  limit = ARGV[2]
  redis.call('HSET', KEYS[1], 'limit', limit, 'spent', '0')
end
local allowed, remaining, exceeded, after = decide(tonumber(limit), spent, tonumber(ARGV[1]), ARGV[3] == '1')
if not allowed then return {'refused', num(remaining), '1'} end
redis.call('HSET', KEYS[1], 'spent', num(after))
return {'ok', num(remaining), exceeded and '1' or '0'}
""", 2)

# KEYS[1] budget, KEYS[2] the refund's marker (optional: then it is given back once only); ARGV amount.
_REFUND_LUA = """
if KEYS[2] and not redis.call('SET', KEYS[2], '1', 'NX', 'PX', LEDGER_TTL) then return 0 end
local spent = redis.call('HGET', KEYS[1], 'spent')
if not spent then return 0 end
local left = math.max(0, tonumber(spent) - tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'spent', string.format('%.17g', left))
return 1
""".replace("LEDGER_TTL", str(LEDGER_TTL_MS))

# KEYS[1] parent, KEYS[2] child; ARGV amount, parent limit ('' = unlimited), child ttl in ms ('' = none).
# Returns {status, parent remaining ('' = unlimited)}: status ok | insufficient | exists.
_TRANSFER_LUA = DECIDE_LUA + """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists', ''} end
local amount = tonumber(ARGV[1])
local limit = redis.call('HGET', KEYS[1], 'limit')
local spent = 0
if limit then
  spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
elseif ARGV[2] ~= '' then
  limit = ARGV[2]
  redis.call('HSET', KEYS[1], 'limit', limit, 'spent', '0')
end
local left = ''
if limit then
  local allowed, remaining, _, after = decide(tonumber(limit), spent, amount, true)
  if not allowed then return {'insufficient', num(remaining)} end
  redis.call('HSET', KEYS[1], 'spent', num(after))
  left = num(remaining)
end
redis.call('HSET', KEYS[2], 'limit', ARGV[1], 'spent', '0')
if ARGV[3] ~= '' then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
return {'ok', left}
"""


# KEYS[1] record; ARGV[1] ttl ms, then triples (state, new state, outcome); '' is "no record".
# Applies the triple for the record's current state; returns its outcome.
_APPLY_LUA = """
local current = redis.call('GET', KEYS[1]) or ''
for i = 2, #ARGV, 3 do
  if ARGV[i] == current then
    local new = ARGV[i + 1]
    if new == '' then
      redis.call('DEL', KEYS[1])
    elseif new ~= current then
      redis.call('SET', KEYS[1], new, 'PX', ARGV[1])
    end
    return ARGV[i + 2]
  end
end
return redis.error_reply('no transition for state ' .. current)
"""


def num_arg(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def text(value: object) -> str:
    """A script's reply as text: redis-py hands strings back as bytes unless told to decode."""
    return value.decode() if isinstance(value, bytes) else str(value)


def optional_float(value: Any) -> float | None:
    text = value.decode() if isinstance(value, bytes) else str(value)
    return float(text) if text else None


class RedisRateLimiter:
    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX,
                 clock: Callable[[], float] = time.time) -> None:
        self._prefix = prefix
        #: The buckets' clock (the admissions script reads the same one).
        self.clock = clock
        self._script = client.register_script(_RATE_LUA)

    async def acquire(self, buckets: Sequence[Bucket]) -> float:
        if not buckets:
            return 0.0
        wait = await self._script(keys=[self._prefix + b.key for b in buckets], args=rate_args(self.clock(), buckets))
        return float(wait)

    async def close(self) -> None:
        return None


class RedisBudgetStore:
    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self._prefix = prefix + "budget:"
        self._ledger, self._refunds = prefix + "charge:", prefix + "refund:"
        self._charge = client.register_script(_CHARGE_LUA)
        self._landed = client.register_script(LANDED_LUA)
        self._refund = client.register_script(_REFUND_LUA)
        self._transfer = client.register_script(_TRANSFER_LUA)

    async def charge(self, key: str, cost: float, *, limit: float | None, enforce: bool,
                     charge_id: str = "") -> Charge:
        keys = [self._prefix + key, *([self._ledger + charge_id] if charge_id else [])]
        reply = await self._charge(keys=keys, args=[num_arg(cost), num_arg(limit), "1" if enforce else "0"])
        return _charge_of(reply)

    async def charge_landed(self, charge_id: str) -> Charge | None:
        """The charge made under ``charge_id`` if it landed; None once it certainly never will."""
        seen = text(await self._landed(keys=[self._ledger + charge_id]))
        return None if seen == "void" else _charge_of(json.loads(seen))

    async def refund(self, key: str, amount: float, *, refund_id: str = "") -> None:
        keys = [self._prefix + key, *([self._refunds + refund_id] if refund_id else [])]
        await self._refund(keys=keys, args=[num_arg(amount)])

    async def remaining(self, key: str, *, limit: float | None) -> float | None:
        stored_limit, spent = await self.client.hmget(self._prefix + key, ["limit", "spent"])
        if stored_limit is None:
            return limit
        return float(stored_limit) - float(spent or 0)

    async def transfer(self, parent: str, child: str, amount: float, *, parent_limit: float | None,
                       ttl: float | None = None) -> Charge:
        ttl_ms = "" if ttl is None else str(max(1, math.ceil(ttl * 1000)))
        status, remaining = await self._transfer(
            keys=[self._prefix + parent, self._prefix + child], args=[num_arg(amount), num_arg(parent_limit), ttl_ms])
        status = status.decode() if isinstance(status, bytes) else status
        return Charge(status == "ok", optional_float(remaining), exceeded=status == "insufficient")

    async def close(self) -> None:
        return None


def _charge_of(reply: Any) -> Charge:
    status = text(reply[0])
    if status == "void":  # only a charge whose answer was given up on: nobody waits for this one
        raise TimeoutError("this charge was voided after its answer was lost")
    return Charge(status != "refused", optional_float(reply[1]), exceeded=optional_float(reply[2]) == 1)


class RedisDuplicateStore:
    """In-flight records under ``dup:``; one Lua script applies a whole transition table atomically."""

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX,
                 ttl: float = DUPLICATE_TTL_SECONDS) -> None:
        self._prefix = prefix + "dup:"
        self._ttl_ms = str(max(1, int(ttl * 1000)))
        self._apply = client.register_script(_APPLY_LUA)

    async def apply(self, key: str, table: Table) -> str:
        args = [self._ttl_ms]
        for state, (new, out) in table.items():
            args += [state or "", new or "", out]
        outcome = await self._apply(keys=[self._prefix + key], args=args)
        return outcome.decode() if isinstance(outcome, bytes) else str(outcome)

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class RedisStores:
    """The three stores over one client; ``aclose`` closes the client once."""

    client: redis.Redis
    rate_limiter: RedisRateLimiter
    budgets: RedisBudgetStore
    duplicates: RedisDuplicateStore

    @classmethod
    def from_client(cls, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX,
                    clock: Callable[[], float] = time.time,
                    duplicate_ttl: float = DUPLICATE_TTL_SECONDS) -> RedisStores:
        return cls(client, RedisRateLimiter(client, prefix=prefix, clock=clock),
                   RedisBudgetStore(client, prefix=prefix),
                   RedisDuplicateStore(client, prefix=prefix, ttl=duplicate_ttl))

    @classmethod
    def from_url(cls, url: str, *, prefix: str = DEFAULT_PREFIX, timeout: float = 0.5,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> RedisStores:
        client = connect(url, timeout=timeout, max_connections=max_connections)
        return cls.from_client(client, prefix=prefix)

    async def aclose(self) -> None:
        await self.client.aclose()


class RedisProbe:
    """``/readyz``'s look at the shared store: one PING, bounded by the timeout; never raises."""

    def __init__(self, url: str, timeout: float) -> None:
        self._client = connect(url, timeout=timeout)
        self._timeout = timeout

    async def __call__(self) -> bool:
        try:
            async with asyncio.timeout(self._timeout * 2):
                return bool(await self._client.ping())
        except (redis.RedisError, OSError, TimeoutError):
            return False

    async def aclose(self) -> None:
        await self._client.aclose()

"""A guarded call's arrival and its charge in one Redis script: one round trip instead of two or three.

The same steps as ``SqliteAdmissions`` (and the engine's general path): the duplicate record moves along
``ARRIVAL``; the free re-send reads what remains; any other copy is charged by ``decide`` (the Lua copy in
``policy.py``); a refused first copy's record is taken back in the same script, so no refused call leaves a
record even for an instant. The record and the budget are two keys: one Redis (or one hash slot) is assumed,
as for the budget transfer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as redis

from satgate_mcp.policy.admissions import Arrived, ChargeAsk, refused_record
from satgate_mcp.policy.budget import Charge
from satgate_mcp.policy.duplicates import ARRIVAL, DUPLICATE_TTL_SECONDS, Arrival, Table
from satgate_mcp.stores.redis.policy import (
    DECIDE_LUA,
    DEFAULT_PREFIX,
    LANDED_LUA,
    TAKE_RATE_LUA,
    ledger_script,
    num_arg,
    optional_float,
    rate_args,
    text,
)

# KEYS[1] record, KEYS[2] budget, KEYS[3] the charge id's ledger entry (optional), KEYS[4..] rate buckets (only
# with a ledger entry); ARGV ttl ms, cost, limit ('' = unlimited), enforce ('1'/'0'), then the arrival table and the
# refused first copy's table, each as a count and (state, new state, outcome) triples, then the number of rate
# buckets and (when any) TAKE_RATE_LUA's arguments.
# Returns {arrival, status, remaining, exceeded}: status ok | refused | unlimited | free (the re-send); or
# {'rate', wait} when a bucket was empty (nothing else done).
_ARRIVE_LUA = DECIDE_LUA + TAKE_RATE_LUA + """
local function apply(key, at, ttl)
  local current = redis.call('GET', key) or ''
  for i = at + 1, at + 3 * tonumber(ARGV[at]), 3 do
    if ARGV[i] == current then
      local new = ARGV[i + 1]
      if new == '' then
        redis.call('DEL', key)
      elseif new ~= current then
        redis.call('SET', key, new, 'PX', ttl)
      end
      return ARGV[i + 2]
    end
  end
  error('no transition for state ' .. current)
end
""" + ledger_script("""local buckets = tonumber(ARGV[RATE_AT])
if buckets > 0 then
  local wait = take_rate(3, RATE_AT + 1, buckets)
  if wait > 0 then return {'rate', num(wait)} end
end
local arrival = apply(KEYS[1], 5, ARGV[1])
local limit = redis.call('HGET', KEYS[2], 'limit')
local spent = tonumber(redis.call('HGET', KEYS[2], 'spent') or '0')
if arrival == 'replay' then
  if not limit then return {arrival, 'free', ARGV[3], '0'} end
  return {arrival, 'free', num(tonumber(limit) - spent), '0'}
end
if not limit then
  if ARGV[3] == '' then return {arrival, 'unlimited', '', '0'} end
  limit = ARGV[3]
  redis.call('HSET', KEYS[2], 'limit', limit, 'spent', '0')
end
local allowed, remaining, exceeded, after = decide(tonumber(limit), spent, tonumber(ARGV[2]), ARGV[4] == '1')
if not allowed then
  if arrival == 'first' then apply(KEYS[1], 6 + 3 * tonumber(ARGV[5]), ARGV[1]) end
  return {arrival, 'refused', num(remaining), '1'}
end
redis.call('HSET', KEYS[2], 'spent', num(after))
return {arrival, 'ok', num(remaining), exceeded and '1' or '0'}
""", 3)


def table_args(table: Table | None) -> list[str]:
    """A transition table as the script reads it: its size, then (state, new state, outcome) for each state."""
    rows = (table or {}).items()
    return [str(len(rows)), *(part for state, (new, out) in rows for part in (state or "", new or "", out))]


#: The two tables every arrival sends along: they never change, so they are built once.
_TABLES = table_args(ARRIVAL) + table_args(refused_record(Arrival.FIRST))
#: Where the rate buckets' count is among the arguments: after ttl, cost, limit, enforce and the tables.
_RATE_AT = 5 + len(_TABLES)
_ARRIVE_SCRIPT = _ARRIVE_LUA.replace("RATE_AT", str(_RATE_AT))


class RedisAdmissions:
    """``Admissions`` on Redis: the record and the charge of an arriving copy in one script."""

    #: ``RateTaking``: a call's rate buckets are taken in the same script as its arrival.
    takes_rate = True

    def __init__(self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX,
                 ttl: float = DUPLICATE_TTL_SECONDS, clock: Callable[[], float] = time.time) -> None:
        """``clock`` and ``prefix``: the rate limiter's, whose buckets these are too."""
        self._records, self._budgets, self._ledger = prefix + "dup:", prefix + "budget:", prefix + "charge:"
        self._prefix = prefix
        self._clock = clock
        self._ttl_ms = str(max(1, int(ttl * 1000)))
        self._arrive = client.register_script(_ARRIVE_SCRIPT)
        self._landed = client.register_script(LANDED_LUA)

    async def arrive(self, key: str, ask: ChargeAsk) -> Arrived:
        keys = [self._records + key, self._budgets + ask.budget_key,
                *([self._ledger + ask.charge_id] if ask.charge_id else [])]
        args = [self._ttl_ms, num_arg(ask.cost), num_arg(ask.limit), "1" if ask.enforce else "0", *_TABLES,
                str(len(ask.buckets))]
        if ask.buckets:
            if not ask.charge_id:  # the buckets' keys follow the ledger entry's
                raise ValueError("rate buckets are taken only with a charge id")
            keys += [self._prefix + b.key for b in ask.buckets]
            args += rate_args(self._clock(), ask.buckets)
        reply = await self._arrive(keys=keys, args=args)
        return _arrived(reply)

    async def arrival_landed(self, charge_id: str) -> Arrived | None:
        """The arrival made under ``charge_id`` if it landed; None once it certainly never will."""
        seen = text(await self._landed(keys=[self._ledger + charge_id]))
        return None if seen == "void" else _arrived(json.loads(seen))


def _arrived(reply: Any) -> Arrived:
    if text(reply[0]) == "void":  # only an arrival whose answer was given up on: nobody waits for this one
        raise TimeoutError("this arrival was voided after its answer was lost")
    if text(reply[0]) == "rate":
        return Arrived(Arrival.FIRST, None, None, rate_wait=float(text(reply[1])))
    arrival, status, remaining, exceeded = reply
    came, said = Arrival(text(arrival)), text(status)
    if said == "free":
        return Arrived(came, None, optional_float(remaining))
    return Arrived(came, Charge(said != "refused", optional_float(remaining), exceeded=text(exceeded) == "1"), None)

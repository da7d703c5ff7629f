"""The duplicate guard: identical copies of one call run once, and a re-send is never a free call.

Copies of a call (same token, session, request id and params) that arrive while the first is
unsettled share its one execution in this process (held in memory by shared_calls.py). What a
store keeps is the durable half: a record per call *in flight*, deleted when it settles. A record
that is still there when a copy arrives in a process that does not hold the call means the first
copy's process died (or another replica runs it): exactly one such re-send goes through uncharged,
and how the two settle decides who pays, so a call that ran is paid once and one that did not is
not paid at all. A copy arriving after settlement finds no record and is a new call.

The transitions are pure functions over the record's state; stores only apply them atomically.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from enum import StrEnum
from functools import partial
from typing import Protocol, runtime_checkable

import orjson

from satgate_mcp.jsonrpc import JsonObj, RequestId

#: How long an in-flight record outlives a process that died holding it: 24 hours.
DUPLICATE_TTL_SECONDS = 24 * 3600.0


class Record(StrEnum):
    """What the store says about one call in flight (no record: none is)."""

    #: The charged first copy is running (or its process died).
    RUNNING = "running"
    #: The one free re-send is running while the first copy is unsettled.
    REPLAYING = "replaying"
    #: The first copy never ran and kept its charge: it pays for the re-send still running.
    HANDED = "handed"
    #: The free re-send ran: the first copy's charge pays for it, refundable or not.
    REPLAY_RAN = "replay_ran"


class Arrival(StrEnum):
    """How a copy that this process does not already hold is admitted."""

    #: The first copy: charged, and recorded as running.
    FIRST = "first"
    #: The one re-send of a copy whose record says it never settled: uncharged.
    REPLAY = "replay"
    #: Another copy while a re-send runs elsewhere: a new call, charged, leaving the record alone.
    AGAIN = "again"


class Settlement(StrEnum):
    """What a settling copy does with the first copy's charge."""

    KEEP = "keep"
    REFUND = "refund"


State = Record | None


def on_arrival(record: State) -> tuple[State, Arrival]:
    """A copy arrives that no in-process execution holds."""
    if record is None:
        return Record.RUNNING, Arrival.FIRST
    if record is Record.RUNNING:
        return Record.REPLAYING, Arrival.REPLAY
    return record, Arrival.AGAIN


def on_refused(record: State) -> tuple[State, Settlement]:
    """The first copy was refused (budget): it never ran, so forget it."""
    return (None if record is Record.RUNNING else record), Settlement.KEEP


def on_first_settled(record: State, *, ran: bool) -> tuple[State, Settlement]:
    """The charged first copy settled: whether its charge is refunded."""
    if record is Record.REPLAYING:
        # A free re-send is running: if this copy never ran, its charge pays for that one instead.
        return (None if ran else Record.HANDED), Settlement.KEEP
    if record is Record.REPLAY_RAN:
        return None, Settlement.KEEP  # the re-send ran on this charge
    return None, (Settlement.KEEP if ran else Settlement.REFUND)


def on_replay_settled(record: State, *, ran: bool) -> tuple[State, Settlement]:
    """The free re-send settled: whether the first copy's handed-over charge is refunded."""
    if record is Record.REPLAYING:
        # Ran: the first copy's charge pays for it. Not run: as if it never came; the first copy is still open.
        return (Record.REPLAY_RAN if ran else Record.RUNNING), Settlement.KEEP
    if record is Record.HANDED:
        return None, (Settlement.KEEP if ran else Settlement.REFUND)
    return record, Settlement.KEEP


STATES: tuple[State, ...] = (None, *Record)
Table = dict[State, tuple[State, str]]


def transition_table(step: Callable[[State], tuple[State, StrEnum]]) -> Table:
    """A transition over every state, as data a store (a Lua script too) applies atomically."""
    return {state: (new, out.value) for state in STATES for new, out in (step(state),)}


ARRIVAL = transition_table(on_arrival)
REFUSED = transition_table(on_refused)
FIRST_SETTLED = {ran: transition_table(partial(on_first_settled, ran=ran)) for ran in (True, False)}
REPLAY_SETTLED = {ran: transition_table(partial(on_replay_settled, ran=ran)) for ran in (True, False)}


def duplicate_key(token_id: str, session_id: str, request_id: RequestId, params: JsonObj | None) -> str:
    """A hash of (token id, session id, request id, params without ``_meta``), stable across processes.

    ``_meta`` is left out: it carries transport details (progress tokens, tracing), not the call.
    The id keeps its JSON type, so ``1`` and ``"1"`` differ. The token id is there only so two
    callers can never collide, whatever session ids a transport hands in.
    """
    body = {k: v for k, v in (params or {}).items() if k != "_meta"}
    parts = [token_id, session_id, request_id, body]
    try:
        # The same bytes as json.dumps below in a tenth of the time, except where orjson writes a float its
        # own way (a number with "." or "e"; such text in a string only costs the slow path).
        blob = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
        if _FLOAT.search(blob) is not None:
            blob = b""
    except TypeError:  # integers past 64 bits and other values orjson refuses
        blob = b""
    if not blob:
        blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          default=str).encode("utf-8", "surrogatepass")
    return hashlib.sha256(blob).hexdigest()


#: A float in compact JSON: a number (after ":", "," or "[") with a fraction or an exponent.
_FLOAT = re.compile(rb"[:,\[]-?[0-9]+[.eE]")


class DuplicateStore(Protocol):
    async def apply(self, key: str, table: Table) -> str:
        """Atomically move ``key``'s record along ``table`` (current -> (new, outcome)); the outcome.

        A new or changed record lives for the store's TTL; a ``None`` record is deleted.
        """
        ...

    async def close(self) -> None: ...


@runtime_checkable
class WritesBehind(Protocol):
    """A duplicate store that can apply a transition whose answer nobody waits for, in order with the
    operations asked for before it: a settled call's answer need not wait for its record."""

    def apply_behind(self, key: str, table: Table) -> None: ...

"""``SATGATE_POLICY_FILE`` over time: loaded at start (a bad file stops ``serve``), re-read when it changes.

Every process polls the file's identity (inode, size, modification time) four times a second, so a change is
in force everywhere within a second, with no restart and no signal; a file whose bytes did not change (a
``touch``) is not compiled again. A changed file that does not parse or compile is refused: the last good
policy stays in force, the refusal is logged and published (``policy_rejected``), and ``/readyz`` is not
touched. Reading and compiling run in a worker thread; only the swap itself happens on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from satgate_mcp import events
from satgate_mcp.errors import ConfigError
from satgate_mcp.events import Publisher
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.decide import LISTED, Decider
from satgate_mcp.policy.rule_guard import PolicyGuard
from satgate_mcp.policy.rules import Effect, PolicyInvalid, RuleSet, load_rules

log = structlog.get_logger("satgate_mcp.policy")

POLL_SECONDS = 0.25
Signature = tuple[int, int, int] | None


def signature(path: Path) -> Signature:
    """What tells a changed file from an unchanged one without reading it; None when it cannot be seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def load_at_start(path: Path, default: Effect) -> RuleSet:
    """The policy ``serve`` starts with; ``ConfigError`` (one line: file, rule, position) when it is bad."""
    try:
        return load_rules(path, default)
    except PolicyInvalid as exc:
        first, more = exc.problems[0], len(exc.problems) - 1
        extra = f" (and {more} more problem{'s' if more > 1 else ''}: satgate-mcp policy check {path})" if more else ""
        raise ConfigError(f"invalid SATGATE_POLICY_FILE: {first}{extra}") from None


def _visibility(rules: RuleSet, kind: str) -> tuple[object, ...]:
    """What decides which items of a list kind are hidden: the rules on its list and call methods."""
    shape = LISTED[kind]
    methods = {shape.list_method, shape.call_method}
    return (rules.default, *((r.name, tuple(sorted(r.methods & methods)), r.tools, r.when.source if r.when else None,
                              r.effect) for r in rules.rules if r.methods & methods))


def changed_lists(old: RuleSet, new: RuleSet) -> list[str]:
    """The list kinds whose visible items a change of rules may change (each gets its ``list_changed``)."""
    return [kind for kind in LISTED if _visibility(old, kind) != _visibility(new, kind)]


#: Told of a reload that may change what callers are shown: the list kinds, the decider before and after.
ListsChanged = Callable[[list[str], Decider, Decider], Awaitable[None]]


class PolicyFile:
    """The policy file of one process: polled, and its good versions swapped into the guard."""

    def __init__(self, path: Path, default: Effect, guard: PolicyGuard, *, publisher: Publisher, metrics: Metrics,
                 on_lists_changed: ListsChanged | None = None) -> None:
        self.path, self._default, self._guard = path, default, guard
        self._publisher, self._metrics = publisher, metrics
        self.on_lists_changed = on_lists_changed
        self._seen: Signature = signature(path)
        self._digest = self._read_digest()

    @property
    def rules(self) -> RuleSet:
        """The rules in force now (the operator console lists them)."""
        return self._guard.decider.rules

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def _load(self) -> tuple[bytes | None, RuleSet | PolicyInvalid | None]:
        """(the file's digest, its rules or why they are refused); rules None: the bytes did not change."""
        digest = self._read_digest()
        if digest is not None and digest == self._digest:
            return digest, None
        try:
            return digest, load_rules(self.path, self._default)
        except PolicyInvalid as exc:
            return digest, exc

    async def check(self) -> bool:
        """Take a changed file into use; True when the rules in force changed."""
        seen = signature(self.path)
        if seen == self._seen:
            return False
        self._seen = seen
        digest, loaded = await asyncio.to_thread(self._load)
        if loaded is None:
            return False
        self._digest = digest
        if isinstance(loaded, PolicyInvalid):
            self._reject(loaded)
            return False
        previous = self._guard.use(Decider(loaded))
        self._metrics.policy_reloads.labels(outcome="loaded").inc()
        self._publisher.publish(events.POLICY_LOADED, file=str(self.path), rules=len(loaded.rules))
        changed = changed_lists(previous.rules, loaded)
        if changed and self.on_lists_changed is not None:
            await self.on_lists_changed(changed, previous, self._guard.decider)
        return True

    def _reject(self, exc: PolicyInvalid) -> None:
        problems = [str(p) for p in exc.problems[:20]]
        self._metrics.policy_reloads.labels(outcome="rejected").inc()
        log.error("policy_file_refused", file=str(self.path), problems=problems,
                  hint="the last good policy stays in force; satgate-mcp policy check shows every problem")
        self._publisher.publish(events.POLICY_REJECTED, file=str(self.path), problems=problems)

    async def watch(self, interval: float = POLL_SECONDS) -> None:
        """Poll until cancelled; a failure of one round (say, a vanished file) never ends the watch."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check()
            except Exception:
                log.exception("policy_file_check_failed", file=str(self.path))

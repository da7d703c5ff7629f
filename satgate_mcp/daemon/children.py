"""The last guard against orphans: upstream children still alive after the app's cleanup are stopped."""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Collection

import structlog

log = structlog.get_logger("satgate_mcp.runner")

CHILD_EXIT_WAIT_SECONDS = 3.0


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc/<pid>/task/*/children``); [] where unavailable."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
    return sorted(pids)


def _wait_exit(pid: int, timeout: float) -> bool:
    """Reap ``pid`` within ``timeout``; True when it is gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return True  # already gone
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        exited = bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return exited


def terminate_leftover_children(pid: int, keep: Collection[int] = ()) -> int:
    """Last guard against orphans: upstream cleanup should have stopped every child already.

    ``keep``: children handed to the next process, alive on purpose."""
    leftovers = [child for child in child_pids(pid) if child not in keep]
    for child in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGTERM)
    for child in leftovers:
        if not _wait_exit(child, CHILD_EXIT_WAIT_SECONDS):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            _wait_exit(child, CHILD_EXIT_WAIT_SECONDS)
    if leftovers:
        log.warning("orphan_guard", children=leftovers)
    return len(leftovers)


"""/proc sampling: resident memory and CPU ticks of a server and every process below it.

Read from the kernel rather than asked of the server, so the figures cost the server nothing and cover children
(the gateway's stdio upstream) that the server itself cannot see into.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

#: Clock ticks per second: the unit of utime and stime in /proc/<pid>/stat.
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_kib(status_text: str, field_name: str = "VmRSS") -> int | None:
    """A ``/proc/<pid>/status`` memory field in KiB, or None when absent (process gone, kernel thread)."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == field_name:
            parts = value.split()
            return int(parts[0]) if parts and parts[0].isdigit() else None
    return None


def memory_kib(pid: int, field_name: str = "VmRSS") -> int | None:
    """``field_name`` of a live process in KiB; None once it is gone (a figure lost, never a crash)."""
    try:
        return rss_kib(Path(f"/proc/{pid}/status").read_text(), field_name)
    except OSError:
        return None


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    ticks: int  # utime + stime, in clock ticks (os.sysconf("SC_CLK_TCK") per second)


def parse_proc_stat(text: str) -> ProcStat:
    """One ``/proc/<pid>/stat`` line; ``comm`` is in parentheses and may hold spaces or ``)``: split at the last."""
    head, sep, rest = text.rpartition(")")
    if not sep:
        raise ValueError("not a /proc/<pid>/stat line")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()  # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    if len(fields) < 13:
        raise ValueError("short /proc/<pid>/stat line")
    return ProcStat(pid, int(fields[1]), int(fields[11]) + int(fields[12]))


def descendants(root: int, parent_of: dict[int, int]) -> list[int]:
    """Every process below ``root`` in the tree that ``parent_of`` (pid -> ppid) describes, sorted."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def tick_delta(before: dict[int, int], after: dict[int, int]) -> int:
    """Ticks spent between two snapshots (pid -> ticks); a process born in between (or a reused pid: its count
    went down) counts from zero. One that died in between is lost: the window should hold no restarts."""
    return sum(ticks - before.get(pid, 0) if ticks >= before.get(pid, 0) else ticks for pid, ticks in after.items())


def process_table() -> dict[int, ProcStat]:
    """Every process readable now; one that exits while the table is read is simply left out."""
    table: dict[int, ProcStat] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError):
                stat = parse_proc_stat(Path(f"/proc/{entry}/stat").read_text())
                table[stat.pid] = stat
    return table


def tree_ticks(root: int | None) -> tuple[dict[int, int], dict[int, int]]:
    """CPU ticks so far of ``root`` and, separately, of every process below it (pid -> ticks)."""
    if root is None:
        return {}, {}
    table = process_table()
    below = descendants(root, {pid: s.ppid for pid, s in table.items()})
    main = {root: table[root].ticks} if root in table else {}
    return main, {pid: table[pid].ticks for pid in below if pid in table}

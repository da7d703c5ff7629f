"""A stdio child as pipes and a pidfd: spawned here, or adopted from the process that spawned it.

asyncio's own subprocess transport kills its child when it is closed or collected, and cannot take
a child this process did not spawn; a child that outlives a gateway restart needs neither. So a child
is three pipes wrapped as asyncio streams and a pidfd watched by the loop: the same whether this
process forked it or received its pipes (``SCM_RIGHTS``) from the previous one. Handing it on gives
away duplicates of the same four descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import IO

#: The pids of children this process handed to another one: they are not stopped when it exits.
HANDED_OVER: set[int] = set()


class ChildProcess:
    """The part of ``asyncio.subprocess.Process`` the stdio upstream uses, for a child spawned or adopted."""

    def __init__(self, pid: int, pidfd: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, raw: Sequence[int], transports: Sequence[asyncio.BaseTransport], *,
                 own: bool) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        #: False for an adopted child: its exit status belongs to its real parent (or init), not to us.
        self.own = own
        self._pidfd = pidfd
        self._raw = list(raw)
        self._transports = list(transports)
        self._exited = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(pidfd, self._on_exit)

    @classmethod
    async def spawn(cls, command: Sequence[str], env: Mapping[str, str], cwd: str | None, *,
                    limit: int) -> ChildProcess:
        """Fork ``command`` in its own session with three pipes; ``OSError`` when it cannot start."""
        pid, fds = fork_child(command, env, cwd)
        return await cls.wrap(pid, os.pidfd_open(pid), fds, limit=limit, own=True)

    @classmethod
    async def wrap(cls, pid: int, pidfd: int, fds: Sequence[int], *, limit: int, own: bool) -> ChildProcess:
        """Streams over ``fds`` (stdin's write end, stdout's and stderr's read ends), taking ownership of them."""
        loop = asyncio.get_running_loop()
        raw = [os.dup(fd) for fd in fds]  # what a handover gives away; ours close with the transports
        stdin_file: IO[bytes] = os.fdopen(fds[0], "wb", buffering=0)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdin_file)
        stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        readers: list[asyncio.StreamReader] = []
        transports: list[asyncio.BaseTransport] = [transport]
        for fd in fds[1:3]:
            reader = asyncio.StreamReader(limit=limit, loop=loop)
            read_transport, _ = await loop.connect_read_pipe(partial(asyncio.StreamReaderProtocol, reader),
                                                             os.fdopen(fd, "rb", buffering=0))
            readers.append(reader)
            transports.append(read_transport)
        return cls(pid, pidfd, stdin, readers[0], readers[1], raw, transports, own=own)

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        self.returncode = exit_status(self.pid) if self.own else ADOPTED_EXIT
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def give_away(self) -> tuple[list[int], int]:
        """Duplicates of the child's pipes and pidfd for another process; this one stops reading and watching.

        The caller sends them and then ``release()``s: the child keeps every pipe open meanwhile."""
        HANDED_OVER.add(self.pid)
        return [os.dup(fd) for fd in self._raw], os.dup(self._pidfd)

    def duplicates(self) -> tuple[list[int], int]:
        """Copies of the pipes and pidfd to keep elsewhere (systemd's fd store); the child stays ours."""
        return [os.dup(fd) for fd in self._raw], os.dup(self._pidfd)

    def release(self) -> None:
        """Close this process's ends: after a handover the child's pipes stay open in the next process."""
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self._pidfd)
        close_fds([*self._raw, self._pidfd])
        self._raw = []
        for transport in self._transports:
            transport.close()
        for reader in (self.stdout, self.stderr):
            reader.feed_eof()
        if not self._exited.done():
            self._exited.set_result(HANDED_OVER_EXIT)

    def close(self) -> None:
        """After the child's end: free the descriptors kept for a handover."""
        close_fds([*self._raw, self._pidfd])
        self._raw = []


#: The "exit status" of a child that ended after it was adopted (its real status went to its parent), and
#: the end of a child in this process once handed on.
ADOPTED_EXIT = 255
HANDED_OVER_EXIT = 0


def exit_status(pid: int) -> int:
    """Reap our own child: its returncode as asyncio reports one (negative: killed by that signal)."""
    try:
        _, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return ADOPTED_EXIT
    return os.waitstatus_to_exitcode(status) if status else 0


def close_fds(fds: Iterable[int]) -> None:
    """Close each descriptor; one already closed (or never valid) is no error: every caller is cleaning up."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def fork_child(command: Sequence[str], env: Mapping[str, str], cwd: str | None) -> tuple[int, list[int]]:
    """The child's pid and our ends of its pipes (stdin's write end, stdout's and stderr's read ends)."""
    ends = [os.pipe() for _ in range(3)]
    stdin_r, stdin_w = ends[0]
    stdout_r, stdout_w = ends[1]
    stderr_r, stderr_w = ends[2]
    try:
        proc = subprocess.Popen(list(command), stdin=stdin_r, stdout=stdout_w, stderr=stderr_w, env=dict(env),
                                cwd=cwd, start_new_session=True, close_fds=True)
    except OSError:
        for pair in ends:
            for fd in pair:
                os.close(fd)
        raise
    for fd in (stdin_r, stdout_w, stderr_w):
        os.close(fd)
    proc.returncode = 0  # Popen must never wait for it or warn: the pidfd watches it
    return proc.pid, [stdin_w, stdout_r, stderr_r]

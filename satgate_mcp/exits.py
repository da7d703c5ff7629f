"""The process exit codes, one vocabulary for the daemon and the token commands."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    #: Something did not work: a drain was cut, the port was taken, a token was refused or not revoked.
    FAILED = 1
    #: Fix the configuration or the command line: the one line on stderr says what.
    CONFIG = 2
    #: Ctrl-C before the daemon installed its own signal handlers (the shell's 128 + SIGINT).
    INTERRUPTED = 130

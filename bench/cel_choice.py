"""Which CEL library evaluates policy conditions: the README's example conditions, timed with each candidate.

Run as ``python -m bench.cel_choice [--rounds N]``. Each library that is installed compiles the README's
conditions once, then evaluates each many times against the variables a ``tools/call`` gives a rule (built
fresh for every evaluation, as the gateway does); the figure printed is the median microseconds per evaluation.
A library that is not installed is skipped with a line saying how to add it (only the chosen one,
``common-expression-language``, is a dependency of the project; install ``cel-python`` into a scratch venv to
compare). docs/governance.md records the figures and the choice.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

#: The README's policy conditions (and one that reads nothing but the token, the cached kind).
CONDITIONS: dict[str, str] = {
    "github-repo-outside-org": '!has(args.repo) || !args.repo.startsWith(token.claims.org + "/")',
    "destructive-needs-admin": 'has(tool.annotations.destructiveHint) && tool.annotations.destructiveHint == true'
                               ' && !("admin" in token.scopes)',
    "tenant-only": 'token.tenant != "acme"',
}

Evaluate = Callable[[Mapping[str, Any]], object]


def variables() -> dict[str, Any]:
    """What one ``tools/call`` shows a rule: the shape satgate_mcp/policy/variables.py builds."""
    return {
        "token": {"id": "agent-7", "tenant": "acme", "subject": "alice", "scopes": ["mcp:use"],
                  "claims": {"org": "acme", "sub": "alice"}, "caveats": []},
        "tool": {"name": "github_delete_repo", "upstream": "github",
                 "annotations": {"destructiveHint": True, "readOnlyHint": False}},
        "args": {"repo": "acme/widgets", "confirm": True},
        "session": {"id": "mcp-1", "protocol": "2025-11-25", "client": {"name": "bench", "version": "1"}},
        "request": {"method": "tools/call", "remote_addr": "127.0.0.1"},
        "now": datetime.now(UTC),
    }


def rust_compiler(expression: str) -> Evaluate:
    """``common-expression-language`` (Rust, via PyO3): a compiled program executed with a dict of variables."""
    cel: Any = importlib.import_module("cel")
    program = cel.compile(expression)
    return lambda context: program.execute(dict(context))


def python_compiler(expression: str) -> Evaluate:
    """``cel-python`` (pure Python): the variables converted to its CEL types on every evaluation."""
    celpy: Any = importlib.import_module("celpy")
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))

    def evaluate(context: Mapping[str, Any]) -> object:
        activation = {k: v if isinstance(v, datetime) else celpy.json_to_cel(v) for k, v in context.items()}
        activation["now"] = celpy.celtypes.TimestampType(context["now"])
        return program.evaluate(activation)

    return evaluate


CANDIDATES: dict[str, tuple[str, Callable[[str], Evaluate]]] = {
    "common-expression-language": ("cel", rust_compiler),
    "cel-python": ("celpy", python_compiler),
}


def per_evaluation_us(evaluate: Evaluate, rounds: int) -> float:
    """Median microseconds of one evaluation over ``rounds`` batches of 100 (variables rebuilt each time)."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(100):
            evaluate(variables())
        samples.append((time.perf_counter() - started) / 100 * 1e6)
    base = []
    for _ in range(rounds):  # what building the variables alone costs, taken off
        started = time.perf_counter()
        for _ in range(100):
            variables()
        base.append((time.perf_counter() - started) / 100 * 1e6)
    return max(0.0, statistics.median(samples) - statistics.median(base))


def report(library: str, compile_one: Callable[[str], Evaluate], rounds: int) -> list[str]:
    """One line per condition: compile time and time per evaluation, with the result it gave."""
    lines = []
    for name, expression in CONDITIONS.items():
        started = time.perf_counter()
        evaluate = compile_one(expression)
        compiled_us = (time.perf_counter() - started) * 1e6
        result = evaluate(variables())
        lines.append(f"{library:28} {name:26} compile {compiled_us:8.1f} us   "
                     f"evaluate {per_evaluation_us(evaluate, rounds):7.2f} us   -> {result}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=50, help="batches of 100 evaluations per condition")
    args = parser.parse_args(argv)
    for library, (module, compile_one) in CANDIDATES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            print(f"{library:28} skipped: not installed (pip install {library} in a scratch venv to compare)")
            continue
        print("\n".join(report(library, compile_one, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The start-up failure lines the docs quote are what ``serve`` prints (issue 23).

docs/operations.md's "Start-up failures" section has a ``text`` block of line shapes and a ``console`` block of
refused starts with their stderr; docs/configuration.md quotes some of those lines. An operator greps the log for
these words, so a changed message must change the docs too: each documented start runs here through
``cli.main`` (the daemon stubbed: a refused start never reaches it) and its stderr is compared line for line.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from satgate_mcp import cli
from satgate_mcp.exits import ExitCode
from satgate_mcp.settings import Settings
from tests.fakes import stub_daemon

DOCS = Path(__file__).resolve().parents[1] / "docs"
OPERATIONS = DOCS / "operations.md"
CONFIGURATION = DOCS / "configuration.md"
SECTION = "Start-up failures"
PROMPT = "$ "
PROGRAM = "satgate-mcp"


@dataclass
class Run:
    """One documented ``satgate-mcp`` command: its environment, its arguments, what it prints on stderr."""

    env: dict[str, str]
    argv: list[str]
    stderr: list[str] = field(default_factory=list)
    #: From a following ``$ echo $?``; None when the docs do not show it.
    exit_code: int | None = None


def section(markdown: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, flags=re.MULTILINE | re.DOTALL)
    assert m, f"no '## {heading}' section"
    return m.group(1)


def fenced(markdown: str, lang: str) -> list[str]:
    """The contents of every fenced block whose info string is ``lang``."""
    return re.findall(rf"^```{re.escape(lang)}\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def documented_runs(console: str) -> list[Run]:
    """``$ [NAME=value ...] satgate-mcp ARGS`` lines, the stderr lines after each, ``$ echo $?`` for its exit code.

    Only the program's own commands are accepted: a documented line that is not one would go unchecked.
    """
    runs: list[Run] = []
    lines = iter(console.splitlines())
    for line in lines:
        if not line.startswith(PROMPT):
            assert runs, f"output before any command: {line!r}"
            runs[-1].stderr.append(line)
            continue
        words = shlex.split(line.removeprefix(PROMPT))
        if words == ["echo", "$?"]:
            assert runs, "echo $? before any command"
            runs[-1].exit_code = int(next(lines))
            continue
        env = {}
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        assert words[:1] == [PROGRAM], f"not a {PROGRAM} command: {line!r}"
        runs.append(Run(env, words[1:]))
    return runs


def shape_pattern(shape: str) -> re.Pattern[str]:
    """A documented shape as a pattern: ``<...>`` is any text, ``[...]`` may be absent."""
    parts = []
    for token in re.split(r"(<[^<>]+>|\[|\])", shape):
        if token == "[":
            parts.append("(?:")
        elif token == "]":
            parts.append(")?")
        elif token.startswith("<") and token.endswith(">"):
            parts.append(".+")
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts) + r"\Z")


def quoted_lines(markdown: str) -> list[str]:
    """Inline code that is a whole ``satgate-mcp: ...`` line, not a shape, one space where the source wraps."""
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", markdown)]
    return [span for span in spans if span.startswith(f"{PROGRAM}: ") and "<" not in span]


def operations_runs() -> list[Run]:
    return [run for block in fenced(section(OPERATIONS.read_text(), SECTION), "console")
            for run in documented_runs(block)]


def shapes() -> list[str]:
    return [line for block in fenced(section(OPERATIONS.read_text(), SECTION), "text")
            for line in block.splitlines() if line]


# --- the readers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("console", "runs"),
    [
        pytest.param("$ satgate-mcp serve\nsatgate-mcp: bad\n", [Run({}, ["serve"], ["satgate-mcp: bad"])],
                     id="one-command-one-line"),
        pytest.param("$ SATGATE_UPSTREAMS='{\"a\": {}}' SATGATE_PORT=1 satgate-mcp serve --port x\nl1\nl2\n",
                     [Run({"SATGATE_UPSTREAMS": '{"a": {}}', "SATGATE_PORT": "1"}, ["serve", "--port", "x"],
                          ["l1", "l2"])], id="quoted-environment-and-flags"),
        pytest.param("$ satgate-mcp serve\nl1\n$ satgate-mcp serve --config f\nl2\n$ echo $?\n2\n",
                     [Run({}, ["serve"], ["l1"]), Run({}, ["serve", "--config", "f"], ["l2"], 2)],
                     id="exit-code-belongs-to-the-last-command"),
    ],
)
def test_documented_runs(console: str, runs: list[Run]) -> None:
    assert documented_runs(console) == runs


@pytest.mark.parametrize(
    "console",
    [
        pytest.param("$ python -m satgate_mcp serve\n", id="another-program"),
        pytest.param("output first\n$ satgate-mcp serve\n", id="output-before-a-command"),
    ],
)
def test_documented_runs_refuse_what_they_cannot_check(console: str) -> None:
    with pytest.raises(AssertionError):
        documented_runs(console)


@pytest.mark.parametrize(
    ("shape", "line", "matches"),
    [
        pytest.param("a: invalid <V>[ (<where>)]: <what>", "a: invalid X: y", True, id="optional-part-absent"),
        pytest.param("a: invalid <V>[ (<where>)]: <what>", 'a: invalid X ("k"): y', True, id="optional-part-there"),
        pytest.param("a: invalid <V>: <what>", "b: invalid X: y", False, id="fixed-text-differs"),
        pytest.param("a: e.g. <flag> <value>", "a: e.g. --port 9100", True, id="two-holes"),
        pytest.param("a: (did you mean <S>?)", "a: (did you mean X?) more", False, id="whole-line"),
    ],
)
def test_shape_pattern(shape: str, line: str, matches: bool) -> None:
    assert bool(shape_pattern(shape).match(line)) is matches


def test_quoted_lines_join_a_wrapped_span_and_skip_shapes() -> None:
    markdown = "say `satgate-mcp: invalid X: y;\ne.g. X=1` not `satgate-mcp: invalid <X>` nor `X=1`"
    assert quoted_lines(markdown) == ["satgate-mcp: invalid X: y; e.g. X=1"]


# --- the docs against serve ---------------------------------------------------------------------------------------


def test_operations_documents_refused_starts_and_their_shapes() -> None:
    runs = operations_runs()
    assert len(runs) >= 3, "docs/operations.md's start-up failures section lost its console example"
    assert all(run.stderr for run in runs)
    assert any(run.exit_code is not None for run in runs), "show the exit code once (`$ echo $?`)"
    assert shapes()


@pytest.mark.parametrize("run", operations_runs(), ids=lambda run: " ".join([*run.env, *run.argv]))
def test_a_documented_start_up_failure_is_what_serve_prints(
    run: Run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Run as documented, in an empty folder with no other SATGATE_* set; every one is a refused configuration."""
    for name in list(os.environ):
        if name.upper().startswith("SATGATE_"):
            monkeypatch.delenv(name)
    for name, value in run.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    started: list[Settings] = []

    def serve(settings: Settings) -> ExitCode:
        started.append(settings)
        return ExitCode.OK

    stub_daemon(monkeypatch, serve)
    code = cli.main(run.argv)
    assert capsys.readouterr().err.splitlines() == run.stderr
    assert code == (ExitCode.CONFIG if run.exit_code is None else run.exit_code)
    assert started == []


def test_every_documented_line_has_a_documented_shape_and_every_shape_an_example() -> None:
    patterns = [shape_pattern(shape) for shape in shapes()]
    lines = [line for run in operations_runs() for line in run.stderr]
    assert [line for line in lines if not any(p.match(line) for p in patterns)] == []
    assert [p.pattern for p in patterns if not any(p.match(line) for line in lines)] == []


def test_the_lines_configuration_md_quotes_are_ones_serve_prints() -> None:
    """Its intro quotes lines of operations.md's examples, which the test above runs."""
    printed = {line for run in operations_runs() for line in run.stderr}
    quoted = quoted_lines(CONFIGURATION.read_text().split("<!-- settings table")[0])
    assert quoted
    assert [line for line in quoted if line not in printed] == []

"""The bench package's pure parts (what its figures are computed and printed with), its one client against a
scripted server, and its two entry points. No gateway is started."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from bench import noop
from bench.calibration import (
    ISSUE_BASELINE_CPU_MS,
    CpuShare,
    at_issue_speed,
    baseline_cpu_ms,
    cpu_shares,
    machine_factor,
)
from bench.cli import build_parser
from bench.client import (
    ACCEPT_JSON,
    PROGRESS_CALL,
    Client,
    ToolCall,
    call_succeeded,
    client_session,
    jsonrpc_answer,
    sse_data,
    tool_call_request,
)
from bench.compare import estimated_seconds
from bench.load import server_cpu_per_call
from bench.processes import TASKSET, BenchServer, callgrind_total, make_auth, pin_plan, pinned
from bench.procfs import CLK_TCK, ProcStat, descendants, parse_proc_stat, rss_kib, tick_delta
from bench.render import (
    answer_paths,
    cpu_share,
    fmt,
    instructions_line,
    jsonable,
    markdown_table,
    pipes_line,
    plain_text,
    render_compare,
    table_row,
)
from bench.stats import (
    Report,
    RunLabel,
    Tally,
    cpu_ms_per_call,
    interleave,
    median,
    percentile,
    ratio,
    summarize,
    summarize_rounds,
    with_ratios,
)

REPO = Path(__file__).resolve().parents[1]
NAN = math.nan


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


@pytest.mark.parametrize(("values", "fraction", "expected"), [
    pytest.param([], 0.5, NAN, id="empty-is-nan"),
    pytest.param([7.0], 0.99, 7.0, id="one-value"),
    pytest.param([1.0, 2.0, 3.0, 4.0], 0.5, 2.0, id="p50-nearest-rank"),
    pytest.param([float(n) for n in range(1, 101)], 0.99, 99.0, id="p99-of-100"),
    pytest.param([1.0, 2.0], 0.0, 1.0, id="p0-is-min"),
    pytest.param([1.0, 2.0], 1.0, 2.0, id="p100-is-max"),
])
def test_percentile(values: list[float], fraction: float, expected: float) -> None:
    assert same(percentile(values, fraction), expected)


STAT_TAIL = "S 1 100 100 0 -1 4194560 500 0 0 0 {utime} {stime} 3 4 20 0 2 0 12345 1000000 2000 0 0"


@pytest.mark.parametrize(("line", "pid", "ppid", "ticks"), [
    pytest.param("42 (python) " + STAT_TAIL.format(utime=150, stime=25), 42, 1, 175, id="plain"),
    pytest.param("7 (my (odd) name) " + STAT_TAIL.format(utime=3, stime=4), 7, 1, 7, id="comm-with-parens"),
    pytest.param("9 (a b c) " + STAT_TAIL.format(utime=0, stime=0), 9, 1, 0, id="comm-with-spaces"),
    pytest.param("10 (x) " + STAT_TAIL.format(utime=5, stime=6) + "\n", 10, 1, 11, id="trailing-newline"),
])
def test_parse_proc_stat(line: str, pid: int, ppid: int, ticks: int) -> None:
    assert parse_proc_stat(line) == ProcStat(pid, ppid, ticks)


@pytest.mark.parametrize("line", [
    pytest.param("", id="empty"),
    pytest.param("12 (short) S 1 2", id="too-few-fields"),
])
def test_parse_proc_stat_refuses(line: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - both reasons are ValueError by design
        parse_proc_stat(line)


def test_parse_proc_stat_reads_this_process() -> None:
    stat = parse_proc_stat(Path("/proc/self/stat").read_text())
    assert stat.ticks >= 0
    assert stat.ppid > 0


@pytest.mark.parametrize(("root", "parent_of", "expected"), [
    pytest.param(1, {}, [], id="no-table"),
    pytest.param(10, {10: 1, 11: 10, 12: 10}, [11, 12], id="children"),
    pytest.param(10, {10: 1, 11: 10, 12: 11, 13: 12}, [11, 12, 13], id="grandchildren"),
    pytest.param(10, {10: 1, 11: 10, 20: 1, 21: 20}, [11], id="not-a-sibling's"),
])
def test_descendants(root: int, parent_of: dict[int, int], expected: list[int]) -> None:
    assert descendants(root, parent_of) == expected


@pytest.mark.parametrize(("before", "after", "expected"), [
    pytest.param({}, {}, 0, id="nothing"),
    pytest.param({1: 100}, {1: 130}, 30, id="one-process"),
    pytest.param({1: 100}, {1: 130, 2: 5}, 35, id="born-in-window-counts-from-zero"),
    pytest.param({1: 100, 2: 50}, {1: 130}, 30, id="died-in-window-is-lost"),
    pytest.param({1: 100}, {1: 10}, 10, id="pid-reused-counts-from-zero"),
])
def test_tick_delta(before: dict[int, int], after: dict[int, int], expected: int) -> None:
    assert tick_delta(before, after) == expected


@pytest.mark.parametrize(("ticks", "clk_tck", "calls", "expected"), [
    pytest.param(100, 100, 1000, 1.0, id="one-second-over-1000-calls"),
    pytest.param(5, 100, 10, 5.0, id="50ms-over-10"),
    pytest.param(5, 100, 0, NAN, id="no-calls"),
    pytest.param(5, 0, 10, NAN, id="no-clock"),
])
def test_cpu_ms_per_call(ticks: int, clk_tck: int, calls: int, expected: float) -> None:
    assert same(cpu_ms_per_call(ticks, clk_tck, calls), expected)


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("", [], id="empty"),
    pytest.param('event: message\ndata: {"a":1}\n\n', ['{"a":1}'], id="one-event"),
    pytest.param("data:x\r\n\r\ndata: y\r\n\r\n", ["x", "y"], id="crlf-and-no-space"),
    pytest.param("data: a\ndata: b\n\n", ["a\nb"], id="multi-line-data"),
    pytest.param(": keep-alive\nid: 3\nretry: 10\ndata: z", ["z"], id="comments-fields-unterminated"),
    pytest.param("id: 1\ndata:\n\n", [""], id="priming-event"),
])
def test_sse_data(body: str, expected: list[str]) -> None:
    assert sse_data(body) == expected


ANSWER = {"jsonrpc": "2.0", "id": 5, "result": {"content": [], "isError": False}}


@pytest.mark.parametrize(("content_type", "body", "request_id", "expected"), [
    pytest.param("application/json", json.dumps(ANSWER), 5, ANSWER, id="json"),
    pytest.param("application/json", json.dumps([ANSWER]), 5, ANSWER, id="json-batch"),
    pytest.param("application/json", json.dumps(ANSWER), 6, None, id="other-id"),
    pytest.param("application/json", "", 5, None, id="empty-body"),
    pytest.param("text/event-stream",
                 'id: p\ndata:\n\nevent: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\n\n'
                 f"event: message\ndata: {json.dumps(ANSWER)}\n\n", 5, ANSWER, id="sse-after-priming-and-progress"),
    pytest.param("text/event-stream", 'data: {"jsonrpc":"2.0","id":5,"error":{"code":-1}}\n\n', 5,
                 {"jsonrpc": "2.0", "id": 5, "error": {"code": -1}}, id="sse-error"),
    pytest.param("text/event-stream", 'data: {"jsonrpc":"2.0","id":5,"method":"roots/list"}\n\n', 5, None,
                 id="server-request-same-id-is-not-the-answer"),
])
def test_jsonrpc_answer(content_type: str, body: str, request_id: object, expected: object) -> None:
    assert jsonrpc_answer(content_type, body.encode(), request_id) == expected


@pytest.mark.parametrize(("message", "ok"), [
    pytest.param(ANSWER, True, id="result"),
    pytest.param({"id": 1, "result": {"isError": True}}, False, id="tool-error"),
    pytest.param({"id": 1, "error": {"code": -32000}}, False, id="jsonrpc-error"),
    pytest.param(None, False, id="no-answer"),
])
def test_call_succeeded(message: dict[str, Any] | None, ok: bool) -> None:
    assert call_succeeded(message) is ok


@pytest.mark.parametrize(("rounds", "targets", "expected"), [
    pytest.param(1, ("a", "b"), [(1, "a"), (1, "b")], id="one-round"),
    pytest.param(2, ("a", "b"), [(1, "a"), (1, "b"), (2, "a"), (2, "b")], id="interleaved-not-grouped"),
    pytest.param(0, ("a",), [], id="no-rounds"),
])
def test_interleave(rounds: int, targets: tuple[str, ...], expected: list[tuple[int, str]]) -> None:
    assert interleave(rounds, targets) == expected


def test_interleave_default_targets() -> None:
    assert [t for _, t in interleave(1)] == ["baseline", "gateway-none", "gateway-header"]


@pytest.mark.parametrize(("value", "base", "expected"), [
    pytest.param(50.0, 100.0, 0.5, id="half"),
    pytest.param(50.0, 0.0, NAN, id="zero-base"),
    pytest.param(NAN, 100.0, NAN, id="nan-value"),
    pytest.param(1.0, NAN, NAN, id="nan-base"),
])
def test_ratio(value: float, base: float, expected: float) -> None:
    assert same(ratio(value, base), expected)


@pytest.mark.parametrize(("values", "expected"), [
    pytest.param([], NAN, id="empty"),
    pytest.param([3.0, 1.0, 2.0], 2.0, id="odd"),
    pytest.param([4.0, 1.0, 3.0, 2.0], 2.5, id="even"),
    pytest.param([NAN, 5.0], 5.0, id="nan-ignored"),
])
def test_median(values: list[float], expected: float) -> None:
    assert same(median(values), expected)


@pytest.mark.parametrize(("value", "digits", "expected"), [
    pytest.param(1234.5678, 1, "1,234.6", id="thousands"),
    pytest.param(0.12345, 3, "0.123", id="digits"),
    pytest.param(NAN, 2, "n/a", id="nan"),
    pytest.param(None, 2, "n/a", id="none"),
])
def test_fmt(value: float | None, digits: int, expected: str) -> None:
    assert fmt(value, digits) == expected


def test_with_ratios_and_summary() -> None:
    rows = [
        {"round": 1, "target": "baseline", "calls_per_second": 100.0, "p50_ms": 2.0, "errors": 0},
        {"round": 1, "target": "gateway-none", "calls_per_second": 50.0, "p50_ms": 4.0, "errors": 1},
        {"round": 2, "target": "baseline", "calls_per_second": 200.0, "p50_ms": 1.0, "errors": 0},
        {"round": 2, "target": "gateway-none", "calls_per_second": 150.0, "p50_ms": 3.0, "errors": 0},
        {"round": 3, "target": "gateway-none", "calls_per_second": 10.0, "p50_ms": 9.0, "errors": 0},
    ]
    rated = with_ratios(rows)
    assert [r["ratio"] for r in rated[:4]] == [1.0, 0.5, 1.0, 0.75]
    assert math.isnan(rated[4]["ratio"])  # no baseline in its round: no ratio, never another round's
    summary = summarize_rounds(rated)
    assert list(summary) == ["baseline", "gateway-none"]
    assert summary["gateway-none"]["ratio"] == pytest.approx(0.625)  # median of per-round ratios
    assert summary["gateway-none"]["calls_per_second"] == 50.0
    assert summary["gateway-none"]["errors"] == 1
    assert math.isnan(summary["baseline"]["server_cpu_ms_per_call"])  # not measured: n/a, not zero


def test_table_row_and_markdown() -> None:
    row = table_row("r1 gateway-none", {"calls_per_second": 1500.0, "ratio": 0.5, "p50_ms": 1.0,
                                               "p99_ms": 9.0, "sequential_p50_ms": 0.7,
                                               "server_cpu_ms_per_call": 0.9, "server_main_cpu_ms_per_call": 0.6,
                                               "server_children_cpu_ms_per_call": 0.3,
                                               "initialize_per_second": NAN, "loadgen_cpu_pct": 40.0,
                                               "errors": 2})
    assert row == ["r1 gateway-none", "1,500.0", "0.50", "1.00", "9.00", "0.70", "0.900 (0.600 + 0.300)", "n/a",
                   "40 %", "2"]
    table = markdown_table(["a", "long header"], [["xyz", "1"]]).splitlines()
    assert table == ["| a   | long header |", "|-----|-------------|", "| xyz | 1           |"]
    assert markdown_table(["a"], []).splitlines() == ["| a |", "|---|"]


def test_cpu_share_sets_the_gateway_process_beside_the_baseline_and_the_issue_machine() -> None:
    summary = {"baseline": {"server_main_cpu_ms_per_call": 1.4},
               "gateway-none": {"server_main_cpu_ms_per_call": 0.7},
               "gateway-header": {"server_main_cpu_ms_per_call": NAN}}
    line = cpu_share(summary)
    assert "gateway-none 0.700 ms = 0.50x (~0.14 ms on the issue's machine)" in line
    assert "gateway-header" not in line  # not measured: left out, never shown as zero
    assert "0.71x" in line  # the issue's own 0.20 / 0.28
    assert cpu_share({"gateway-none": {"server_main_cpu_ms_per_call": 0.7}}) == ""  # no baseline, no share
    assert cpu_share({"baseline": {"server_main_cpu_ms_per_call": NAN},
                            "gateway-none": {"server_main_cpu_ms_per_call": 0.7}}) == ""


def test_the_pipes_line_tells_the_machine_factor_and_scales_the_gateway_cpu_by_it() -> None:
    pipes = {"calls_per_second": 1991.0, "cpu_ms_per_call": 0.5, "errors": 0, "issue_calls_per_second": 5973.0,
             "machine_factor": 3.0}
    summary = {"baseline": {"server_main_cpu_ms_per_call": 1.2},
               "gateway-none": {"server_main_cpu_ms_per_call": 0.54},
               "gateway-header": {"server_main_cpu_ms_per_call": NAN}}
    line = pipes_line(pipes, summary)
    assert "1,991.0 calls/s" in line
    assert "3.00x slower" in line
    assert "gateway-none 0.180 ms" in line
    assert "(target 0.2 ms)" in line
    assert "gateway-header" not in line  # not measured: never scaled from nothing
    assert "at the issue machine's speed" not in pipes_line(pipes)  # no rounds: the factor alone


def test_the_instruction_line_sets_each_gateway_beside_the_baseline() -> None:
    line = instructions_line({
        "baseline": {"per_call": 4_000_000.0, "calls": 400, "errors": 0},
        "none": {"per_call": 1_200_000.0, "calls": 400, "errors": 0},
        "header": {"per_call": 1_280_000.0, "calls": 400, "errors": 1}})
    assert "baseline 4.000 M (400 calls, 0 errors)" in line
    assert "none 1.200 M = 0.30x the baseline's" in line
    assert "header 1.280 M = 0.32x the baseline's (400 calls, 1 errors)" in line
    alone = instructions_line({"none": {"per_call": 1_200_000.0, "calls": 400, "errors": 0}})
    assert "x the baseline's" not in alone  # no baseline counted: no share


@pytest.mark.parametrize(("taskset", "cpus", "server", "client", "says"), [
    pytest.param("/usr/bin/taskset", [0, 1], 0, 1, "CPU 0", id="two-cpus"),
    pytest.param("/usr/bin/taskset", [2, 5, 7], 2, 5, "CPU 2", id="first-two-allowed"),
    pytest.param("/usr/bin/taskset", [0], None, None, "only 1 CPU", id="one-cpu"),
    pytest.param(None, [0, 1], None, None, "taskset not found", id="no-taskset"),
])
def test_pin_plan(taskset: str | None, cpus: list[int], server: int | None, client: int | None, says: str) -> None:
    plan = pin_plan(taskset, cpus)
    assert (plan.server_cpu, plan.client_cpu) == (server, client)
    assert says in plan.note


def test_jsonable_turns_nan_into_null() -> None:
    value = {"a": NAN, "b": [1.0, NAN, (NAN,)], "c": {"d": "x"}}
    assert json.loads(json.dumps(jsonable(value))) == {"a": None, "b": [1.0, None, [None]], "c": {"d": "x"}}


@pytest.mark.parametrize(("text", "field_name", "expected"), [
    pytest.param("Name:\tpython\nVmRSS:\t  51200 kB\n", "VmRSS", 51200, id="rss"),
    pytest.param("VmHWM:\t 9 kB\n", "VmRSS", None, id="absent"),
])
def test_rss_kib(text: str, field_name: str, expected: int | None) -> None:
    assert rss_kib(text, field_name) == expected


def test_parser_keeps_the_old_mode_and_adds_compare() -> None:
    old = build_parser().parse_args(["--clients", "3", "--calls", "5", "--auth", "none"])
    assert (old.clients, old.calls, old.auth, old.compare, old.timeout) == (3, 5, "none", False, None)
    new = build_parser().parse_args(["--compare", "--duration", "2", "--rounds", "1", "--json"])
    assert (new.compare, new.duration, new.rounds, new.sessions, new.workers) == (True, 2.0, 1, 8, 16)
    assert estimated_seconds(new) > new.duration


def test_answer_paths_puts_sse_beside_json_with_the_ratio_and_what_answered() -> None:
    def figures(rate: float, kind: str) -> dict[str, Any]:
        return {"calls_per_second": rate, "p50_ms": 2.0, "sequential_p50_ms": 1.0, "server_cpu_ms_per_call": 0.25,
                "answer_types": {kind: 10}}

    line = answer_paths({"sse": figures(90.0, "text/event-stream"), "json": figures(100.0, "application/json")})
    assert line.startswith("SSE 90.0 calls/s")
    assert "answered text/event-stream" in line
    assert "answered application/json" in line
    assert line.endswith("(SSE/JSON calls/s 0.90)")


def test_the_soak_is_off_unless_asked_for_and_counts_in_the_estimate() -> None:
    plain = build_parser().parse_args(["--compare"])
    soaked = build_parser().parse_args(["--compare", "--soak", "600"])
    assert (plain.soak, soaked.soak) == (0.0, 600.0)
    assert estimated_seconds(soaked) >= estimated_seconds(plain) + 600


def test_the_instruction_count_is_off_unless_asked_for_and_counts_in_the_estimate() -> None:
    plain = build_parser().parse_args(["--compare"])
    counted = build_parser().parse_args(["--compare", "--instructions", "400"])
    assert (plain.instructions, counted.instructions) == (0, 400)
    assert estimated_seconds(counted) > estimated_seconds(plain)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("version: 1\nevents: Ir\nsummary: 1234\ntotals: 5678\n", 5678, id="totals-win"),
    pytest.param("events: Ir\nsummary: 1234\n", 1234, id="summary-alone"),
    pytest.param("events: Ir\nfn=(1) main\n0 3\n", None, id="neither"),
    pytest.param("totals: lots\n", None, id="not-a-number"),
])
def test_callgrind_total(text: str, expected: int | None) -> None:
    assert callgrind_total(text) == expected


def test_the_paired_one_call_phase_runs_by_default_and_can_be_skipped() -> None:
    default = build_parser().parse_args(["--compare"])
    skipped = build_parser().parse_args(["--compare", "--paired-calls", "0"])
    assert (default.paired_calls, skipped.paired_calls) == (300, 0)
    assert estimated_seconds(default) > estimated_seconds(skipped)


MAIN_CPU = "server_main_cpu_ms_per_call"


@pytest.mark.parametrize(("pipes_calls_per_second", "expected"), [
    pytest.param(5973.0, 1.0, id="the-issue's-machine"),
    pytest.param(1991.0, 3.0, id="three-times-slower"),
    pytest.param(11946.0, 0.5, id="twice-as-fast"),
    pytest.param(0.0, NAN, id="no-calls"),
    pytest.param(NAN, NAN, id="not-measured"),
])
def test_machine_factor(pipes_calls_per_second: float, expected: float) -> None:
    assert same(machine_factor(pipes_calls_per_second), expected)


@pytest.mark.parametrize(("summary", "expected"), [
    pytest.param({"baseline": {MAIN_CPU: 1.4}, "gateway-none": {MAIN_CPU: 0.7}},
                 [("gateway-none", 0.7, 0.5, 0.5 * ISSUE_BASELINE_CPU_MS)], id="half-the-baseline"),
    pytest.param({"baseline": {MAIN_CPU: 1.0}, "gateway-none": {MAIN_CPU: 0.5}, "gateway-header": {MAIN_CPU: 2.0}},
                 [("gateway-none", 0.5, 0.5, 0.14), ("gateway-header", 2.0, 2.0, 0.56)], id="in-summary-order"),
    pytest.param({"gateway-none": {MAIN_CPU: 0.7}}, [], id="no-baseline"),
    pytest.param({"baseline": {MAIN_CPU: 0.0}, "gateway-none": {MAIN_CPU: 0.7}}, [], id="zero-baseline"),
    pytest.param({"baseline": {MAIN_CPU: 1.0}, "gateway-none": {MAIN_CPU: NAN}, "gateway-header": {}}, [],
                 id="gateways-not-measured"),
])
def test_cpu_shares(summary: dict[str, dict[str, float]], expected: list[tuple[str, float, float, float]]) -> None:
    shares = cpu_shares(summary)
    assert all(isinstance(s, CpuShare) for s in shares)
    assert [s.target for s in shares] == [e[0] for e in expected]
    assert [(s.ms, s.share, s.at_issue_ms) for s in shares] == [pytest.approx(e[1:]) for e in expected]


@pytest.mark.parametrize(("summary", "factor", "expected"), [
    pytest.param({"baseline": {MAIN_CPU: 1.2}, "gateway-none": {MAIN_CPU: 0.54}}, 3.0, [("gateway-none", 0.18)],
                 id="scaled-baseline-left-out"),
    pytest.param({"gateway-none": {MAIN_CPU: 0.54}}, NAN, [], id="no-factor"),
    pytest.param({"gateway-none": {MAIN_CPU: 0.54}}, 0.0, [], id="zero-factor"),
    pytest.param({"gateway-none": {}, "gateway-header": {MAIN_CPU: NAN}}, 2.0, [], id="not-measured"),
])
def test_at_issue_speed(summary: dict[str, dict[str, float]], factor: float,
                        expected: list[tuple[str, float]]) -> None:
    scaled = at_issue_speed(summary, factor)
    assert [t for t, _ in scaled] == [t for t, _ in expected]
    assert [ms for _, ms in scaled] == pytest.approx([ms for _, ms in expected])


@pytest.mark.parametrize(("summary", "expected"), [
    pytest.param({"baseline": {MAIN_CPU: 0.28}}, 0.28, id="measured"),
    pytest.param({"baseline": {}}, NAN, id="not-measured"),
    pytest.param({}, NAN, id="no-baseline"),
])
def test_baseline_cpu_ms(summary: dict[str, dict[str, float]], expected: float) -> None:
    assert same(baseline_cpu_ms(summary), expected)


@pytest.mark.parametrize(("pid", "main_ticks", "kid_ticks", "calls", "expected"), [
    pytest.param(None, 10, 10, 100, (NAN, NAN, NAN), id="warm-up-not-watched"),
    pytest.param(1, CLK_TCK, 0, 1000, (1.0, 1.0, 0.0), id="process-only"),
    pytest.param(1, CLK_TCK, CLK_TCK, 1000, (2.0, 1.0, 1.0), id="process-and-children"),
    pytest.param(1, 5, 5, 0, (NAN, NAN, NAN), id="no-calls"),
])
def test_server_cpu_per_call(pid: int | None, main_ticks: int, kid_ticks: int, calls: int,
                             expected: tuple[float, float, float]) -> None:
    figures = server_cpu_per_call(pid, main_ticks, kid_ticks, calls)
    assert list(figures) == ["server_cpu_ms_per_call", "server_main_cpu_ms_per_call",
                             "server_children_cpu_ms_per_call"]
    assert all(same(got, want) for got, want in zip(figures.values(), expected, strict=True))


LABEL = RunLabel(clients=2, calls_per_client=2, client_kind="raw", auth="header")


@pytest.mark.parametrize(("tallies", "seconds", "ok", "errors", "p50", "p90", "top", "per_second"), [
    pytest.param([Tally([1.0, 3.0]), Tally([4.0, 2.0], errors=1)], 2.0, 3, 1, 2.0, 4.0, 4.0, 2.0, id="pooled"),
    pytest.param([Tally(), Tally()], 1.0, 0, 0, NAN, NAN, NAN, 0.0, id="no-calls"),
    pytest.param([Tally([5.0])], 0.0, 1, 0, 5.0, 5.0, 5.0, NAN, id="no-time"),
])
def test_summarize(tallies: list[Tally], seconds: float, ok: int, errors: int, p50: float, p90: float, top: float,
                   per_second: float) -> None:
    report = summarize(tallies, seconds, LABEL, (1, 2, 3))
    assert (report.ok, report.errors, report.rss_before_kib, report.rss_after_kib, report.rss_peak_kib) == (
        ok, errors, 1, 2, 3)
    assert all(same(a, b) for a, b in [(report.p50_ms, p50), (report.p90_ms, p90), (report.max_ms, top),
                                        (report.calls_per_second, per_second)])


@pytest.mark.parametrize(("rss", "seconds", "lines"), [
    pytest.param((51200, 52224, 53248), 2.0, ["throughput   2.0 calls/s",
                                               "gateway RSS  before 50.0 MiB, after 51.0 MiB (peak 52.0 MiB)"],
                 id="memory-read"),
    pytest.param((None, None, None), 0.0, ["throughput   nan calls/s",
                                           "gateway RSS  before n/a, after n/a (peak n/a)"], id="nothing-read"),
])
def test_plain_text(rss: tuple[int | None, int | None, int | None], seconds: float, lines: list[str]) -> None:
    report = Report(2, 2, "raw", "header", 3, 1, seconds, 2.0, 4.0, 4.0, 4.5, *rss)
    text = plain_text(report).splitlines()
    assert text[:2] == ["satgate-mcp bench: 2 clients x 2 calls (raw client, auth=header)",
                        f"calls        3 ok, 1 errors in {seconds:.3f} s"]
    assert text[3] == "latency      p50 2.00 ms   p90 4.00 ms   p99 4.00 ms   max 4.50 ms"
    assert [text[2], text[4]] == lines


def compare_report(rounds: int, **extra: Any) -> dict[str, Any]:
    rows = [{"round": r, "target": t, "calls_per_second": 100.0, "errors": 0, "server_cpu_pct": 99.0,
             MAIN_CPU: 1.0, "answer_types": {"text/event-stream": 3} if t == "baseline" else {}}
            for r in range(1, rounds + 1) for t in ("baseline", "gateway-none")]
    return {"config": {"sessions": 8, "workers": 16, "duration": 2.0, "rounds": rounds, "init_seconds": 1.0},
            "pinning": "not pinned", "rounds": rows, **extra}


IDLE = {"sessions": 500, "seconds": 0.3, "errors": 0, "rss_before_kib": 100.0, "rss_after_kib": 600.0,
        "kib_per_session": 1.0}


@pytest.mark.parametrize(("report", "present", "absent"), [
    pytest.param(compare_report(1), ["## Per round", "| r1 gateway-none ", "answers text/event-stream",
                                     "Server CPU share during round 1's load: baseline 99 %, gateway-none 99 %"],
                 ["## Median over rounds", "## Gateway only", "incomplete"], id="one-round"),
    pytest.param(compare_report(2), ["## Median over rounds", "| gateway-none ", "Gateway process CPU per call"],
                 ["## Gateway only"], id="medians-and-share"),
    pytest.param(compare_report(1, idle=IDLE, error="gave up after 9s"),
                 ["## Gateway only (auth=header)", "**1.00 KiB per session**", "**incomplete: gave up after 9s**"],
                 ["## Median over rounds"], id="gateway-only-then-cut-short"),
    pytest.param(compare_report(1, sse={"answers_when_both_accepted": "application/json"}),
                 ["- echo answer path: SSE n/a (the gateway answers application/json when the client accepts both)"],
                 ["progress notification"], id="sse-not-offered"),
    pytest.param({**compare_report(1), "rounds": []}, ["## Per round"], ["Server CPU share"], id="nothing-measured"),
])
def test_render_compare(report: dict[str, Any], present: list[str], absent: list[str]) -> None:
    text = render_compare(report)
    assert text.startswith("# satgate-mcp compare: 8 sessions, 16 workers, echo tool, 2 s per load phase")
    assert [p for p in present if p not in text] == []
    assert [a for a in absent if a in text] == []


@pytest.mark.parametrize(("request_id", "tool", "params"), [
    pytest.param(7, None, {"name": "echo", "arguments": {"text": "call 7"}}, id="echo-distinct-per-call"),
    pytest.param(8, ToolCall("add", {"a": 1}), {"name": "add", "arguments": {"a": 1}}, id="another-tool"),
    pytest.param(9, PROGRESS_CALL, {"name": "slow", "arguments": {"steps": 1, "delay": 0},
                                    "_meta": {"progressToken": "p9"}}, id="progress-token"),
])
def test_tool_call_request(request_id: int, tool: ToolCall | None, params: dict[str, Any]) -> None:
    assert tool_call_request(request_id, tool) == {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                                   "params": params}


@pytest.mark.parametrize(("argv", "cpu"), [
    pytest.param(["a", "b"], None, id="unpinned"),
    pytest.param(["a", "b"], 1, id="pinned"),
])
def test_pinned(argv: list[str], cpu: int | None) -> None:
    assert pinned(argv, cpu) == (argv if cpu is None else [TASKSET, "-c", str(cpu), *argv])


@pytest.mark.parametrize(("mode", "keys", "distinct_tokens"), [
    pytest.param("none", {"SATGATE_AUTH_MODE"}, 0, id="none-no-tokens"),
    pytest.param("config", {"SATGATE_AUTH_MODE", "SATGATE_STATIC_TOKEN"}, 1, id="config-one-shared-token"),
    pytest.param("header", {"SATGATE_AUTH_MODE", "SATGATE_ROOT_KEY"}, 3, id="header-a-macaroon-each"),
])
def test_make_auth(mode: str, keys: set[str], distinct_tokens: int) -> None:
    auth = make_auth(mode, 3)
    assert (set(auth.env), auth.env["SATGATE_AUTH_MODE"], len(auth.tokens)) == (keys, mode, 3)
    assert len({t for t in auth.tokens if t is not None}) == distinct_tokens


def scripted_mcp(answer_as: str, seen: list[tuple[str, str | None]]) -> web.Application:
    """An MCP endpoint answering ``tools/call`` as JSON or on an SSE stream (after a priming event), as the
    gateway and the SDK server both may: the one client must read either."""
    async def post(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        seen.append((message["method"], request.headers.get("Mcp-Session-Id")))
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] == "initialize":
            return web.json_response({"jsonrpc": "2.0", "id": message["id"],
                                      "result": {"protocolVersion": "2025-11-25"}}, headers={"Mcp-Session-Id": "s1"})
        answer = {"jsonrpc": "2.0", "id": message["id"],
                  "result": {"content": [], "isError": message["params"]["name"] != "echo"}}
        if answer_as == "json":
            return web.json_response(answer)
        return web.Response(text=f"id: 0\ndata:\n\nevent: message\ndata: {json.dumps(answer)}\n\n",
                            content_type="text/event-stream")

    async def delete(request: web.Request) -> web.StreamResponse:
        seen.append(("DELETE", request.headers.get("Mcp-Session-Id")))
        return web.Response()

    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_delete("/mcp", delete)
    return app


@pytest.mark.parametrize(("answer_as", "content_type"), [
    pytest.param("json", "application/json", id="json"),
    pytest.param("sse", "text/event-stream", id="sse"),
])
async def test_the_one_client_opens_calls_and_closes(aiohttp_server: AiohttpServer, answer_as: str,
                                                      content_type: str) -> None:
    seen: list[tuple[str, str | None]] = []
    server = await aiohttp_server(scripted_mcp(answer_as, seen))
    async with client_session(1) as http:
        client = Client(http, str(server.make_url("/mcp")))
        session = await client.open("tok")
        assert (session.id, session.headers["Authorization"], session.headers["MCP-Protocol-Version"]) == (
            "s1", "Bearer tok", "2025-11-25")
        assert await client.call(session) == (True, content_type)
        assert await client.call(session, ACCEPT_JSON, ToolCall("fails", {})) == (False, content_type)
        await client.close(session)
    assert seen == [("initialize", None), ("notifications/initialized", "s1"), ("tools/call", "s1"),
                    ("tools/call", "s1"), ("DELETE", "s1")]


async def test_the_one_client_refuses_a_session_it_was_not_given(aiohttp_server: AiohttpServer) -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": "no"}, status=401)

    app = web.Application()
    app.router.add_post("/mcp", refuse)
    server = await aiohttp_server(app)
    async with client_session(1) as http:
        with pytest.raises(RuntimeError, match=r"initialize at .* answered 401"):
            await Client(http, str(server.make_url("/mcp"))).open(None)


@pytest.mark.process
@pytest.mark.parametrize("entry", [
    pytest.param(["scripts/bench.py"], id="the-script-named-in-docs"),
    pytest.param(["-m", "bench"], id="the-package"),
])
def test_both_entry_points_offer_the_same_options(entry: list[str]) -> None:
    done = subprocess.run([sys.executable, *entry, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    options = done.stdout.split("\n\n", 1)[1]  # past the usage line, whose program name differs
    assert options == build_parser().format_help().split("\n\n", 1)[1]


@pytest.mark.parametrize(("message", "expected"), [
    ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
     {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                                             "serverInfo": {"name": "noop", "version": "1"}}}),
    ({"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}},
     {"jsonrpc": "2.0", "id": "a", "result": {"content": [{"type": "text", "text": "hi"}], "isError": False}}),
    ({"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "result": {}}),
    ({"jsonrpc": "2.0", "method": "notifications/initialized"}, None),
    ([{"jsonrpc": "2.0", "id": 3, "method": "ping"}], None),
])
def test_the_ceiling_answers_each_request_with_a_canned_result(message: object, expected: object) -> None:
    reply = noop.answer(message)
    assert (None if reply is None else json.loads(reply)) == expected


def test_the_baseline_is_the_direct_server_unless_asked_otherwise() -> None:
    assert build_parser().parse_args(["--compare"]).baseline == "direct"
    assert build_parser().parse_args(["--compare", "--baseline", "test-upstream"]).baseline == "test-upstream"


@pytest.mark.process
async def test_the_direct_baseline_and_the_ceiling_serve_a_session_and_an_echo(tmp_path: Path) -> None:
    for module in ("direct", "noop"):
        server = BenchServer(module, tmp_path, name=module)
        server.start()
        try:
            async with client_session(1) as http:
                await server.wait_ready(http)
                client = Client(http, server.mcp_url)
                session = await client.open(None)
                assert await client.call(session) == (True, "application/json")
        finally:
            server.stop()


def test_tracing_modes_set_only_what_each_needs() -> None:
    from bench.tracing import tracing_env

    assert tracing_env("off", 4318) == {"SATGATE_TRACING": "off"}
    on = tracing_env("otlp", 4318)
    assert on["SATGATE_TRACING"] == "otlp"
    assert on["OTEL_TRACES_SAMPLER"] == "always_on"
    assert on["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"


def test_tracing_summary_sets_the_modes_side_by_side_with_the_difference() -> None:
    from bench.tracing import render, summary

    def run(mode: str, cpu: float) -> dict[str, Any]:
        return {"mode": mode, "server_main_cpu_ms_per_call": cpu, "calls_per_second": 1000.0, "p50_ms": 2.0,
                "errors": 0}

    result = summary([run("off", 0.5), run("otlp", 0.52), run("off", 0.7), run("otlp", 0.74)])
    assert result["off"]["cpu_ms_per_call"] == pytest.approx(0.6)
    assert result["otlp_minus_off_cpu_ms_per_call"] == pytest.approx(0.03)
    text = render({**result, "received_posts": 3, "received_bytes": 1000})
    assert "otlp - off: +0.0300 ms" in text
    assert summary([run("off", math.nan), run("otlp", 0.5)])["within_allowance"] is None


async def test_the_oauth_target_mints_tokens_its_gateway_verifies() -> None:
    from bench.phases import oauth_auth
    from satgate_mcp.auth.base import AuthOutcome
    from satgate_mcp.auth.oauth import JwtAuthenticator, OAuthPolicy
    from satgate_mcp.stores.memory import MemoryRevocationStore

    async with oauth_auth(2) as auth:
        assert auth.env["SATGATE_AUTH_MODE"] == "oauth"
        policy = OAuthPolicy(issuer=auth.env["SATGATE_OAUTH_ISSUER"], audiences=(auth.env["SATGATE_OAUTH_AUDIENCE"],))
        verifier = JwtAuthenticator(policy, MemoryRevocationStore())
        outcomes = [(await verifier.authenticate(f"Bearer {token}")).outcome for token in auth.tokens]
        await verifier.aclose()
    assert outcomes == [AuthOutcome.OK, AuthOutcome.OK]

"""The pure parts of scripts/bench.py: what its figures are computed and printed with. No process is started."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_PATH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


def _load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("satgate_bench", BENCH_PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
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
    assert same(bench.percentile(values, fraction), expected)


STAT_TAIL = "S 1 100 100 0 -1 4194560 500 0 0 0 {utime} {stime} 3 4 20 0 2 0 12345 1000000 2000 0 0"


@pytest.mark.parametrize(("line", "pid", "ppid", "ticks"), [
    pytest.param("42 (python) " + STAT_TAIL.format(utime=150, stime=25), 42, 1, 175, id="plain"),
    pytest.param("7 (my (odd) name) " + STAT_TAIL.format(utime=3, stime=4), 7, 1, 7, id="comm-with-parens"),
    pytest.param("9 (a b c) " + STAT_TAIL.format(utime=0, stime=0), 9, 1, 0, id="comm-with-spaces"),
    pytest.param("10 (x) " + STAT_TAIL.format(utime=5, stime=6) + "\n", 10, 1, 11, id="trailing-newline"),
])
def test_parse_proc_stat(line: str, pid: int, ppid: int, ticks: int) -> None:
    assert bench.parse_proc_stat(line) == bench.ProcStat(pid, ppid, ticks)


@pytest.mark.parametrize("line", [
    pytest.param("", id="empty"),
    pytest.param("12 (short) S 1 2", id="too-few-fields"),
])
def test_parse_proc_stat_refuses(line: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - both reasons are ValueError by design
        bench.parse_proc_stat(line)


def test_parse_proc_stat_reads_this_process() -> None:
    stat = bench.parse_proc_stat(Path("/proc/self/stat").read_text())
    assert stat.ticks >= 0
    assert stat.ppid > 0


@pytest.mark.parametrize(("root", "parent_of", "expected"), [
    pytest.param(1, {}, [], id="no-table"),
    pytest.param(10, {10: 1, 11: 10, 12: 10}, [11, 12], id="children"),
    pytest.param(10, {10: 1, 11: 10, 12: 11, 13: 12}, [11, 12, 13], id="grandchildren"),
    pytest.param(10, {10: 1, 11: 10, 20: 1, 21: 20}, [11], id="not-a-sibling's"),
])
def test_descendants(root: int, parent_of: dict[int, int], expected: list[int]) -> None:
    assert bench.descendants(root, parent_of) == expected


@pytest.mark.parametrize(("before", "after", "expected"), [
    pytest.param({}, {}, 0, id="nothing"),
    pytest.param({1: 100}, {1: 130}, 30, id="one-process"),
    pytest.param({1: 100}, {1: 130, 2: 5}, 35, id="born-in-window-counts-from-zero"),
    pytest.param({1: 100, 2: 50}, {1: 130}, 30, id="died-in-window-is-lost"),
    pytest.param({1: 100}, {1: 10}, 10, id="pid-reused-counts-from-zero"),
])
def test_tick_delta(before: dict[int, int], after: dict[int, int], expected: int) -> None:
    assert bench.tick_delta(before, after) == expected


@pytest.mark.parametrize(("ticks", "clk_tck", "calls", "expected"), [
    pytest.param(100, 100, 1000, 1.0, id="one-second-over-1000-calls"),
    pytest.param(5, 100, 10, 5.0, id="50ms-over-10"),
    pytest.param(5, 100, 0, NAN, id="no-calls"),
    pytest.param(5, 0, 10, NAN, id="no-clock"),
])
def test_cpu_ms_per_call(ticks: int, clk_tck: int, calls: int, expected: float) -> None:
    assert same(bench.cpu_ms_per_call(ticks, clk_tck, calls), expected)


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("", [], id="empty"),
    pytest.param('event: message\ndata: {"a":1}\n\n', ['{"a":1}'], id="one-event"),
    pytest.param("data:x\r\n\r\ndata: y\r\n\r\n", ["x", "y"], id="crlf-and-no-space"),
    pytest.param("data: a\ndata: b\n\n", ["a\nb"], id="multi-line-data"),
    pytest.param(": keep-alive\nid: 3\nretry: 10\ndata: z", ["z"], id="comments-fields-unterminated"),
    pytest.param("id: 1\ndata:\n\n", [""], id="priming-event"),
])
def test_sse_data(body: str, expected: list[str]) -> None:
    assert bench.sse_data(body) == expected


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
    assert bench.jsonrpc_answer(content_type, body.encode(), request_id) == expected


@pytest.mark.parametrize(("message", "ok"), [
    pytest.param(ANSWER, True, id="result"),
    pytest.param({"id": 1, "result": {"isError": True}}, False, id="tool-error"),
    pytest.param({"id": 1, "error": {"code": -32000}}, False, id="jsonrpc-error"),
    pytest.param(None, False, id="no-answer"),
])
def test_call_succeeded(message: dict[str, Any] | None, ok: bool) -> None:
    assert bench.call_succeeded(message) is ok


@pytest.mark.parametrize(("rounds", "targets", "expected"), [
    pytest.param(1, ("a", "b"), [(1, "a"), (1, "b")], id="one-round"),
    pytest.param(2, ("a", "b"), [(1, "a"), (1, "b"), (2, "a"), (2, "b")], id="interleaved-not-grouped"),
    pytest.param(0, ("a",), [], id="no-rounds"),
])
def test_interleave(rounds: int, targets: tuple[str, ...], expected: list[tuple[int, str]]) -> None:
    assert bench.interleave(rounds, targets) == expected


def test_interleave_default_targets() -> None:
    assert [t for _, t in bench.interleave(1)] == ["baseline", "gateway-none", "gateway-header"]


@pytest.mark.parametrize(("value", "base", "expected"), [
    pytest.param(50.0, 100.0, 0.5, id="half"),
    pytest.param(50.0, 0.0, NAN, id="zero-base"),
    pytest.param(NAN, 100.0, NAN, id="nan-value"),
    pytest.param(1.0, NAN, NAN, id="nan-base"),
])
def test_ratio(value: float, base: float, expected: float) -> None:
    assert same(bench.ratio(value, base), expected)


@pytest.mark.parametrize(("values", "expected"), [
    pytest.param([], NAN, id="empty"),
    pytest.param([3.0, 1.0, 2.0], 2.0, id="odd"),
    pytest.param([4.0, 1.0, 3.0, 2.0], 2.5, id="even"),
    pytest.param([NAN, 5.0], 5.0, id="nan-ignored"),
])
def test_median(values: list[float], expected: float) -> None:
    assert same(bench.median(values), expected)


@pytest.mark.parametrize(("value", "digits", "expected"), [
    pytest.param(1234.5678, 1, "1,234.6", id="thousands"),
    pytest.param(0.12345, 3, "0.123", id="digits"),
    pytest.param(NAN, 2, "n/a", id="nan"),
    pytest.param(None, 2, "n/a", id="none"),
])
def test_fmt(value: float | None, digits: int, expected: str) -> None:
    assert bench.fmt(value, digits) == expected


def test_with_ratios_and_summary() -> None:
    rows = [
        {"round": 1, "target": "baseline", "calls_per_second": 100.0, "p50_ms": 2.0, "errors": 0},
        {"round": 1, "target": "gateway-none", "calls_per_second": 50.0, "p50_ms": 4.0, "errors": 1},
        {"round": 2, "target": "baseline", "calls_per_second": 200.0, "p50_ms": 1.0, "errors": 0},
        {"round": 2, "target": "gateway-none", "calls_per_second": 150.0, "p50_ms": 3.0, "errors": 0},
        {"round": 3, "target": "gateway-none", "calls_per_second": 10.0, "p50_ms": 9.0, "errors": 0},
    ]
    rated = bench.with_ratios(rows)
    assert [r["ratio"] for r in rated[:4]] == [1.0, 0.5, 1.0, 0.75]
    assert math.isnan(rated[4]["ratio"])  # no baseline in its round: no ratio, never another round's
    summary = bench.summarize_rounds(rated)
    assert list(summary) == ["baseline", "gateway-none"]
    assert summary["gateway-none"]["ratio"] == pytest.approx(0.625)  # median of per-round ratios
    assert summary["gateway-none"]["calls_per_second"] == 50.0
    assert summary["gateway-none"]["errors"] == 1
    assert math.isnan(summary["baseline"]["server_cpu_ms_per_call"])  # not measured: n/a, not zero


def test_table_row_and_markdown() -> None:
    row = bench.table_row("r1 gateway-none", {"calls_per_second": 1500.0, "ratio": 0.5, "p50_ms": 1.0,
                                               "p99_ms": 9.0, "sequential_p50_ms": 0.7,
                                               "server_cpu_ms_per_call": 0.9, "server_main_cpu_ms_per_call": 0.6,
                                               "server_children_cpu_ms_per_call": 0.3,
                                               "initialize_per_second": NAN, "loadgen_cpu_pct": 40.0,
                                               "errors": 2})
    assert row == ["r1 gateway-none", "1,500.0", "0.50", "1.00", "9.00", "0.70", "0.900 (0.600 + 0.300)", "n/a",
                   "40 %", "2"]
    table = bench.markdown_table(["a", "long header"], [["xyz", "1"]]).splitlines()
    assert table == ["| a   | long header |", "|-----|-------------|", "| xyz | 1           |"]
    assert bench.markdown_table(["a"], []).splitlines() == ["| a |", "|---|"]


def test_cpu_share_sets_the_gateway_process_beside_the_baseline_and_the_issue_machine() -> None:
    summary = {"baseline": {"server_main_cpu_ms_per_call": 1.4},
               "gateway-none": {"server_main_cpu_ms_per_call": 0.7},
               "gateway-header": {"server_main_cpu_ms_per_call": NAN}}
    line = bench.cpu_share(summary)
    assert "gateway-none 0.700 ms = 0.50x (~0.14 ms on the issue's machine)" in line
    assert "gateway-header" not in line  # not measured: left out, never shown as zero
    assert "0.71x" in line  # the issue's own 0.20 / 0.28
    assert bench.cpu_share({"gateway-none": {"server_main_cpu_ms_per_call": 0.7}}) == ""  # no baseline, no share
    assert bench.cpu_share({"baseline": {"server_main_cpu_ms_per_call": NAN},
                            "gateway-none": {"server_main_cpu_ms_per_call": 0.7}}) == ""


def test_the_pipes_line_tells_the_machine_factor_and_scales_the_gateway_cpu_by_it() -> None:
    pipes = {"calls_per_second": 1991.0, "cpu_ms_per_call": 0.5, "errors": 0, "issue_calls_per_second": 5973.0,
             "machine_factor": 3.0}
    summary = {"baseline": {"server_main_cpu_ms_per_call": 1.2},
               "gateway-none": {"server_main_cpu_ms_per_call": 0.54},
               "gateway-header": {"server_main_cpu_ms_per_call": NAN}}
    line = bench.pipes_line(pipes, summary)
    assert "1,991.0 calls/s" in line
    assert "3.00x slower" in line
    assert "gateway-none 0.180 ms" in line
    assert "(target 0.2 ms)" in line
    assert "gateway-header" not in line  # not measured: never scaled from nothing
    assert "at the issue machine's speed" not in bench.pipes_line(pipes)  # no rounds: the factor alone


def test_the_instruction_line_sets_each_gateway_beside_the_baseline() -> None:
    line = bench.instructions_line({
        "baseline": {"per_call": 4_000_000.0, "calls": 400, "errors": 0},
        "none": {"per_call": 1_200_000.0, "calls": 400, "errors": 0},
        "header": {"per_call": 1_280_000.0, "calls": 400, "errors": 1}})
    assert "baseline 4.000 M (400 calls, 0 errors)" in line
    assert "none 1.200 M = 0.30x the baseline's" in line
    assert "header 1.280 M = 0.32x the baseline's (400 calls, 1 errors)" in line
    alone = bench.instructions_line({"none": {"per_call": 1_200_000.0, "calls": 400, "errors": 0}})
    assert "x the baseline's" not in alone  # no baseline counted: no share


@pytest.mark.parametrize(("taskset", "cpus", "server", "client", "says"), [
    pytest.param("/usr/bin/taskset", [0, 1], 0, 1, "CPU 0", id="two-cpus"),
    pytest.param("/usr/bin/taskset", [2, 5, 7], 2, 5, "CPU 2", id="first-two-allowed"),
    pytest.param("/usr/bin/taskset", [0], None, None, "only 1 CPU", id="one-cpu"),
    pytest.param(None, [0, 1], None, None, "taskset not found", id="no-taskset"),
])
def test_pin_plan(taskset: str | None, cpus: list[int], server: int | None, client: int | None, says: str) -> None:
    plan = bench.pin_plan(taskset, cpus)
    assert (plan.server_cpu, plan.client_cpu) == (server, client)
    assert says in plan.note


def test_jsonable_turns_nan_into_null() -> None:
    value = {"a": NAN, "b": [1.0, NAN, (NAN,)], "c": {"d": "x"}}
    assert json.loads(json.dumps(bench.jsonable(value))) == {"a": None, "b": [1.0, None, [None]], "c": {"d": "x"}}


@pytest.mark.parametrize(("text", "field_name", "expected"), [
    pytest.param("Name:\tpython\nVmRSS:\t  51200 kB\n", "VmRSS", 51200, id="rss"),
    pytest.param("VmHWM:\t 9 kB\n", "VmRSS", None, id="absent"),
])
def test_rss_kib(text: str, field_name: str, expected: int | None) -> None:
    assert bench.rss_kib(text, field_name) == expected


def test_parser_keeps_the_old_mode_and_adds_compare() -> None:
    old = bench.build_parser().parse_args(["--clients", "3", "--calls", "5", "--auth", "none"])
    assert (old.clients, old.calls, old.auth, old.compare, old.timeout) == (3, 5, "none", False, None)
    new = bench.build_parser().parse_args(["--compare", "--duration", "2", "--rounds", "1", "--json"])
    assert (new.compare, new.duration, new.rounds, new.sessions, new.workers) == (True, 2.0, 1, 8, 16)
    assert bench.estimated_seconds(new) > new.duration


def test_answer_paths_puts_sse_beside_json_with_the_ratio_and_what_answered() -> None:
    def figures(rate: float, kind: str) -> dict[str, Any]:
        return {"calls_per_second": rate, "p50_ms": 2.0, "sequential_p50_ms": 1.0, "server_cpu_ms_per_call": 0.25,
                "answer_types": {kind: 10}}

    line = bench.answer_paths({"sse": figures(90.0, "text/event-stream"), "json": figures(100.0, "application/json")})
    assert line.startswith("SSE 90.0 calls/s")
    assert "answered text/event-stream" in line
    assert "answered application/json" in line
    assert line.endswith("(SSE/JSON calls/s 0.90)")


def test_the_soak_is_off_unless_asked_for_and_counts_in_the_estimate() -> None:
    plain = bench.build_parser().parse_args(["--compare"])
    soaked = bench.build_parser().parse_args(["--compare", "--soak", "600"])
    assert (plain.soak, soaked.soak) == (0.0, 600.0)
    assert bench.estimated_seconds(soaked) >= bench.estimated_seconds(plain) + 600


def test_the_instruction_count_is_off_unless_asked_for_and_counts_in_the_estimate() -> None:
    plain = bench.build_parser().parse_args(["--compare"])
    counted = bench.build_parser().parse_args(["--compare", "--instructions", "400"])
    assert (plain.instructions, counted.instructions) == (0, 400)
    assert bench.estimated_seconds(counted) > bench.estimated_seconds(plain)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("version: 1\nevents: Ir\nsummary: 1234\ntotals: 5678\n", 5678, id="totals-win"),
    pytest.param("events: Ir\nsummary: 1234\n", 1234, id="summary-alone"),
    pytest.param("events: Ir\nfn=(1) main\n0 3\n", None, id="neither"),
    pytest.param("totals: lots\n", None, id="not-a-number"),
])
def test_callgrind_total(text: str, expected: int | None) -> None:
    assert bench.callgrind_total(text) == expected


def test_the_paired_one_call_phase_runs_by_default_and_can_be_skipped() -> None:
    default = bench.build_parser().parse_args(["--compare"])
    skipped = bench.build_parser().parse_args(["--compare", "--paired-calls", "0"])
    assert (default.paired_calls, skipped.paired_calls) == (300, 0)
    assert bench.estimated_seconds(default) > bench.estimated_seconds(skipped)

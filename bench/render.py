"""Rendering: the figures as Markdown-ish text (or JSON-safe values), separate from measuring them so that every
line can be table-tested from a hand-made report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.calibration import (
    ISSUE_BASELINE_CPU_MS,
    ISSUE_CPU_TARGET_MS,
    at_issue_speed,
    baseline_cpu_ms,
    cpu_shares,
)
from bench.procfs import CLK_TCK
from bench.stats import Report, ratio, summarize_rounds, with_ratios

TABLE_HEADERS = ("target", "calls/s", "x baseline", "p50 ms", "p99 ms", "1-call p50 ms",
                 "server CPU ms/call (proc + children)", "initialize/s", "load-gen CPU", "errors")


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """A figure with thousands separators, or ``n/a`` for one that could not be had."""
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}{suffix}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, so the table reads as well in a terminal as rendered."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def table_row(label: str, figures: dict[str, Any]) -> list[str]:
    """One row of the per-round or median table under ``TABLE_HEADERS``."""
    def num(key: str, digits: int = 1) -> str:
        value = figures.get(key)
        return fmt(None if value is None else float(value), digits)

    cpu = (f"{num('server_cpu_ms_per_call', 3)} ({num('server_main_cpu_ms_per_call', 3)}"
           f" + {num('server_children_cpu_ms_per_call', 3)})")
    return [label, num("calls_per_second"), num("ratio", 2), num("p50_ms", 2), num("p99_ms", 2),
            num("sequential_p50_ms", 2), cpu, num("initialize_per_second"), num("loadgen_cpu_pct", 0) + " %",
            str(int(figures.get("errors") or 0))]


def jsonable(value: Any) -> Any:
    """NaN (a figure that could not be had) becomes null, so ``--json`` stays valid JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def plain_text(report: Report) -> str:
    """The default mode's report: throughput, latency percentiles and the gateway's memory."""
    def mib(kib: int | None) -> str:
        return "n/a" if kib is None else f"{kib / 1024:.1f} MiB"

    return "\n".join([
        f"satgate-mcp bench: {report.clients} clients x {report.calls_per_client} calls "
        f"({report.client_kind} client, auth={report.auth})",
        f"calls        {report.ok} ok, {report.errors} errors in {report.seconds:.3f} s",
        f"throughput   {report.calls_per_second:.1f} calls/s",
        f"latency      p50 {report.p50_ms:.2f} ms   p90 {report.p90_ms:.2f} ms   p99 {report.p99_ms:.2f} ms"
        f"   max {report.max_ms:.2f} ms",
        f"gateway RSS  before {mib(report.rss_before_kib)}, after {mib(report.rss_after_kib)}"
        f" (peak {mib(report.rss_peak_kib)})",
    ])


def cpu_share(summary: dict[str, dict[str, float]]) -> str:
    """The gateway process's CPU per call beside the baseline server's in the same run, as a share, and what that
    share would be on the machine the issue measured (its baseline 0.28 ms); "" without a baseline figure."""
    shares = cpu_shares(summary)
    if not shares:
        return ""
    parts = [f"{s.target} {fmt(s.ms, 3)} ms = {fmt(s.share, 2)}x (~{fmt(s.at_issue_ms, 2)} ms on the issue's machine)"
             for s in shares]
    return (f"Gateway process CPU per call (the stdio child apart) against the baseline server's "
            f"{fmt(baseline_cpu_ms(summary), 3)} ms: " + "; ".join(parts)
            + f". The issue's target {ISSUE_CPU_TARGET_MS:g} ms beside its baseline's "
            f"{ISSUE_BASELINE_CPU_MS:g} ms is {fmt(ISSUE_CPU_TARGET_MS / ISSUE_BASELINE_CPU_MS, 2)}x.")


#: What the gateways front, as the heading names it.
UPSTREAM_NAMES = {"direct": "the baseline's own server (bench/direct.py --stdio)",
                  "test-upstream": "tests/upstream_server.py"}


def floor_line(floor: dict[str, Any]) -> str:
    """The floor of any gateway in front of this upstream: the same program driven over its own pipes."""
    return (f"The gateways' upstream alone over its own pipes (the floor for any stdio gateway in front of it): "
            f"{fmt(floor['calls_per_second'])} calls/s, child CPU {fmt(floor['cpu_ms_per_call'], 3)} ms/call, "
            f"{floor['errors']} errors.")


def pipes_line(pipes: dict[str, Any], summary: dict[str, dict[str, float]] | None = None) -> str:
    """The calibration row: what this machine does with no HTTP and no gateway, beside the issue's figure, and
    the gateway process's CPU per call at the issue machine's speed by that factor."""
    factor = float(pipes["machine_factor"])
    line = (f"The stdio upstream over its own pipes (no HTTP, no gateway): {fmt(pipes['calls_per_second'])} calls/s, "
            f"child CPU {fmt(pipes['cpu_ms_per_call'], 3)} ms/call, {pipes['errors']} errors; the issue measured "
            f"{fmt(pipes['issue_calls_per_second'])} calls/s there, so this machine runs the same Python "
            f"{fmt(factor, 2)}x slower (below 1: faster).")
    scaled = [f"{target} {fmt(ms, 3)} ms" for target, ms in at_issue_speed(summary or {}, factor)]
    if scaled:
        line += (" Gateway process CPU per call at the issue machine's speed by that factor: " + ", ".join(scaled)
                 + f" (target {ISSUE_CPU_TARGET_MS:g} ms).")
    return line


def answer_paths(figures: dict[str, Any]) -> str:
    """The SSE and JSON answers to one kind of call, side by side, and their calls/s ratio."""
    parts = []
    for kind in ("sse", "json"):
        f = figures[kind]
        parts.append(f"{kind.upper()} {fmt(f['calls_per_second'])} calls/s, p50 {fmt(f['p50_ms'], 2)} ms, "
                     f"1-call p50 {fmt(f['sequential_p50_ms'], 2)} ms, "
                     f"CPU {fmt(f['server_cpu_ms_per_call'], 3)} ms/call, "
                     f"answered {'/'.join(sorted(f.get('answer_types') or {})) or 'n/a'}")
    paths = ratio(float(figures["sse"]["calls_per_second"]), float(figures["json"]["calls_per_second"]))
    return "; ".join(parts) + f" (SSE/JSON calls/s {fmt(paths, 2)})"


def instructions_line(instructions: dict[str, dict[str, Any]]) -> str:
    """Instructions per call of each target, the gateway's also as a share of the baseline's: the one ratio a
    noisy machine cannot move (the issue's CPU target, 0.20 ms beside its baseline's 0.28 ms, is 0.71x)."""
    base = float(instructions.get("baseline", {}).get("per_call", math.nan))
    parts = []
    for target, f in instructions.items():
        share = (f" = {fmt(f['per_call'] / base, 2)}x the baseline's" if target != "baseline" and base > 0 else "")
        parts.append(f"{target} {fmt(f['per_call'] / 1e6, 3)} M{share} ({f['calls']} calls, {f['errors']} errors)")
    return ("- instructions per call (callgrind; a gateway's process and threads, not its stdio child): "
            + ", ".join(parts))


def render_compare(report: dict[str, Any]) -> str:
    """The whole ``--compare`` report; a phase missing from ``report`` (skipped, or cut short) is left out."""
    rows = with_ratios(report["rounds"])
    out = compare_heading(report, rows) + round_tables(report["config"], rows)
    if report.get("ceiling"):
        out += ["", ceiling_line(report["ceiling"], rows)]
    if report.get("floor"):
        out += ["", floor_line(report["floor"])]
    pipes = report.get("pipes")
    if pipes:
        out += ["", pipes_line(pipes, summarize_rounds(rows) if rows else None)]
    busy = [f"{r['target']} {fmt(r.get('server_cpu_pct'), 0)} %" for r in rows if r["round"] == 1]
    if busy:
        out += ["", f"Server CPU share during round 1's load: {', '.join(busy)}. Well under 100 % while the load "
                "generator is not saturated either means the server's core was shared: the figures are noisy."]
    if any(report.get(k) for k in ("idle", "resume", "sse")):
        out += ["", "## Gateway only (auth=header)", ""]
    out += gateway_only_lines(report)
    if report.get("error"):
        out += ["", f"**incomplete: {report['error']}**"]
    return "\n".join(out)


BASELINES = {
    "direct": "the echo tool on the official SDK's low-level Server, JSON answers, stateful, uvicorn with uvloop "
              "and httptools (bench/direct.py)",
    "test-upstream": "tests/upstream_server.py alone over Streamable HTTP (official SDK)",
}


def ceiling_line(ceiling: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """The no-op server's figures: what the harness itself can carry, so the other rows read against it."""
    base = [float(r["calls_per_second"]) for r in rows if r["target"] == "baseline"]
    share = f" ({fmt(float(ceiling['calls_per_second']) / base[0], 2)}x the baseline)" if base and base[0] else ""
    return (f"The harness's ceiling (bench/noop.py: canned JSON-RPC answers, no MCP work): "
            f"{fmt(ceiling['calls_per_second'])} calls/s{share}, server CPU "
            f"{fmt(ceiling.get('server_cpu_ms_per_call'), 3)} ms/call, 1-call p50 "
            f"{fmt(ceiling.get('sequential_p50_ms'), 2)} ms, {ceiling['errors']} errors.")


def compare_heading(report: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The title and what was compared, with how."""
    cfg = report["config"]
    baseline_types = sorted({t for r in rows if r["target"] == "baseline" for t in r.get("answer_types", {})})
    return [f"# satgate-mcp compare: {cfg['sessions']} sessions, {cfg['workers']} workers, echo tool, "
            f"{cfg['duration']:g} s per load phase, {cfg['rounds']} interleaved round(s)",
            "",
            f"- pinning: {report['pinning']}",
            f"- baseline: {BASELINES.get(cfg.get('baseline', 'test-upstream'), '?')} (answers "
            f"{', '.join(baseline_types) or 'n/a'}); gateway: python -m satgate_mcp serve as the README starts it "
            f"(a state folder), over {UPSTREAM_NAMES.get(cfg.get('upstream', 'test-upstream'), '?')} via stdio; "
            "gateway-oauth verifies JWTs from an "
            "authorization server the bench runs; gateway-metered is header mode on Redis with every call charged "
            "to a budget and counted by a rate limit",
            "- clients: raw aiohttp JSON-RPC (Accept: application/json, text/event-stream); server CPU is "
            f"/proc utime+stime over the load window (CLK_TCK {CLK_TCK}); 1-call p50 is a separate sequential "
            f"phase; initialize/s opens sessions for {cfg['init_seconds']:g} s"]


def round_tables(cfg: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The per-round table, then (with more than one round) the medians and the CPU share."""
    out = ["", "## Per round", "",
           markdown_table(TABLE_HEADERS, [table_row(f"r{r['round']} {r['target']}", r) for r in rows])]
    if cfg["rounds"] > 1 and rows:
        summary = summarize_rounds(rows)
        out += ["", "## Median over rounds", "",
                markdown_table(TABLE_HEADERS, [table_row(t, s) for t, s in summary.items()])]
        share = cpu_share(summary)
        if share:
            out += ["", share]
    return out


def gateway_only_lines(report: dict[str, Any]) -> list[str]:
    """One bullet per gateway-only phase that ran."""
    out = []
    if paired := report.get("paired"):
        out.append(paired_line(paired))
    if idle := report.get("idle"):
        out.append(f"- idle sessions: {idle['sessions']:,} opened in {idle['seconds']:.1f} s "
                   f"({idle['errors']} errors); "
                   f"RSS {fmt(idle['rss_before_kib'], 0)} -> {fmt(idle['rss_after_kib'], 0)} KiB: "
                   f"**{fmt(idle['kib_per_session'], 2)} KiB per session**")
    if resume := report.get("resume"):
        out.append(f"- first call on a session: ordinary p50 {fmt(resume['ordinary_first_call_p50_ms'], 2)} ms, "
                   f"resumed on a second process p50 {fmt(resume['resumed_first_call_p50_ms'], 2)} ms "
                   f"(n={resume['samples']}, errors {resume['ordinary_errors']} / {resume['resumed_errors']})")
    if sse := report.get("sse"):
        out += sse_lines(sse)
    if soak := report.get("soak"):
        out.append(f"- soak: {soak['calls']:,} calls in {soak['seconds']:.0f} s ({soak['errors']} errors); RSS "
                   + " -> ".join(fmt(kib / 1024, 1) for kib in soak["rss_kib"]) + " MiB "
                   f"(first to last {fmt(soak['rss_growth_kib'], 0)} KiB)")
    if instructions := report.get("instructions"):
        out.append(instructions_line(instructions))
    return out


def paired_line(paired: dict[str, Any]) -> str:
    """The three servers called one at a time in turn: p50 each, and the gateways' over the baseline's."""
    p50, ratios = paired["p50_ms"], paired["ratio"]
    return (f"- one call at a time, the three servers called in turn ({paired['calls']} calls each): p50 "
            f"baseline {fmt(p50['baseline'], 2)} ms, gateway-none {fmt(p50['gateway-none'], 2)} ms "
            f"(x{fmt(ratios['gateway-none'], 2)}), gateway-header {fmt(p50['gateway-header'], 2)} ms "
            f"(x{fmt(ratios['gateway-header'], 2)}); errors {sum(paired['errors'].values())}")


def sse_lines(sse: dict[str, Any]) -> list[str]:
    """The echo answer path (or why there is none to compare) and the progress call's."""
    if "sse" in sse:
        out = ["- echo answer path: " + answer_paths(sse)]
    else:
        out = [f"- echo answer path: SSE n/a (the gateway answers {sse['answers_when_both_accepted']} "
               "when the client accepts both)"]
    if "progress" in sse:
        out.append("- a call with one progress notification (slow, 1 step): " + answer_paths(sse["progress"]))
    return out

"""The pure parts of scripts/conformance.py: reading the runner's results and the rule that decides the exit."""

from __future__ import annotations

from typing import Any

import pytest

from scripts.conformance import (
    EXPECTED_FILE,
    SPEC_VERSION,
    SPEC_VERSIONS,
    Checks,
    expected_file,
    extension_scenarios,
    load_expected,
    parse_checks,
    regressions,
    scenario_of,
    stale,
    suite_args,
    table,
    target,
    targets,
    unexpected,
    with_extensions,
)


@pytest.mark.parametrize(("dirname", "scenario"), [
    pytest.param("server-tools-list-2026-12-02T17-17-28-635Z", "tools-list", id="plain"),
    pytest.param("server-server-sse-polling-2026-12-02T17-17-39-422Z", "server-sse-polling", id="server-prefixed"),
    pytest.param("checks.json", None, id="not-a-result-dir"),
    pytest.param("server-tools-list", None, id="no-timestamp"),
])
def test_result_dir_names_the_scenario(dirname: str, scenario: str | None) -> None:
    assert scenario_of(dirname) == scenario


@pytest.mark.parametrize(("checks", "parsed"), [
    pytest.param([{"id": "ping", "status": "SUCCESS"}], {("s", "ping"): "SUCCESS"}, id="one"),
    pytest.param([{"id": "e", "status": "INFO"}, {"id": "e", "status": "FAILURE"}, {"id": "e", "status": "INFO"}],
                 {("s", "e"): "FAILURE"}, id="repeated-check-counts-with-its-worst-status"),
    pytest.param([{"id": "w", "status": "SUCCESS"}, {"id": "w", "status": "WARNING"}],
                 {("s", "w"): "WARNING"}, id="warning-is-worse-than-success"),
    pytest.param([{"id": "x"}], {("s", "x"): "FAILURE"}, id="no-status-is-a-failure"),
])
def test_checks_are_read_per_id(checks: list[dict[str, Any]], parsed: Checks) -> None:
    assert parse_checks("s", checks) == parsed


@pytest.mark.parametrize(("direct", "gateway", "found"), [
    pytest.param({("a", "x"): "SUCCESS"}, {("a", "x"): "SUCCESS"}, [], id="same-is-fine"),
    pytest.param({("a", "x"): "SUCCESS"}, {("a", "x"): "FAILURE"}, [("a", "x")], id="failure-through-gateway"),
    pytest.param({("a", "x"): "SUCCESS"}, {("a", "x"): "WARNING"}, [("a", "x")], id="warning-is-not-passing"),
    pytest.param({("a", "x"): "SUCCESS"}, {}, [("a", "x")], id="missing-through-gateway-is-not-passing"),
    pytest.param({("a", "x"): "FAILURE"}, {("a", "x"): "FAILURE"}, [], id="failing-directly-is-not-the-gateways"),
    pytest.param({("a", "x"): "INFO"}, {("a", "x"): "FAILURE"}, [], id="info-directly-is-not-a-pass"),
    pytest.param({}, {("a", "x"): "FAILURE"}, [], id="gateway-only-check-is-not-compared"),
])
def test_a_check_passing_directly_must_pass_through_the_gateway(
    direct: Checks, gateway: Checks, found: list[tuple[str, str]]
) -> None:
    assert regressions(direct, gateway) == found


@pytest.mark.parametrize(("found", "expected", "left", "now_passing"), [
    pytest.param([("a", "x")], {"a/x": "issue 11"}, [], [], id="listed-is-expected"),
    pytest.param([("a", "x")], {}, [("a", "x")], [], id="unlisted-fails-the-run"),
    pytest.param([], {"a/x": "issue 11"}, [], ["a/x"], id="listed-but-passing-is-stale"),
])
def test_expected_failures_excuse_only_what_they_list(
    found: list[tuple[str, str]], expected: dict[str, str], left: list[tuple[str, str]], now_passing: list[str]
) -> None:
    assert unexpected(found, expected) == left
    assert stale(found, expected) == now_passing


@pytest.mark.parametrize(("text", "loaded"), [
    pytest.param("", {}, id="empty"),
    pytest.param("gateway-http:\n  a/x: \"issue 11: relay\"\n", {"gateway-http": {"a/x": "issue 11: relay"}},
                 id="entry-with-reason"),
])
def test_expected_failures_file_is_read(text: str, loaded: dict[str, dict[str, str]]) -> None:
    assert load_expected(text) == loaded


@pytest.mark.parametrize("text", [
    pytest.param("gateway-http:\n  a/x:\n", id="entry-without-reason"),
    pytest.param("- a/x\n", id="not-a-mapping"),
])
def test_expected_failure_without_a_reason_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected-failures"):
        load_expected(text)


def test_table_shows_passed_over_reported_per_target() -> None:
    out = table({"direct": {("a", "x"): "SUCCESS", ("a", "y"): "SUCCESS"},
                 "gateway": {("a", "x"): "SUCCESS", ("a", "y"): "FAILURE"}})
    assert out.splitlines()[0].split() == ["scenario", "direct", "gateway"]
    assert out.splitlines()[2].split() == ["a", "2/2", "1/2", "(1", "fail)"]


def test_default_spec_version_keeps_its_file_and_runner_options() -> None:
    assert SPEC_VERSION == "2025-11-25"
    assert expected_file(SPEC_VERSION) == EXPECTED_FILE
    assert EXPECTED_FILE.name == "expected-gateway-failures.yaml"
    assert suite_args(SPEC_VERSION) == ["--spec-version", "2025-11-25", "--suite", "all"]


def test_other_spec_versions_get_their_own_file_and_wire() -> None:
    assert expected_file("2026-07-28") == EXPECTED_FILE.with_name("expected-gateway-failures-2026-07-28.yaml")
    assert suite_args("2026-07-28") == ["--spec-version", "2026-07-28", "--suite", "all"]


def test_three_upstreams_each_directly_and_through_the_gateway_over_stdio_and_http() -> None:
    assert [target(kind, era) for kind, era in targets()] == [
        "direct-2025", "gateway-stdio-2025", "gateway-http-2025",
        "direct-2026", "gateway-stdio-2026", "gateway-http-2026",
        "direct-both", "gateway-stdio-both", "gateway-http-both"]


def test_extension_checks_are_judged_with_the_rest() -> None:
    """The runner leaves the tasks scenarios unscored; a tasks check lost through the gateway is still a regression."""
    direct = {("tools-list", "a"): "SUCCESS"}
    extensions = {"direct": {("tasks-lifecycle", "b"): "SUCCESS"}, "gw": {("tasks-lifecycle", "b"): "FAILURE"}}
    scored = with_extensions({"direct": direct, "gw": dict(direct)}, extensions)
    assert regressions(scored["direct"], scored["gw"]) == [("tasks-lifecycle", "b")]
    assert with_extensions({"direct": direct}, {}) == {"direct": direct}  # 2025-11-25: no extension scenarios


@pytest.mark.parametrize(("listing", "found"), [
    pytest.param("Server scenarios (test against a server):\n  - tools-list [2025-06-18,2026-07-28]\n"
                 "  - tasks-lifecycle [extension]\n  - sep-2640-skills-directory [extension]\n"
                 "  - tasks-wire-fields [extension]\n", ["tasks-lifecycle", "tasks-wire-fields"], id="tasks-only"),
    pytest.param("  - tasks-lifecycle [2026-07-28]\n", [], id="on-the-timeline-not-an-extension"),
    pytest.param("", [], id="none"),
])
def test_the_tasks_extension_scenarios_are_read_from_the_runners_list(listing: str, found: list[str]) -> None:
    assert extension_scenarios(listing) == found


@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
def test_every_spec_version_has_a_readable_expected_failures_file(spec_version: str) -> None:
    loaded = load_expected(expected_file(spec_version).read_text())
    assert set(loaded) <= {target(kind, era) for kind, era in targets() if kind != "direct"}

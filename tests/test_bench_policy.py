"""The ``--policy`` benchmark: its 50 rules compile, none refuses the bench's calls, and the figure is a difference."""

from __future__ import annotations

import math

from bench.policy import PLAIN, POLICY, RULES, policy_document, render, summary
from satgate_mcp.auth.base import Identity
from satgate_mcp.guards import Asked
from satgate_mcp.policy.decide import Decider
from satgate_mcp.policy.rules import Effect, compile_rules


def test_the_bench_policy_has_50_rules_and_lets_the_bench_call_through() -> None:
    rules = compile_rules(policy_document(), Effect.ALLOW, "bench")
    assert len(rules.rules) == RULES
    asked = Asked("tools/call", Identity(token_id="c1"), "s", "tool", "echo",
                  {"name": "echo", "arguments": {"text": "call 1"}}, "bench", {"name": "echo"})
    decision = Decider(rules).decide(asked)
    assert decision.effect is Effect.ALLOW
    assert decision.rule is None


def test_the_summary_is_the_difference_of_medians() -> None:
    rounds = [{"target": t, "server_main_cpu_ms_per_call": cpu, "calls_per_second": 100.0, "p50_ms": 1.0,
               "errors": 0} for t, cpu in [(PLAIN, 0.30), (POLICY, 0.31), (PLAIN, 0.32), (POLICY, 0.33)]]
    result = summary(rounds)
    assert math.isclose(result["policy_minus_plain_cpu_ms_per_call"], 0.01)
    assert result["within_allowance"] is True  # 0.01 ms is within the allowance
    assert "50 rules: +0.0100 ms" in render(result)

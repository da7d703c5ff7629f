"""The ``--controls`` benchmark measures what it says: every token carries controls, and none applies to the bench's
``echo`` calls (so the figure is what a call that no control matches pays)."""

from __future__ import annotations

import json

from bench.controls import DOCUMENT, VARIANT
from satgate_mcp.policy.control_checks import confirm_for, hold_for, judge
from satgate_mcp.policy.controls import parse_controls
from satgate_mcp.policy.spend import applicable


def test_the_bench_controls_are_valid_and_match_no_echo_call() -> None:
    controls = (parse_controls(json.dumps(DOCUMENT)),)
    assert VARIANT.controls is not None
    assert judge(controls, "echo", {"text": "x"}) == []
    assert applicable(controls, "echo") == []
    assert hold_for(controls, "echo", {"text": "x"}) is None
    assert confirm_for(controls, "echo") is None
    assert hold_for(controls, "pay", {"amount": 60}) is not None

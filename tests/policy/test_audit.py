"""The audit trail's pure rules: every tampering breaks the chain at the line it touched; outcomes read from answers."""

from __future__ import annotations

import hashlib
import json

import pytest

from satgate_mcp import jsonrpc
from satgate_mcp.policy.audit import GENESIS, Outcome, args_digest, last_link, line_hash, outcome_of, seal, verify


def trail(count: int, start_prev: str = GENESIS, start_seq: int = 1) -> list[str]:
    lines, prev = [], start_prev
    for n in range(count):
        line = seal({"event": "tool_call", "tool": f"t{n}", "outcome": "ok"}, start_seq + n, prev).decode()
        lines.append(line)
        prev = line_hash(line)
    return lines


def edited(lines: list[str], at: int) -> list[str]:
    fields = json.loads(lines[at])
    fields["outcome"] = "refused"
    return [*lines[:at], json.dumps(fields, separators=(",", ":")), *lines[at + 1:]]


def test_an_untouched_trail_verifies() -> None:
    assert verify([("audit.jsonl", trail(20))]) == (20, None)


@pytest.mark.parametrize(("tamper", "broken_at"), [
    pytest.param(lambda ls: edited(ls, 7), 9, id="a-line-edited-breaks-the-next"),
    pytest.param(lambda ls: ls[:7] + ls[8:], 8, id="a-line-deleted"),
    pytest.param(lambda ls: [*ls[:5], ls[6], ls[5], *ls[7:]], 6, id="two-lines-swapped"),
    pytest.param(lambda ls: [*ls[:5], trail(1)[0], *ls[5:]], 6, id="a-line-inserted"),
    pytest.param(lambda ls: [*ls[:-1], ls[-1][:30]], 20, id="the-last-line-cut"),
    pytest.param(lambda ls: [*ls[:4], "", *ls[4:]], 5, id="an-empty-line"),
])
def test_tampering_breaks_the_chain_at_the_line_it_touched(tamper: object, broken_at: int) -> None:
    assert callable(tamper)
    checked, broken = verify([("audit.jsonl", tamper(trail(20)))])
    assert broken is not None
    assert broken.line == broken_at
    assert checked == broken_at - 1


def test_an_edited_last_line_is_caught_by_the_line_after_it_once_one_is_written() -> None:
    lines = trail(5)
    changed = edited(lines, 4)
    # On its own the last line's edit cannot be seen (nothing chains from it yet): its hash moved.
    assert line_hash(changed[4]) != line_hash(lines[4])


def test_a_rotated_trail_verifies_across_its_files_in_order_only() -> None:
    old = trail(10)
    prev, seq = last_link(old)
    new = trail(5, prev, seq)
    assert verify([("audit.jsonl.1", old), ("audit.jsonl", new)]) == (15, None)
    assert verify([("audit.jsonl", new), ("audit.jsonl.1", old)])[1] is not None


def test_the_chain_continues_from_a_files_last_line() -> None:
    assert last_link([]) == (GENESIS, 1)
    lines = trail(3)
    assert last_link([*lines, ""]) == (line_hash(lines[-1]), 4)


@pytest.mark.parametrize(("reply", "expected"), [
    pytest.param(jsonrpc.result_response(1, {"content": []}), Outcome("ok"), id="served"),
    pytest.param(jsonrpc.result_response(1, {"isError": True}), Outcome("error"), id="tool-error"),
    pytest.param(jsonrpc.error_response(1, -32603, "x", {"error": "upstream_unavailable"}),
                 Outcome("error", -32603, reason="upstream_unavailable"), id="upstream-failed"),
    pytest.param(jsonrpc.error_response(1, -32001, "x", {"error": "policy_denied", "rule": "no-prod"}),
                 Outcome("refused", -32001, "deny", "no-prod", "policy_denied"), id="policy-refusal-names-rule"),
    pytest.param(jsonrpc.error_response(1, -32001, "x", {"error": "tool_not_allowed"}),
                 Outcome("refused", -32001, "deny", None, "tool_not_allowed"), id="caveat-refusal"),
    pytest.param(jsonrpc.error_response(1, -32002, "x", {"error": "budget_exhausted"}),
                 Outcome("refused", -32002, "deny", None, "budget_exhausted"), id="budget-refusal"),
    pytest.param(jsonrpc.error_response(1, -32602, "bad"), Outcome("error", -32602), id="upstream-error-no-data"),
])
def test_what_became_of_a_call_is_read_from_its_answer(reply: dict[str, object], expected: Outcome) -> None:
    assert outcome_of(reply) == expected


def test_the_arguments_digest_does_not_depend_on_key_order() -> None:
    one, other = {"b": 1, "a": [1, 2]}, {"a": [1, 2], "b": 1}
    assert args_digest(one) == args_digest(other) == hashlib.sha256(b'{"a":[1,2],"b":1}').hexdigest()

"""Which answer a 2026 client sent up front fits a 2025 upstream's question (offered.py), from a table."""

from __future__ import annotations

import pytest

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.transport.offered import offered_answer

NAME_FORM: JsonObj = {"message": "What is your name?", "requestedSchema": {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}
ALICE: JsonObj = {"action": "accept", "content": {"name": "Alice"}}


@pytest.mark.parametrize(
    ("method", "params", "offered", "key"),
    [
        pytest.param("elicitation/create", NAME_FORM,
                     {"user_name": ALICE, "unknown_extra_key": {"action": "accept", "content": {"foo": "bar"}},
                      "another_unexpected": {"action": "accept", "content": {"baz": 123}}},
                     "user_name", id="the-one-answer-that-satisfies-the-schema-among-extras"),
        pytest.param("elicitation/create", NAME_FORM, {"a": ALICE, "b": ALICE}, None, id="two-fit-ask-instead"),
        pytest.param("elicitation/create", NAME_FORM, {"user_name": 12345}, None, id="not-an-answer"),
        pytest.param("elicitation/create", NAME_FORM, {"x": {"action": "accept", "content": {"name": 7}}}, None,
                     id="wrong-type"),
        pytest.param("elicitation/create", NAME_FORM, {"x": {"action": "maybe"}}, None, id="no-such-action"),
        pytest.param("elicitation/create", NAME_FORM, {"x": {"action": "decline"}}, "x", id="a-decline-fits"),
        pytest.param("elicitation/create", {"mode": "url", "url": "https://e.example"}, {"x": {"action": "accept"}},
                     "x", id="url-mode-has-no-schema"),
        pytest.param("sampling/createMessage", {}, {"s": {"role": "assistant", "content": {"type": "text"}},
                                                    "e": ALICE}, "s", id="sampling-result"),
        pytest.param("roots/list", None, {"r": {"roots": []}, "e": ALICE}, "r", id="roots-result"),
        pytest.param("roots/list", None, {}, None, id="nothing-offered"),
        pytest.param("ping", None, {"r": {"roots": []}}, None, id="not-a-question-a-client-answers"),
    ],
)
def test_offered_answer(method: str, params: JsonObj | None, offered: JsonObj, key: str | None) -> None:
    assert offered_answer(method, params, offered) == key

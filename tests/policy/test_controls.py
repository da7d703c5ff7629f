"""Tool controls as a token carries them: every key is read strictly, anything unknown or malformed is refused,
and one set of controls has one spelling."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from satgate_mcp.policy.control_values import normal_host
from satgate_mcp.policy.controls import (
    MAX_ENTRIES,
    ApprovalRule,
    ArgRule,
    ConfirmRule,
    Controls,
    SpendLimit,
    canonical_text,
    controls_json,
    parse_controls,
)

FULL: dict[str, Any] = {
    "args": [
        {"tools": ["pay*"], "field": "vendor", "one_of": ["acme", "globex"]},
        {"tools": ["pay"], "field": "amount", "min": "0.01", "max": "500"},
        {"tools": ["fetch"], "field": "url", "url": {"hosts": ["api.example.com"], "path_prefixes": ["/v1/"]}},
        {"tools": ["pay"], "field": "memo", "absent": True},
    ],
    "spend_limits": [{"tools": ["pay*"], "field": "amount", "max": "200", "window": "day", "tz": "America/New_York"}],
    "approvals": [{"tools": ["pay*"], "field": "amount", "above": "50", "wait": 30}, {"tools": ["deploy"]}],
    "confirm": [{"tools": ["delete_*"], "message": "Delete for real?", "fields": ["path"]}],
}


def test_every_key_is_read_into_its_rule() -> None:
    controls = parse_controls(json.dumps(FULL))
    assert controls.args[0] == ArgRule(("pay*",), "vendor", one_of=("acme", "globex"))
    assert controls.args[1] == ArgRule(("pay",), "amount", min=Decimal("0.01"), max=Decimal("500"))
    assert controls.args[2].url is not None
    assert controls.args[2].url.hosts == ("api.example.com",)
    assert controls.args[3].absent
    assert controls.spend_limits == (SpendLimit(("pay*",), "amount", Decimal(200), "day", "America/New_York"),)
    assert controls.approvals == (ApprovalRule(("pay*",), "amount", Decimal(50), 30), ApprovalRule(("deploy",)))
    assert controls.confirm == (ConfirmRule(("delete_*",), "Delete for real?", ("path",)),)


def test_one_spelling_that_reads_back_the_same() -> None:
    controls = parse_controls(json.dumps(FULL))
    text = canonical_text(controls)
    assert parse_controls(text) == controls
    assert canonical_text(parse_controls(text)) == text
    assert text.isascii()
    assert " " not in text.replace("Delete for real?", "")
    assert controls_json(parse_controls('{"spend_limits": [{"tools": ["p"], "field": "a", "max": "10.50", '
                                        '"window": "week"}]}'))["spend_limits"][0]["max"] == "10.5"


def _with(key: str, entry: object) -> str:
    return json.dumps({key: [entry]})


PAY = ["pay"]


@pytest.mark.parametrize("text", [
    pytest.param("not json", id="not-json"),
    pytest.param("[]", id="not-an-object"),
    pytest.param("{}", id="no-rule-at-all"),
    pytest.param('{"args": []}', id="empty-lists-only"),
    pytest.param('{"arguments": []}', id="unknown-top-key"),
    pytest.param('{"args": [], "args": []}', id="duplicate-key"),
    pytest.param("[" * 5000 + "]" * 5000, id="nested-too-deeply"),
    pytest.param(json.dumps({"args": [{"tools": PAY, "field": "a", "absent": True}] * (MAX_ENTRIES + 1)}),
                 id="too-many-entries"),
    pytest.param(_with("args", {"tools": ["pay"], "field": "a", "one_of": ["x"], "colour": "red"}), id="unknown-key"),
    pytest.param(_with("args", {"tools": ["pa y"], "field": "a", "absent": True}), id="bad-pattern"),
    pytest.param(_with("args", {"tools": ["*pay"], "field": "a", "absent": True}), id="star-not-at-end"),
    pytest.param(_with("args", {"tools": [], "field": "a", "absent": True}), id="no-tools"),
    pytest.param(_with("args", {"tools": "pay", "field": "a", "absent": True}), id="tools-not-a-list"),
    pytest.param(_with("args", {"tools": PAY, "absent": True}), id="no-field"),
    pytest.param(_with("args", {"tools": PAY, "field": "a"}), id="no-kind"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "absent": True, "one_of": ["x"]}), id="two-kinds"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "absent": False}), id="absent-false"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "one_of": []}), id="empty-one-of"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "one_of": [1.5]}), id="float-in-one-of"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "one_of": [{"x": 1}]}), id="object-in-one-of"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "max": 10}), id="amount-as-a-number"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "max": "1e3"}), id="exponent"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "max": "NaN"}), id="nan"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "max": " 10"}), id="space-in-decimal"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "max": "0.1234567"}), id="seven-decimals"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "max": "1" * 13}), id="thirteen-digits"),
    pytest.param(_with("args", {"tools": PAY, "field": "a", "min": "5", "max": "4"}), id="min-above-max"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {}}), id="url-without-hosts"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["a b"]}}), id="url-bad-host"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"], "port": [1]}}),
                 id="url-unknown-key"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"], "ports": [0]}}),
                 id="url-port-zero"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"], "ports": ["443"]}}),
                 id="url-port-as-text"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"], "schemes": ["ftp"]}}),
                 id="url-other-scheme"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"], "path_prefixes": ["v1"]}}),
                 id="url-relative-prefix"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"],
                                                                      "path_prefixes": ["/v1/../admin"]}}),
                 id="url-dot-segment-prefix"),
    pytest.param(_with("args", {"tools": PAY, "field": "u", "url": {"hosts": ["x.com"], "path_prefixes": ["/%2e"]}}),
                 id="url-percent-prefix"),
    pytest.param(_with("spend_limits", {"tools": PAY, "field": "a", "max": "200", "window": "month"}),
                 id="unknown-window"),
    pytest.param(_with("spend_limits", {"tools": PAY, "field": "a", "max": "200", "window": "day", "tz": "Mars/Base"}),
                 id="unknown-tz"),
    pytest.param(_with("spend_limits", {"tools": PAY, "field": "a", "max": "200", "window": "day",
                                        "tz": "../../etc/passwd"}), id="tz-path"),
    pytest.param(_with("spend_limits", {"tools": PAY, "field": "a", "max": "-1", "window": "day"}),
                 id="negative-limit"),
    pytest.param(_with("spend_limits", {"tools": PAY, "field": "a", "window": "day"}), id="no-max"),
    pytest.param(_with("approvals", {"tools": PAY, "field": "a"}), id="field-without-above"),
    pytest.param(_with("approvals", {"tools": PAY, "above": "5"}), id="above-without-field"),
    pytest.param(_with("approvals", {"tools": PAY, "wait": 51}), id="wait-over-50"),
    pytest.param(_with("approvals", {"tools": PAY, "wait": 1.5}), id="wait-not-whole"),
    pytest.param(_with("approvals", {"tools": PAY, "wait": True}), id="wait-boolean"),
    pytest.param(_with("confirm", {"tools": PAY}), id="confirm-without-message"),
    pytest.param(_with("confirm", {"tools": PAY, "message": "ok?", "fields": "path"}), id="confirm-fields-text"),
    pytest.param(_with("confirm", {"tools": PAY, "message": "a\nb"}), id="confirm-control-character"),
])
def test_malformed_or_unknown_controls_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_controls(text)


@pytest.mark.parametrize(("host", "normal"), [
    pytest.param("API.Example.com.", "api.example.com", id="case-and-trailing-dot"),
    pytest.param("bücher.de", "xn--bcher-kva.de", id="idna-a-label"),
    pytest.param("xn--bcher-kva.de", "xn--bcher-kva.de", id="already-a-label"),
    pytest.param("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com", None, id="full-width-disguise"),
    pytest.param("example\u3002com", None, id="ideographic-full-stop"),
    pytest.param("exa%6dple.com", None, id="percent-encoded"),
    pytest.param("user@example.com", None, id="userinfo"),
    pytest.param("example.com\\evil", None, id="backslash"),
    pytest.param("ex_ample.com", None, id="underscore"),
    pytest.param("-example.com", None, id="leading-hyphen"),
    pytest.param("", None, id="empty"),
])
def test_host_names_have_one_normal_form(host: str, normal: str | None) -> None:
    assert normal_host(host) == normal


def test_empty_controls_are_falsy() -> None:
    assert not Controls()

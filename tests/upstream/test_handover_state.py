"""The handed-over child's record: round trip, and every way a record is refused (and only as BadRecord)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satgate_mcp.settings import StdioUpstreamSpec
from satgate_mcp.upstream.handover_state import (
    STATE_VERSION,
    BadRecord,
    ChildRecord,
    adoption_refusal,
    from_json,
    spec_digest,
)

SPEC = StdioUpstreamSpec(transport="stdio", command=["python", "server.py"], env={"A": "1"})


def record(**changes: Any) -> ChildRecord:
    fields: dict[str, Any] = {
        "upstream": "t", "instance": None, "pid": 4242, "spec_digest": spec_digest(SPEC), "modern": False,
        "init_result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "s", "version": "1"}},
        "next_id": 17, "lists": {"tools/list": {"tools": []}}, "subscriptions": ["file:///a"], "log_level": "info",
    }
    fields.update(changes)
    return ChildRecord(**fields)


def raw(**changes: Any) -> bytes:
    value = json.loads(record().to_json())
    value.update(changes)
    return json.dumps(value).encode()


def test_round_trip() -> None:
    assert from_json(record().to_json()) == record()
    assert from_json(record(instance="sess-1", log_level=None).to_json()) == record(instance="sess-1", log_level=None)


@pytest.mark.parametrize(("data", "why"), [
    pytest.param(b"{not json", "not JSON", id="not-json"),
    pytest.param(b"[1]", "not a JSON object", id="not-object"),
    pytest.param(b"\xff\xfe", "not JSON", id="not-utf8"),
    pytest.param(raw(version=STATE_VERSION + 1), "state format version", id="newer-version"),
    pytest.param(raw(version=None), "state format version", id="no-version"),
    pytest.param(raw(pid="4242"), "'pid'", id="pid-string"),
    pytest.param(raw(pid=True), "'pid'", id="pid-bool"),
    pytest.param(raw(pid=1), "out of range", id="pid-init"),
    pytest.param(raw(next_id=0), "out of range", id="next-id-zero"),
    pytest.param(raw(upstream=None), "'upstream'", id="no-upstream"),
    pytest.param(raw(init_result=[]), "'init_result'", id="init-result-list"),
    pytest.param(raw(subscriptions=[1]), "non-string", id="subscription-number"),
    pytest.param(raw(lists={"tools/list": []}), "'lists'", id="list-not-object"),
    pytest.param(raw(modern="yes"), "'modern'", id="modern-string"),
    pytest.param(b" " * (4 * 1024 * 1024 + 1), "larger than", id="too-large"),
])
def test_bad_records_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(BadRecord, match=why):
        from_json(data)


@given(st.binary(max_size=300))
def test_any_bytes_give_a_record_or_bad_record(data: bytes) -> None:
    with contextlib.suppress(BadRecord):
        from_json(data)


@pytest.mark.parametrize(("rec", "specs", "why"), [
    pytest.param(record(), {"t": SPEC}, None, id="unchanged"),
    pytest.param(record(), {}, "no longer configured", id="upstream-removed"),
    pytest.param(record(), {"t": SPEC.model_copy(update={"command": ["python", "other.py"]})}, "command", id="command"),
    pytest.param(record(), {"t": SPEC.model_copy(update={"env": {"A": "2"}})}, "command, env", id="env"),
    pytest.param(record(), {"t": SPEC.model_copy(update={"timeout": 5.0})}, None, id="timeout-only"),
    pytest.param(record(), {"t": SPEC.model_copy(update={"isolation": "session"})}, "isolation", id="now-isolated"),
    pytest.param(record(instance="s1"), {"t": SPEC}, "isolation", id="now-shared"),
])
def test_adoption_refusal(rec: ChildRecord, specs: dict[str, StdioUpstreamSpec], why: str | None) -> None:
    refusal = adoption_refusal(rec, specs)
    assert (refusal is None) == (why is None)
    if why is not None:
        assert refusal is not None
        assert why in refusal

"""The cached structural checks answer exactly what ``isinstance`` against the Protocols answers."""

from __future__ import annotations

import pytest

from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.upstream.base import InputCarrier, Relay, Resume, is_input_carrier, is_relay


class FullRelay:
    def __init__(self) -> None:
        self.session_key = "s"

    async def __call__(self, params: JsonObj) -> None: ...

    def admit(self) -> None: ...

    async def notify(self, method: str, params: JsonObj | None) -> None: ...

    async def ask(self, method: str, params: JsonObj | None, timeout: float) -> JsonObj:
        return {}


class CarryingRelay(FullRelay):
    def __init__(self) -> None:
        super().__init__()
        self.resume: Resume | None = None

    def carry(self, upstream: str, result: JsonObj) -> None: ...

    def client_meta(self) -> JsonObj:
        return {}


async def progress_only(params: JsonObj) -> None: ...


@pytest.mark.parametrize("value", [FullRelay(), CarryingRelay(), progress_only, None, object()],
                         ids=["relay", "carrier", "function", "none", "object"])
def test_the_cached_checks_agree_with_isinstance_twice_over(value: object) -> None:
    for _ in range(2):  # the first answer is computed, the second comes from the cache
        assert is_relay(value) == isinstance(value, Relay)
        assert is_input_carrier(value) == isinstance(value, InputCarrier)

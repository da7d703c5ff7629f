"""Shared pieces of the policy tests: a recording minter (and its verifier), policies, and calls to admit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from satgate_mcp.auth.base import Identity
from satgate_mcp.errors import GatewayError
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.jsonrpc import JsonObj
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.controls import Controls
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.settings import Settings
from satgate_mcp.stores import LocalState, local_stores
from tests.fakes import FakeClock

ROOT_KEY = "k" * 32
ALICE = Identity("alice", budget_limit=10)
WALL = 1_700_000_000.0


class FakeMinter:
    """Records what it was asked to mint and returns a recognisable fake token."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, root_key: str, token_id: str, *, ttl: float | None = None,
                 tools: Sequence[str] | None = None, budget_id: str | None = None,
                 budget_limit: float | None = None, tenant: str | None = None, parent_id: str | None = None,
                 depth: int = 0, now: float | None = None, ancestors: Sequence[str] = (),
                 max_depth: int | None = None, resources: Sequence[str] | None = None,
                 prompts: Sequence[str] | None = None, controls: Sequence[Controls] = ()) -> str:
        self.calls.append({"token_id": token_id, "ttl": ttl, "tools": tools, "budget_id": budget_id,
                           "budget_limit": budget_limit, "tenant": tenant, "parent_id": parent_id,
                           "depth": depth, "now": now, "ancestors": tuple(ancestors), "max_depth": max_depth,
                           "resources": resources, "prompts": prompts, "controls": tuple(controls)})
        return f"fake-token-for-{token_id}"

    def verify(self, root_key: str, token: str) -> Identity:
        """The verifier that goes with it: a fake token verifies as what it was minted for."""
        for call in self.calls:
            if token == f"fake-token-for-{call['token_id']}":
                return Identity(call["token_id"], budget_id=call["budget_id"], budget_limit=call["budget_limit"])
        raise ValueError("not a token this minter made")


def settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = {"auth_mode": "header", "root_key": ROOT_KEY, "enforcement": "control"}
    base.update(overrides)
    return Settings(**base)


def make_policy(clock: FakeClock | None = None, wall: FakeClock | None = None, *, state: LocalState | None = None,
                **overrides: Any) -> tuple[CallPolicy, RecordingPublisher, Metrics, FakeMinter]:
    """A policy over ``settings(**overrides)`` (on a state folder's stores with ``state``); the parts a test
    may plug in are taken out first."""
    publisher, metrics, minter = RecordingPublisher(), Metrics(), FakeMinter()
    kwargs = {k: overrides.pop(k) for k in ("max_delegation_depth", "new_id") if k in overrides}
    policy = CallPolicy.from_settings(settings(**overrides), publisher=publisher, metrics=metrics,
                                      stores=None if state is None else local_stores(state),
                                      clock=clock or FakeClock(), wall_clock=wall or FakeClock(WALL),
                                      minter=minter, verifier=minter.verify, **kwargs)
    return policy, publisher, metrics, minter


def sharing_stores(policy: CallPolicy, clock: FakeClock | None = None, **overrides: Any) -> CallPolicy:
    """Another process on the same deployment (``settings(**overrides)``): its own memory (calls in
    flight), the first one's stores."""
    publisher, metrics, minter = RecordingPublisher(), Metrics(), FakeMinter()
    return CallPolicy.from_settings(settings(**overrides), publisher=publisher, metrics=metrics,
                                    clock=clock or FakeClock(), minter=minter, verifier=minter.verify,
                                    budgets=policy._budgets, duplicates=policy._duplicates,
                                    admissions=policy._admissions, rate_limiter=policy._limiter)


def refusals(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("satgate_refusals_total", {"reason": reason})
    return value or 0.0


def call(name: str = "echo", **arguments: Any) -> JsonObj:
    return {"name": name, "arguments": arguments}


async def admit_tool(policy: CallPolicy, identity: Identity = ALICE, tool: str = "echo", *, session: str = "s1",
                     request_id: int | str = 1, params: JsonObj | None = None) -> Any:
    return await policy.admit(identity, method="tools/call", tool=tool, session_id=session, request_id=request_id,
                              params=params if params is not None else call(tool))


async def refusal(coro: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await coro
    return info.value

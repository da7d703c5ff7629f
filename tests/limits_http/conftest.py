"""The ``deploy`` fixture: a deployment (authenticator and policy stores) that gateway processes start on."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_aiohttp import AiohttpClient

from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.metrics import Metrics
from satgate_mcp.policy.engine import CallPolicy
from satgate_mcp.stores.memory import MemoryRevocationStore
from tests.fakes import FakeClock
from tests.limits_http.deployment import ROOT_KEY, WALL, CountingPublisher, Deploy, Deployment, header_settings


@pytest.fixture
def deploy(aiohttp_client: AiohttpClient) -> Deploy:
    def make(**overrides: Any) -> Deployment:
        settings = header_settings(**overrides)
        clock, publisher, metrics = FakeClock(), CountingPublisher(), Metrics()
        policy = CallPolicy.from_settings(settings, publisher=publisher, metrics=metrics, clock=clock)
        authenticator = MacaroonAuthenticator(ROOT_KEY, MemoryRevocationStore(), clock=FakeClock(WALL))
        return Deployment(settings, policy, clock, publisher, metrics, authenticator, aiohttp_client)

    return make

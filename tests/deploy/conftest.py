"""Fixtures the deploy tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.deploy.harness import Gateways


@pytest.fixture
async def gateways() -> AsyncIterator[Gateways]:
    """Real `serve` processes started by the test, all stopped at its end."""
    started = Gateways()
    try:
        yield started
    finally:
        await started.close()

"""What the SDK integration suites share: one real HTTP upstream per module, beside the stdio ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import HttpUpstreamProcess


@pytest.fixture(scope="module")
def web() -> Iterator[HttpUpstreamProcess]:
    server = HttpUpstreamProcess("--name", "web", "--prefix", "web_").start()
    yield server
    server.stop()

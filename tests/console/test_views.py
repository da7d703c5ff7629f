"""The sessions view's paging: bounded pages, a bounded search, clear refusals."""

from __future__ import annotations

import pytest

from satgate_mcp.console.views import MAX_PAGE, Page, page_of


@pytest.mark.parametrize(("params", "expected"), [
    pytest.param({}, Page(0, 50, ""), id="defaults"),
    pytest.param({"offset": "100", "limit": "100", "q": " Acme "}, Page(100, 100, "acme"), id="a-page-and-a-search"),
    pytest.param({"limit": str(MAX_PAGE + 1)}, str, id="too-large-a-page"),
    pytest.param({"limit": "0"}, str, id="an-empty-page"),
    pytest.param({"offset": "-1"}, str, id="a-negative-offset"),
    pytest.param({"offset": "ten"}, str, id="not-a-number"),
    pytest.param({"q": "x" * 201}, str, id="too-long-a-search"),
])
def test_page_of(params: dict[str, str], expected: object) -> None:
    found = page_of(params)
    if expected is str:
        assert isinstance(found, str)
    else:
        assert found == expected

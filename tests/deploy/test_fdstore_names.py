"""The fd store's names: which inherited descriptors are children's, grouped per child, whatever systemd's order."""

from __future__ import annotations

import pytest

from satgate_mcp.daemon.fdstore import ROLES, Stored, child_key, fd_names, fd_store_enabled, parse_name, split_inherited
from satgate_mcp.daemon.sockets import InheritedFd

KEY = child_key("db", None)


@pytest.mark.parametrize(("name", "parsed"), [
    pytest.param(f"satgate-child-{KEY}-stdin", (KEY, "stdin"), id="stdin"),
    pytest.param(f"satgate-child-{KEY}-state", (KEY, "state"), id="state"),
    pytest.param("satgate-mcp.socket", None, id="listening-socket"),
    pytest.param(f"satgate-child-{KEY}-other", None, id="unknown-role"),
    pytest.param("satgate-child--stdin", None, id="no-key"),
    pytest.param("fd3", None, id="unnamed"),
])
def test_parse_name(name: str, parsed: tuple[str, str] | None) -> None:
    assert parse_name(name) == parsed


def test_names_round_trip_and_keys_differ_per_child() -> None:
    assert {parse_name(name) for name in fd_names(KEY).values()} == {(KEY, role) for role in ROLES}
    assert len({child_key("db", None), child_key("db", "catalogue"), child_key("db", "s1"), child_key("d", "b")}) == 4
    assert all(":" not in name and len(name) < 255 for name in fd_names(child_key("a:b", "x:y")).values())


def test_split_sorts_by_name_and_groups_per_child() -> None:
    other = child_key("web", "s1")
    names = {**{f"{KEY}-{r}": 10 + i for i, r in enumerate(ROLES)}, f"{other}-stdin": 30}
    inherited = [InheritedFd(fd, f"satgate-child-{n}") for n, fd in reversed(names.items())]
    inherited.insert(2, InheritedFd(3, "satgate-mcp.socket"))
    sockets, children = split_inherited(inherited)
    assert sockets == [InheritedFd(3, "satgate-mcp.socket")]
    by_key = {child.key: child for child in children}
    assert by_key[KEY] == Stored(KEY, {r: 10 + i for i, r in enumerate(ROLES)})
    assert by_key[KEY].complete
    assert not by_key[other].complete


@pytest.mark.parametrize(("environ", "enabled"), [
    pytest.param({"FDSTORE": "4096"}, True, id="set"),
    pytest.param({"FDSTORE": "0"}, False, id="zero"),
    pytest.param({"FDSTORE": "many"}, False, id="not-a-number"),
    pytest.param({}, False, id="unset"),
])
def test_fd_store_enabled(environ: dict[str, str], enabled: bool) -> None:
    assert fd_store_enabled(environ) is enabled

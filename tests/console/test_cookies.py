"""The sealed cookie: what one process seals, any process with the shared secret opens; nothing else does."""

from __future__ import annotations

import pytest

from satgate_mcp.console.cookies import MAX_COOKIE_CHARS, Sealed, cookie_keys, open_cookie, seal

KEYS = cookie_keys(["the-root-key-of-every-process-0123456789"])
SEALED = Sealed("the-admin-token", "csrf-value", 2000.0)


def test_any_process_with_the_same_secret_opens_what_another_sealed() -> None:
    value = seal(KEYS, SEALED)
    assert "the-admin-token" not in value
    assert open_cookie(cookie_keys(["the-root-key-of-every-process-0123456789"]), value, now=1000.0) == SEALED


def test_a_rotation_keeps_logins_sealed_under_the_old_secret() -> None:
    value = seal(KEYS, SEALED)
    rotated = cookie_keys(["a-new-root-key-0123456789-0123456789", "the-root-key-of-every-process-0123456789"])
    assert open_cookie(rotated, value, now=1000.0) == SEALED


def flip(value: str) -> str:
    middle = len(value) // 2
    return value[:middle] + ("A" if value[middle] != "A" else "B") + value[middle + 1:]


@pytest.mark.parametrize("value", [
    pytest.param(lambda: flip(seal(KEYS, SEALED)), id="tampered"),
    pytest.param(lambda: seal(cookie_keys(["another-secret-0123456789-0123456789"]), SEALED), id="another-key"),
    pytest.param(lambda: seal(KEYS, Sealed("t", "c", 999.0)), id="expired"),
    pytest.param(lambda: seal(KEYS, Sealed("t", "c", 1000.0)), id="expiring-now"),
    pytest.param(lambda: "", id="empty"),
    pytest.param(lambda: "%%%not-base64%%%", id="not-base64"),
    pytest.param(lambda: "QUJD", id="too-short"),
    pytest.param(lambda: "A" * (MAX_COOKIE_CHARS + 1), id="oversized"),
    pytest.param(lambda: "é" * 40, id="not-ascii"),
])
def test_nothing_else_opens(value: object) -> None:
    assert open_cookie(KEYS, value(), now=1000.0) is None  # type: ignore[operator]


def test_without_a_shared_secret_each_process_has_a_key_of_its_own() -> None:
    assert cookie_keys([]) != cookie_keys([])
    assert cookie_keys(["", ""]) != cookie_keys([])

"""Header mode: the bearer comes from ``Authorization``, verification is cached, revocation and expiry are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from satgate_mcp.auth import macaroons
from satgate_mcp.auth.base import AuthOutcome
from satgate_mcp.auth.header import MacaroonAuthenticator
from satgate_mcp.auth.macaroons import add_caveats, mint_token
from satgate_mcp.stores.files import FileRevocationStore
from satgate_mcp.stores.memory import MemoryRevocationStore

KEY = "k" * 40
NOW = 1_000_000.0


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bearer(token: str) -> str:
    return f"Bearer {token}"


def make_auth(
    clock: FakeClock, revoked: tuple[str, ...] = (), **kwargs: float
) -> tuple[MacaroonAuthenticator, MemoryRevocationStore]:
    store = MemoryRevocationStore(revoked)
    return MacaroonAuthenticator(KEY, store, clock=clock, **kwargs), store  # type: ignore[arg-type]


def mint(token_id: str = "tok-alice", **kwargs: object) -> str:
    return mint_token(KEY, token_id, now=NOW, **kwargs)  # type: ignore[arg-type]


CASES = [
    pytest.param(None, (), AuthOutcome.MISSING, id="no-header"),
    pytest.param("", (), AuthOutcome.MISSING, id="empty-header"),
    pytest.param("Basic dXNlcjpwYXNz", (), AuthOutcome.MISSING, id="not-bearer"),
    pytest.param("Bearer", (), AuthOutcome.MISSING, id="bearer-without-token"),
    pytest.param(bearer("garbage"), (), AuthOutcome.INVALID, id="garbage"),
    pytest.param(bearer(mint_token("w" * 40, "tok-alice", now=NOW)), (), AuthOutcome.INVALID, id="wrong-key"),
    pytest.param(bearer(mint()), (), AuthOutcome.OK, id="valid"),
    pytest.param(f"bearer   {mint()}  ", (), AuthOutcome.OK, id="scheme-case-and-spaces"),
    pytest.param(bearer(mint(ttl=10)), (), AuthOutcome.OK, id="not-yet-expired"),
    pytest.param(bearer(mint(ttl=0.5)), (), AuthOutcome.EXPIRED, id="expired"),
    pytest.param(bearer(mint()), ("tok-alice",), AuthOutcome.REVOKED, id="revoked"),
    pytest.param(bearer(mint("tok-child", parent_id="tok-alice")), ("tok-alice",), AuthOutcome.REVOKED,
                 id="revoked-parent"),
    pytest.param(bearer(mint("tok-gc", parent_id="tok-child", ancestors=("tok-root",))), ("tok-root",),
                 AuthOutcome.REVOKED, id="revoked-grandparent"),
    pytest.param(bearer(mint("tok-child", parent_id="tok-alice")), ("tok-bob",), AuthOutcome.OK,
                 id="unrelated-revocation"),
    pytest.param(bearer(mint(ttl=1e-3)), ("tok-alice",), AuthOutcome.REVOKED, id="revoked-and-expired"),
]


@pytest.mark.parametrize(("header", "revoked", "expected"), CASES)
async def test_outcomes(header: str | None, revoked: tuple[str, ...], expected: AuthOutcome) -> None:
    clock = FakeClock(NOW + 1)
    auth, _ = make_auth(clock, revoked)
    result = await auth.authenticate(header)
    assert result.outcome is expected
    if result.identity is None:
        assert not result.token, "a refused bearer is not handed back"


async def test_ok_result_fills_the_identity() -> None:
    token = mint(ttl=60, tools=["db_*"], budget_id="team", budget_limit=5, tenant="acme", parent_id="tok-root")
    auth, _ = make_auth(FakeClock())
    result = await auth.authenticate(bearer(token))
    assert result.ok
    assert result.token == token
    ident = result.identity
    assert ident is not None
    assert (ident.token_id, ident.budget_id, ident.tenant, ident.parent_id, ident.depth) == (
        "tok-alice", "team", "acme", "tok-root", 1)
    assert (ident.tool_filters, ident.expires_at, ident.budget_limit) == ((("db_*",),), NOW + 60, 5.0)
    assert ident.ancestors == ("tok-root",)


async def test_a_narrowed_token_is_a_different_but_valid_bearer() -> None:
    auth, _ = make_auth(FakeClock())
    narrowed = add_caveats(mint(), tools=["search"])
    result = await auth.authenticate(bearer(narrowed))
    assert result.ok
    assert result.identity is not None
    assert not result.identity.allows_tool("delete")


async def test_verification_is_cached_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = macaroons.verify_signature

    def counting(root_key: str, token: str) -> object:
        calls.append(token)
        return real(root_key, token)

    monkeypatch.setattr(macaroons, "verify_signature", counting)
    clock = FakeClock()
    auth, _ = make_auth(clock, cache_seconds=1.0)
    token = mint()
    for _ in range(5):
        assert (await auth.authenticate(bearer(token))).ok
    assert len(calls) == 1
    clock.now += 1.0
    assert (await auth.authenticate(bearer(token))).ok
    assert len(calls) == 2, "the cached result lives cache_seconds, no longer"


async def test_invalid_tokens_are_cached_too_and_stay_invalid() -> None:
    auth, _ = make_auth(FakeClock())
    for _ in range(3):
        assert (await auth.authenticate(bearer("garbage"))).outcome is AuthOutcome.INVALID


async def test_cache_never_outlives_expiry() -> None:
    clock = FakeClock()
    auth, _ = make_auth(clock, cache_seconds=3600)
    token = mint(ttl=10)
    assert (await auth.authenticate(bearer(token))).ok
    clock.now = NOW + 9.999
    assert (await auth.authenticate(bearer(token))).ok
    clock.now = NOW + 10
    assert (await auth.authenticate(bearer(token))).outcome is AuthOutcome.EXPIRED


async def test_cache_never_hides_a_revocation() -> None:
    clock = FakeClock()
    auth, store = make_auth(clock, cache_seconds=3600)
    parent_token, child_token = mint("tok-parent"), mint("tok-child", parent_id="tok-parent")
    assert (await auth.authenticate(bearer(parent_token))).ok
    assert (await auth.authenticate(bearer(child_token))).ok
    await store.revoke("tok-parent")
    assert (await auth.authenticate(bearer(parent_token))).outcome is AuthOutcome.REVOKED
    child = await auth.authenticate(bearer(child_token))
    assert child.outcome is AuthOutcome.REVOKED
    assert child.reason == "an ancestor token was revoked"


async def test_cache_is_bounded() -> None:
    auth, _ = make_auth(FakeClock(), max_cached=3)
    tokens = [mint(f"tok-{i}") for i in range(10)]
    for token in tokens:
        assert (await auth.authenticate(bearer(token))).ok
    assert len(auth._cache) == 3


async def test_revocation_written_to_the_file_is_seen_within_one_second(tmp_path: Path) -> None:
    """The watcher notices an append by another process (here: a plain write) within a second of its clock."""
    path = tmp_path / "revoked"
    path.write_text("# nothing yet\n")
    store_clock = FakeClock(0.0)
    auth = MacaroonAuthenticator(KEY, FileRevocationStore(path, clock=store_clock))
    token = mint_token(KEY, "tok-live")
    assert (await auth.authenticate(bearer(token))).ok

    with path.open("a") as fh:
        fh.write("tok-live\n")
    written = store_clock()
    while (await auth.authenticate(bearer(token))).outcome is not AuthOutcome.REVOKED:
        assert store_clock() - written < 1.0, "still accepted a second after the revocation"
        store_clock.now += 0.02
    assert store_clock() - written < 1.0


class BrokenStore(MemoryRevocationStore):
    async def is_revoked(self, token_id: str) -> bool:
        raise ConnectionError("redis down")


async def test_a_store_fault_is_ours_not_the_clients_token_so_it_is_never_invalid() -> None:
    auth = MacaroonAuthenticator(KEY, BrokenStore(), clock=FakeClock())
    result = await auth.authenticate(bearer(mint()))
    assert result.outcome is AuthOutcome.UNAVAILABLE
    assert result.reason == "revocation store unavailable"


async def test_an_expired_token_is_refused_as_expired_even_while_the_store_is_down() -> None:
    auth = MacaroonAuthenticator(KEY, BrokenStore(), clock=FakeClock(NOW + 10))
    assert (await auth.authenticate(bearer(mint(ttl=1)))).outcome is AuthOutcome.EXPIRED


async def test_fail_open_lets_a_verified_token_through_a_store_fault_but_never_a_forged_one() -> None:
    auth = MacaroonAuthenticator(KEY, BrokenStore(), clock=FakeClock(), fail_open=True)
    assert (await auth.authenticate(bearer(mint()))).ok
    forged = mint_token("x" * 40, "tok-1")
    assert (await auth.authenticate(bearer(forged))).outcome is AuthOutcome.INVALID

"""The session registry: token-bound ids, cap, idle TTL, sweep, events and tombstones, with a fake clock."""

from __future__ import annotations

import asyncio
import re

import pytest

from satgate_mcp import events
from satgate_mcp.auth.base import Identity
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.sessions import (
    CloseReason,
    RegistryFull,
    Resumed,
    ResumeRefusal,
    SessionRegistry,
    is_valid_session_id_syntax,
    make_session_id,
    session_id_matches_token,
    session_tag,
)
from tests.fakes import FakeClock

TTL = 1800.0
ALICE_TOKEN = "tok-alice"
BOB_TOKEN = "tok-bob"
ALICE = Identity(token_id="alice")
VERSION = "2025-06-18"
ID_FORMAT = re.compile(r"^mcp-[0-9a-f]{32}-[0-9a-f]{32}$")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def publisher() -> RecordingPublisher:
    return RecordingPublisher()


def make_registry(clock: FakeClock, publisher: RecordingPublisher, cap: int = 10) -> SessionRegistry:
    return SessionRegistry(cap=cap, idle_ttl=TTL, publisher=publisher, clock=clock)


@pytest.fixture
def registry(clock: FakeClock, publisher: RecordingPublisher) -> SessionRegistry:
    return make_registry(clock, publisher)


def resume(registry: SessionRegistry, session_id: str, token: str = ALICE_TOKEN) -> Resumed | ResumeRefusal:
    return registry.resume(session_id, token, ALICE, VERSION)


def close_reasons(publisher: RecordingPublisher) -> list[tuple[str, str]]:
    return [(e["session_id"], e["reason"]) for e in publisher.named(events.SESSION_CLOSE)]


# --- session ids ----------------------------------------------------------------------------------


def test_session_id_matches_the_design_test_vector() -> None:
    sid = make_session_id("tok-alice", "0123456789abcdef0123456789abcdef")
    assert sid == "mcp-0123456789abcdef0123456789abcdef-78c81bb6184cc699239551fa7c0422ad"
    assert session_tag("tok-alice", "0123456789abcdef0123456789abcdef") == "78c81bb6184cc699239551fa7c0422ad"


def test_new_session_ids_have_the_documented_format_and_fresh_randomness() -> None:
    first, second = make_session_id(ALICE_TOKEN), make_session_id(ALICE_TOKEN)
    assert ID_FORMAT.match(first)
    assert ID_FORMAT.match(second)
    assert first != second
    assert session_id_matches_token(first, ALICE_TOKEN)


def test_a_session_id_answers_only_to_the_token_that_made_it() -> None:
    sid = make_session_id(ALICE_TOKEN)
    assert session_id_matches_token(sid, ALICE_TOKEN)
    assert not session_id_matches_token(sid, BOB_TOKEN)
    assert not session_id_matches_token(sid, "")


VECTOR_ID = "mcp-0123456789abcdef0123456789abcdef-78c81bb6184cc699239551fa7c0422ad"


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("3f1c2d9e-6b1a-4c55-9d0e-0a1b2c3d4e5f", id="uuid"),
        pytest.param("mcp-0123456789abcdef0123456789abcdef", id="no-tag"),
        pytest.param(VECTOR_ID.upper(), id="upper-case-hex"),
        pytest.param(VECTOR_ID[:-1], id="short-tag"),
        pytest.param(VECTOR_ID + "0", id="long-tag"),
        pytest.param("xcp" + VECTOR_ID[3:], id="wrong-prefix"),
        pytest.param(" " + VECTOR_ID, id="leading-space"),
        pytest.param(VECTOR_ID + "\n", id="trailing-newline"),
        pytest.param("", id="empty"),
    ],
)
def test_untagged_or_malformed_ids_never_match(session_id: str) -> None:
    assert not session_id_matches_token(session_id, ALICE_TOKEN)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        pytest.param(VECTOR_ID, True, id="gateway-id"),
        pytest.param("any-visible_ASCII.~!", True, id="foreign-visible-ascii"),
        pytest.param("", False, id="empty"),
        pytest.param("has space", False, id="space"),
        pytest.param("tab\there", False, id="control-char"),
        pytest.param("caf\u00e9", False, id="non-ascii"),
        pytest.param("a" * 256, True, id="256-chars"),
        pytest.param("a" * 257, False, id="257-chars"),
    ],
)
def test_session_id_header_syntax(value: str, valid: bool) -> None:
    assert is_valid_session_id_syntax(value) is valid


# --- open, cap, TTL, sweep, events ----------------------------------------------------------------------


def test_open_publishes_session_connect(registry: SessionRegistry, publisher: RecordingPublisher) -> None:
    session = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert session_id_matches_token(session.id, ALICE_TOKEN)
    assert session.answers_to(ALICE_TOKEN)
    assert not session.answers_to(BOB_TOKEN)
    assert registry.get(session.id) is session
    assert publisher.named(events.SESSION_CONNECT) == [
        {"session_id": session.id, "token_id": "alice", "protocol_version": VERSION, "resumed": False}
    ]


def test_a_full_registry_refuses_with_an_honest_retry_after(clock: FakeClock, publisher: RecordingPublisher) -> None:
    registry = make_registry(clock, publisher, cap=2)
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    clock.advance(100)
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    clock.advance(100)
    with pytest.raises(RegistryFull) as full:
        registry.open(ALICE_TOKEN, ALICE, VERSION)
    # The oldest session goes idle 1600 s from now; Retry-After rounds up.
    assert full.value.retry_after == 1601
    assert len(registry) == 2
    assert len(publisher.named(events.SESSION_CONNECT)) == 2


def test_a_full_registry_is_swept_before_it_refuses(clock: FakeClock, publisher: RecordingPublisher) -> None:
    registry = make_registry(clock, publisher, cap=1)
    old = registry.open(ALICE_TOKEN, ALICE, VERSION)
    clock.advance(TTL)
    new = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.get(new.id) is new
    assert registry.get(old.id) is None
    assert close_reasons(publisher) == [(old.id, "idle_timeout")]


def test_touch_refreshes_the_idle_ttl(registry: SessionRegistry, clock: FakeClock) -> None:
    session = registry.open(ALICE_TOKEN, ALICE, VERSION)
    clock.advance(TTL - 1)
    registry.touch(session)
    clock.advance(TTL - 1)
    assert registry.get(session.id) is session


def test_an_idle_session_is_gone_after_the_ttl(
    registry: SessionRegistry, clock: FakeClock, publisher: RecordingPublisher
) -> None:
    session = registry.open(ALICE_TOKEN, ALICE, VERSION)
    clock.advance(TTL)
    assert registry.get(session.id) is None
    assert len(registry) == 0
    assert close_reasons(publisher) == [(session.id, "idle_timeout")]


def test_sweep_returns_what_it_evicted(
    registry: SessionRegistry, clock: FakeClock, publisher: RecordingPublisher
) -> None:
    start = clock.now
    old = registry.open(ALICE_TOKEN, ALICE, VERSION)
    clock.advance(1000)
    young = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.sweep(start + TTL - 1) == []
    assert registry.sweep(start + TTL) == [(old.id, CloseReason.IDLE)]
    assert registry.get(young.id) is young
    assert close_reasons(publisher) == [(old.id, "idle_timeout")]
    assert registry.sweep(start + TTL) == []


def test_delete_and_shutdown_publish_their_reasons(registry: SessionRegistry, publisher: RecordingPublisher) -> None:
    deleted = registry.open(ALICE_TOKEN, ALICE, VERSION)
    kept = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.delete(deleted.id)
    registry.close_all()
    assert close_reasons(publisher) == [(deleted.id, "deleted"), (kept.id, "shutdown")]
    assert publisher.named(events.SESSION_CLOSE)[0]["token_id"] == "alice"
    assert len(registry) == 0


def test_delete_of_an_unknown_id_is_refused_and_leaves_no_tombstone(registry: SessionRegistry) -> None:
    assert not registry.delete(make_session_id(ALICE_TOKEN))
    assert registry.tombstone_count == 0


# --- resume and tombstones ------------------------------------------------------------------------------


def test_resume_rebuilds_a_session_for_the_token_that_made_the_id(
    registry: SessionRegistry, publisher: RecordingPublisher
) -> None:
    sid = make_session_id(ALICE_TOKEN)
    outcome = resume(registry, sid)
    assert isinstance(outcome, Resumed)
    assert outcome.created
    assert outcome.session.resumed
    assert registry.get(sid) is outcome.session
    assert publisher.named(events.SESSION_CONNECT) == [
        {"session_id": sid, "token_id": "alice", "protocol_version": VERSION, "resumed": True}
    ]


def test_resume_with_another_token_is_refused_and_creates_nothing(
    registry: SessionRegistry, publisher: RecordingPublisher
) -> None:
    assert resume(registry, make_session_id(ALICE_TOKEN), BOB_TOKEN) is ResumeRefusal.TAG_MISMATCH
    assert resume(registry, "3f1c2d9e-6b1a-4c55-9d0e-0a1b2c3d4e5f") is ResumeRefusal.TAG_MISMATCH
    assert len(registry) == 0
    assert publisher.events == []


def test_resume_into_a_full_registry_raises_registry_full(clock: FakeClock, publisher: RecordingPublisher) -> None:
    registry = make_registry(clock, publisher, cap=1)
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    with pytest.raises(RegistryFull):
        resume(registry, make_session_id(ALICE_TOKEN))


async def test_concurrent_resumes_of_one_id_yield_one_session_and_one_event(
    registry: SessionRegistry, publisher: RecordingPublisher
) -> None:
    sid = make_session_id(ALICE_TOKEN)

    async def attempt() -> Resumed | ResumeRefusal:
        await asyncio.sleep(0)  # let every attempt start before any of them resumes
        return resume(registry, sid)

    outcomes = await asyncio.gather(*(attempt() for _ in range(5)))
    resumed = [o for o in outcomes if isinstance(o, Resumed)]
    assert len(resumed) == 5
    assert len({id(o.session) for o in resumed}) == 1
    assert [o.created for o in resumed].count(True) == 1
    assert len(registry) == 1
    assert len(publisher.named(events.SESSION_CONNECT)) == 1


def test_a_deleted_id_leaves_a_tombstone_for_the_idle_ttl(registry: SessionRegistry, clock: FakeClock) -> None:
    session = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.delete(session.id)
    assert registry.tombstone_count == 1
    assert resume(registry, session.id) is ResumeRefusal.DELETED
    clock.advance(TTL - 1)
    assert resume(registry, session.id) is ResumeRefusal.DELETED
    clock.advance(1)
    registry.sweep()
    assert registry.tombstone_count == 0


def test_a_full_tombstone_map_refuses_every_resume_but_initialize_still_works(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = make_registry(clock, publisher, cap=2)
    for _ in range(2):
        registry.delete(registry.open(ALICE_TOKEN, ALICE, VERSION).id)
    assert registry.tombstone_count == 2
    assert resume(registry, make_session_id(ALICE_TOKEN)) is ResumeRefusal.TOMBSTONES_FULL
    assert len(registry) == 0
    session = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.get(session.id) is session


def test_a_delete_that_finds_the_map_full_blocks_resumes_until_its_ttl_passes(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = make_registry(clock, publisher, cap=2)
    first = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(2)]
    for s in first:
        registry.delete(s.id)
    clock.advance(100)
    late = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.delete(late.id)  # the map is full: its id cannot be recorded
    assert registry.tombstone_count == 2

    clock.advance(TTL - 100)  # the first tombstones expire now, the late delete's block does not
    assert resume(registry, late.id) is ResumeRefusal.TOMBSTONES_FULL
    assert resume(registry, make_session_id(ALICE_TOKEN)) is ResumeRefusal.TOMBSTONES_FULL
    assert registry.tombstone_count == 0

    clock.advance(100)
    outcome = resume(registry, late.id)
    assert isinstance(outcome, Resumed)
    assert outcome.created


def test_an_unexpired_tombstone_is_never_evicted_under_capacity_pressure(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = make_registry(clock, publisher, cap=2)
    deleted = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(2)]
    for s in deleted:
        registry.delete(s.id)
    for _ in range(3):  # more deletes, more sessions, more sweeps: the map stays full of the old ones
        clock.advance(10)
        registry.delete(registry.open(ALICE_TOKEN, ALICE, VERSION).id)
        registry.sweep()
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.tombstone_count == 2
    for s in deleted:
        assert resume(registry, s.id) is ResumeRefusal.DELETED

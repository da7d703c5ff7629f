"""The session registry: token-bound ids, cap, idle TTL, sweep, events and tombstones, with a fake clock."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence

import pytest
from structlog.testing import capture_logs

from satgate_mcp import events
from satgate_mcp.auth.base import ANONYMOUS_IDENTITY, Identity, per_token_quota
from satgate_mcp.events import RecordingPublisher
from satgate_mcp.session_ids import is_valid_session_id_syntax, make_session_id, session_id_matches_token, session_tag
from satgate_mcp.session_rules import QuotaAction, TombstoneAction, live_quota_action, tombstone_action
from satgate_mcp.sessions import (
    QUOTA_EVICTING,
    CloseReason,
    RegistryFull,
    Resumed,
    ResumeRefusal,
    Session,
    SessionRegistry,
    TokenSessionsBusy,
    least_recently_used_idle,
)
from tests.fakes import FakeClock

TTL = 1800.0
ALICE_TOKEN = "tok-alice"
BOB_TOKEN = "tok-bob"
ALICE = Identity(token_id="alice")
BOB = Identity(token_id="bob")
CAROL_TOKEN = "tok-carol"
CAROL = Identity(token_id="carol")
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


def resume(registry: SessionRegistry, session_id: str, token: str = ALICE_TOKEN,
           identity: Identity = ALICE) -> Resumed | ResumeRefusal:
    return registry.resume(session_id, token, identity, VERSION)


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


def test_a_full_tombstone_map_still_resumes_ids_it_has_no_tombstone_for(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = make_registry(clock, publisher, cap=2)
    deleted = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(2)]
    for s in deleted:
        registry.delete(s.id)
    assert registry.tombstone_count == 2
    assert isinstance(resume(registry, make_session_id(ALICE_TOKEN)), Resumed)
    for s in deleted:
        assert resume(registry, s.id) is ResumeRefusal.DELETED


def test_a_delete_that_finds_the_map_full_blocks_only_its_own_tokens_resumes_until_its_ttl_passes(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = make_registry(clock, publisher, cap=2)
    first = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(2)]
    for s in first:
        registry.delete(s.id)
    clock.advance(100)
    late = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.delete(late.id)  # the map is full and alice holds all of it: alice's resumes wait

    clock.advance(TTL - 100)  # the first tombstones would expire now, the late delete's block does not
    for sid in (late.id, first[0].id, make_session_id(ALICE_TOKEN)):
        assert resume(registry, sid) is ResumeRefusal.TOMBSTONE_QUOTA
    assert isinstance(resume(registry, make_session_id(BOB_TOKEN), BOB_TOKEN, BOB), Resumed)

    clock.advance(100)
    outcome = resume(registry, late.id)
    assert isinstance(outcome, Resumed)
    assert outcome.created


def test_a_deleted_id_is_never_resumed_within_its_ttl_whatever_the_pressure(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = make_registry(clock, publisher, cap=2)
    deleted = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(2)]
    for s in deleted:
        registry.delete(s.id)
    for _ in range(3):  # more deletes, more sessions, more sweeps
        clock.advance(10)
        registry.delete(registry.open(ALICE_TOKEN, ALICE, VERSION).id)
        registry.sweep()
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    for s in deleted:
        assert not isinstance(resume(registry, s.id), Resumed)


# --- per-token quotas (issue 9, hole 4) ----------------------------------------------------------------

def quota_registry(clock: FakeClock, publisher: RecordingPublisher, *, cap: int = 10,
                   per_token: int = 3) -> SessionRegistry:
    return SessionRegistry(cap=cap, idle_ttl=TTL, per_token=per_token, publisher=publisher, clock=clock)


@pytest.mark.parametrize(
    ("held", "quota", "has_idle", "action"),
    [
        pytest.param(0, 3, False, QuotaAction.ADMIT, id="empty"),
        pytest.param(2, 3, False, QuotaAction.ADMIT, id="below-quota-all-busy"),
        pytest.param(3, 3, True, QuotaAction.EVICT, id="at-quota-one-idle"),
        pytest.param(3, 3, False, QuotaAction.BUSY, id="at-quota-all-busy"),
        pytest.param(5, 3, True, QuotaAction.EVICT, id="over-quota-after-a-lowered-setting"),
    ],
)
def test_live_quota_decision(held: int, quota: int, has_idle: bool, action: QuotaAction) -> None:
    assert live_quota_action(held, quota, has_idle) is action


def _session(name: str, last_seen: float, inflight: int = 0) -> Session:
    return Session(name, "h", ALICE, VERSION, 0.0, last_seen, inflight=inflight)


@pytest.mark.parametrize(
    ("sessions", "victim"),
    [
        pytest.param([], None, id="none"),
        pytest.param([_session("a", 5), _session("b", 1), _session("c", 3)], "b", id="oldest-idle"),
        pytest.param([_session("a", 5), _session("b", 1, inflight=1), _session("c", 3)], "c",
                     id="busy-oldest-is-skipped"),
        pytest.param([_session("a", 5, inflight=2), _session("b", 1, inflight=1)], None, id="all-busy"),
    ],
)
def test_eviction_victim_is_the_least_recently_used_idle_session(sessions: list[Session], victim: str | None) -> None:
    chosen = least_recently_used_idle(sessions)
    assert (chosen.id if chosen else None) == victim


@pytest.mark.parametrize(
    ("own", "quota", "total", "bound", "largest_other", "action"),
    [
        pytest.param(0, 3, 0, 10, 0, TombstoneAction.RECORD, id="room"),
        pytest.param(2, 3, 9, 10, 3, TombstoneAction.RECORD, id="below-quota-map-has-room"),
        pytest.param(3, 3, 3, 10, 0, TombstoneAction.BLOCK_OWN, id="at-own-quota"),
        pytest.param(3, 3, 10, 10, 3, TombstoneAction.BLOCK_OWN, id="at-own-quota-map-full"),
        pytest.param(0, 3, 10, 10, 3, TombstoneAction.BLOCK_LARGEST, id="map-full-a-bigger-holder-gives-room"),
        pytest.param(1, 3, 10, 10, 2, TombstoneAction.BLOCK_LARGEST, id="map-full-bigger-by-one"),
        pytest.param(2, 3, 10, 10, 2, TombstoneAction.BLOCK_OWN, id="map-full-no-one-holds-more"),
        pytest.param(1, 3, 10, 10, 0, TombstoneAction.BLOCK_OWN, id="map-full-only-own"),
    ],
)
def test_tombstone_decision(own: int, quota: int, total: int, bound: int, largest_other: int,
                            action: TombstoneAction) -> None:
    assert tombstone_action(own, quota, total, bound, largest_other) is action


def test_at_its_quota_a_token_evicts_its_least_recently_used_idle_session(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher)
    sessions = []
    for _ in range(3):
        sessions.append(registry.open(ALICE_TOKEN, ALICE, VERSION))
        clock.advance(1)
    registry.touch(sessions[0])  # now sessions[1] is the least recently used
    newest = registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.held_by("alice") == 3
    assert registry.get(sessions[1].id) is None
    assert registry.get(newest.id) is newest
    assert close_reasons(publisher) == [(sessions[1].id, "evicted")]
    # no tombstone: its owner resumes it later, as after a restart
    assert registry.tombstone_count == 0
    sessions[2].inflight = 1
    sessions[0].inflight = 1
    newest.inflight = 1
    with pytest.raises(TokenSessionsBusy):
        resume(registry, sessions[1].id)
    newest.inflight = 0
    assert isinstance(resume(registry, sessions[1].id), Resumed)
    assert registry.get(newest.id) is None


def test_a_token_whose_sessions_are_all_busy_gets_retry_after_and_others_are_served(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher)
    for _ in range(3):
        registry.open(ALICE_TOKEN, ALICE, VERSION).inflight = 1
    with pytest.raises(TokenSessionsBusy) as busy:
        registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert busy.value.retry_after >= 1
    assert busy.value.reason == "session_quota_reached"
    assert registry.held_by("alice") == 3
    bob = registry.open(BOB_TOKEN, BOB, VERSION)
    assert registry.get(bob.id) is bob


def test_the_global_cap_never_evicts_another_tokens_session(clock: FakeClock, publisher: RecordingPublisher) -> None:
    registry = quota_registry(clock, publisher, cap=4, per_token=3)
    alice = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(3)]
    registry.open(BOB_TOKEN, BOB, VERSION)
    with pytest.raises(RegistryFull) as full:
        registry.open(CAROL_TOKEN, CAROL, VERSION)
    assert not isinstance(full.value, TokenSessionsBusy)
    assert all(registry.get(s.id) is s for s in alice)
    # alice at her own quota makes room from her own sessions, even at the cap
    registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert len(registry) == 4


def test_attack_one_token_filling_the_cap_no_longer_denies_another_tenant(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher, cap=10, per_token=3)
    for _ in range(50):
        registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert registry.held_by("alice") == 3
    bob = [registry.open(BOB_TOKEN, BOB, VERSION) for _ in range(3)]
    assert all(registry.get(s.id) is s for s in bob)


def test_attack_delegated_children_share_their_roots_session_quota(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher, cap=10, per_token=3)
    children = [Identity(token_id=f"dlg-{i}", parent_id="alice", ancestors=("alice",), depth=1) for i in range(6)]
    for child in children:
        registry.open(f"tok-{child.token_id}", child, VERSION)
    assert registry.held_by("alice") == 3
    assert len(registry) == 3


def test_resume_counts_toward_the_live_quota(clock: FakeClock, publisher: RecordingPublisher) -> None:
    registry = quota_registry(clock, publisher)
    for _ in range(5):
        assert isinstance(resume(registry, make_session_id(ALICE_TOKEN)), Resumed)
    assert registry.held_by("alice") == 3


def test_a_token_over_its_tombstone_quota_cannot_resume_until_its_tombstones_expire(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher)
    for _ in range(3):
        registry.delete(registry.open(ALICE_TOKEN, ALICE, VERSION).id)
    assert registry.tombstones_of("alice") == 3
    assert isinstance(resume(registry, make_session_id(ALICE_TOKEN)), Resumed)
    clock.advance(10)
    registry.delete(registry.open(ALICE_TOKEN, ALICE, VERSION).id)  # one past the quota
    assert registry.tombstones_of("alice") == 0  # replaced by one block on alice's own resumes
    assert resume(registry, make_session_id(ALICE_TOKEN)) is ResumeRefusal.TOMBSTONE_QUOTA
    assert isinstance(resume(registry, make_session_id(BOB_TOKEN), BOB_TOKEN, BOB), Resumed)
    assert isinstance(registry.open(ALICE_TOKEN, ALICE, VERSION), Session)  # initialize still works
    clock.advance(TTL)
    registry.sweep()
    assert isinstance(resume(registry, make_session_id(ALICE_TOKEN)), Resumed)


def test_attack_delete_churn_by_one_token_no_longer_refuses_another_tokens_resume(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher, cap=10, per_token=3)
    for _ in range(10 * 3):  # cap x (initialize + DELETE), several times over
        registry.delete(registry.open(ALICE_TOKEN, ALICE, VERSION).id)
    assert registry.tombstone_count <= 3
    assert isinstance(resume(registry, make_session_id(BOB_TOKEN), BOB_TOKEN, BOB), Resumed)


def test_a_full_tombstone_map_takes_room_from_the_largest_holder_only(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher, cap=4, per_token=3)
    alice = [registry.open(ALICE_TOKEN, ALICE, VERSION) for _ in range(3)]
    for s in alice:
        registry.delete(s.id)
    bob = registry.open(BOB_TOKEN, BOB, VERSION)
    registry.delete(bob.id)
    assert registry.tombstone_count == 4  # full
    carol = registry.open(CAROL_TOKEN, CAROL, VERSION)
    registry.delete(carol.id)
    # alice held the most: her tombstones became a block on her own resumes; bob and carol are recorded
    assert resume(registry, make_session_id(ALICE_TOKEN)) is ResumeRefusal.TOMBSTONE_QUOTA
    assert not any(isinstance(resume(registry, s.id), Resumed) for s in alice)
    assert resume(registry, bob.id, BOB_TOKEN, BOB) is ResumeRefusal.DELETED
    assert resume(registry, carol.id, CAROL_TOKEN, CAROL) is ResumeRefusal.DELETED
    assert isinstance(resume(registry, make_session_id(BOB_TOKEN), BOB_TOKEN, BOB), Resumed)
    assert isinstance(resume(registry, make_session_id(CAROL_TOKEN), CAROL_TOKEN, CAROL), Resumed)


def test_many_tokens_deleting_never_make_a_deleted_id_resumable(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    """The safety rule under every quota path: within its TTL a deleted id is never served again."""
    registry = quota_registry(clock, publisher, cap=6, per_token=2)
    deleted: list[tuple[str, str, Identity]] = []
    for round_ in range(40):
        name = f"t{round_ % 5}"
        token, identity = f"tok-{name}", Identity(token_id=name)
        session = registry.open(token, identity, VERSION)
        registry.delete(session.id)
        deleted.append((session.id, token, identity))
        clock.advance(5)
        for sid, tok, ident in deleted:
            assert not isinstance(registry.resume(sid, tok, ident, VERSION), Resumed)


# --- shared identities (issue 23): a per-token quota must not become a gateway-wide cap ---------------------

STATIC = Identity(token_id="static")


@pytest.mark.parametrize(
    ("mode", "quota"),
    [
        pytest.param("none", None, id="none-everyone-is-anonymous"),
        pytest.param("config", None, id="config-one-shared-secret"),
        pytest.param("header", 100, id="header-a-token-id-per-tenant"),
        pytest.param("oauth", 100, id="oauth-a-subject-per-tenant"),
        pytest.param("custom", 100, id="unknown-mode-keeps-the-quota"),
    ],
)
def test_per_token_quota_by_auth_mode(mode: str, quota: int | None) -> None:
    assert per_token_quota(mode, 100) == quota


def evictions_warned(logs: Sequence[Mapping[str, object]]) -> list[object]:
    return [e["token_id"] for e in logs if e["event"] == QUOTA_EVICTING and e["log_level"] == "warning"]


@pytest.mark.parametrize(
    ("mode", "identity", "tokens"),
    [
        pytest.param("none", ANONYMOUS_IDENTITY, [f"client-{n}" for n in range(150)], id="none"),
        pytest.param("config", STATIC, ["s3cret-static"] * 150, id="config"),
    ],
)
def test_150_clients_of_a_shared_identity_all_keep_their_sessions(
    clock: FakeClock, publisher: RecordingPublisher, mode: str, identity: Identity, tokens: list[str]
) -> None:
    """SATGATE_SESSIONS_PER_TOKEN=100 used to close the first 50 sessions: one identity is not one client."""
    registry = SessionRegistry(cap=10_000, idle_ttl=TTL, per_token=per_token_quota(mode, 100), publisher=publisher,
                               clock=clock)
    with capture_logs() as logs:
        sessions = []
        for token in tokens:
            sessions.append(registry.open(token, identity, VERSION))
            clock.advance(1)
    assert all(registry.get(s.id) is s for s in sessions)
    assert registry.held_by(identity.token_id) == 150
    assert close_reasons(publisher) == []
    assert evictions_warned(logs) == []


def test_a_shared_identity_is_still_bounded_by_the_session_cap(clock: FakeClock, publisher: RecordingPublisher
                                                                ) -> None:
    registry = SessionRegistry(cap=5, idle_ttl=TTL, per_token=per_token_quota("none", 2), publisher=publisher,
                               clock=clock)
    sessions = [registry.open(f"client-{n}", ANONYMOUS_IDENTITY, VERSION) for n in range(5)]
    with pytest.raises(RegistryFull) as full:
        registry.open("client-5", ANONYMOUS_IDENTITY, VERSION)
    assert not isinstance(full.value, TokenSessionsBusy)
    assert all(registry.get(s.id) is s for s in sessions)  # the cap refuses; it never evicts


def test_attack_in_header_mode_one_token_flooding_still_evicts_only_its_own_sessions(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = SessionRegistry(cap=10_000, idle_ttl=TTL, per_token=per_token_quota("header", 100),
                               publisher=publisher, clock=clock)
    bob = registry.open(BOB_TOKEN, BOB, VERSION)
    with capture_logs() as logs:
        for _ in range(150):
            registry.open(ALICE_TOKEN, ALICE, VERSION)
            clock.advance(1)
    assert registry.held_by("alice") == 100
    assert [reason for _, reason in close_reasons(publisher)] == ["evicted"] * 50
    assert registry.get(bob.id) is bob
    assert evictions_warned(logs) == ["alice"]


def test_the_eviction_warning_is_logged_once_per_token_id_per_process(
    clock: FakeClock, publisher: RecordingPublisher
) -> None:
    registry = quota_registry(clock, publisher, cap=100, per_token=3)
    with capture_logs() as logs:
        for _ in range(10):
            registry.open(ALICE_TOKEN, ALICE, VERSION)
            registry.open(BOB_TOKEN, BOB, VERSION)
        clock.advance(TTL)
        registry.sweep()  # every session idles out; a later episode is still the same token id
        for _ in range(5):
            registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert evictions_warned(logs) == ["alice", "bob"]
    [warning] = [e for e in logs if e["token_id"] == "alice"]
    assert warning["quota"] == 3
    assert "SATGATE_SESSIONS_PER_TOKEN" in str(warning["hint"])
    assert len(close_reasons(publisher)) > 2  # each eviction is still an event, only the warning is once


def test_no_warning_while_a_token_stays_within_its_quota(clock: FakeClock, publisher: RecordingPublisher) -> None:
    registry = quota_registry(clock, publisher, cap=100, per_token=3)
    with capture_logs() as logs:
        for _ in range(3):
            registry.open(ALICE_TOKEN, ALICE, VERSION)
    assert evictions_warned(logs) == []


def test_the_warned_token_ids_stay_bounded(clock: FakeClock, publisher: RecordingPublisher,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("satgate_mcp.sessions.QUOTA_WARNED_BOUND", 2)
    registry = quota_registry(clock, publisher, cap=100, per_token=1)
    with capture_logs() as logs:
        for name in ["a", "b", "c", "a"]:
            for _ in range(2):
                registry.open(f"tok-{name}", Identity(token_id=name), VERSION)
    assert evictions_warned(logs) == ["a", "b", "c", "a"]  # "a" was forgotten when the set started over
    assert len(registry._quota_warned) <= 2

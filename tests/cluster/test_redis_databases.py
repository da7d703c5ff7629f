"""Two deployments on two databases of one Redis server stay apart: keys live in the URL's database, and the
pub/sub channels (one space for the whole server) are named for it, so a revocation or a DELETE published by
one deployment never reaches the other's processes. The machine's Redis, token ids of the test's own."""

from __future__ import annotations

import asyncio

from satgate_mcp.stores.redis.channel import channel_in
from satgate_mcp.stores.redis.revocations import RedisRevocationStore
from tests.cluster.cluster import SHARED_REDIS, shared_redis_url, unique

SPREAD = 1.0


def test_a_channel_is_named_for_its_database_and_database_0_keeps_the_plain_name() -> None:
    assert channel_in("redis://127.0.0.1:6379/0", "satgate:revoked:events") == "satgate:revoked:events"
    assert channel_in("redis://127.0.0.1:6379", "satgate:revoked:events") == "satgate:revoked:events"
    assert channel_in("redis://127.0.0.1:6379/7", "satgate:revoked:events") == "satgate:revoked:events@db7"
    assert channel_in("unix:///run/redis.sock?db=3", "satgate:tomb:events") == "satgate:tomb:events@db3"


async def test_attack_a_revocation_in_one_database_does_not_revoke_the_same_id_in_another() -> None:
    theirs_url = await shared_redis_url()
    ours_url = f"{SHARED_REDIS}/0" if not theirs_url.endswith("/0") else f"{SHARED_REDIS}/1"
    ours, ours_admin = RedisRevocationStore(ours_url), RedisRevocationStore(ours_url)
    theirs = RedisRevocationStore(theirs_url)
    same_name, sentinel = unique("agent"), unique("sentinel")
    try:
        assert not await ours.is_revoked(same_name)
        await asyncio.wait_for(ours.synced.wait(), 2)
        await theirs.revoke(same_name)  # the other deployment revokes its own token of that name
        await ours_admin.revoke(sentinel)  # published after it: once ours has this, it had the other too
        async with asyncio.timeout(SPREAD):
            while not await ours.is_revoked(sentinel):
                ours.changed.clear()
                await ours.changed.wait()
        assert not await ours.is_revoked(same_name)
    finally:
        for store in (ours, ours_admin, theirs):
            await store.aclose()

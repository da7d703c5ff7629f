"""SIGKILL of one of two gateways under load costs no session (issue 14): 50 sessions spread over two real
``satgate-mcp serve`` processes sharing the machine's Redis and one root key keep calling; one process is
killed with SIGKILL mid-run; every session then continues on the other under its own id (the gateway
resumes it from the token), with no new ``initialize``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx2
import pytest

from tests.cluster.cluster import Answer, Cluster, Mcp, shared_redis_url, unique
from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.process

SESSIONS = 50
#: Calls every session has answered before the kill: the load is on when it comes.
CALLS_BEFORE_KILL = 3
TEST_TIMEOUT = 90.0


class Agent:
    """One client session, calling in a loop on the gateway it is sent to."""

    def __init__(self, client: Mcp, gateway: GatewayProcess, session: str) -> None:
        self.client = client
        self.gateway = gateway
        self.session = session
        self.sent = 0
        self.answers: list[tuple[int, Answer]] = []

    async def call(self) -> Answer:
        self.sent += 1
        answer = await self.client.echo(self.gateway, self.session, self.sent, f"{self.session}-{self.sent}")
        self.answers.append((self.gateway.port, answer))
        return answer

    async def keep_calling(self, stop: asyncio.Event, warmed: asyncio.Event, warm: list[int]) -> None:
        """Call until told to stop; a call cut by the kill (connection lost) is the client's to retry."""
        while not stop.is_set():
            try:
                answer = await self.call()
            except httpx2.TransportError:
                return  # our gateway died under this call
            assert answer.outcome == "served", answer
            if self.sent == CALLS_BEFORE_KILL:
                warm.append(1)
                if len(warm) == SESSIONS:
                    warmed.set()


async def test_every_session_continues_on_the_other_gateway_after_a_sigkill_under_load(
        make_cluster: Callable[..., Cluster], http: httpx2.AsyncClient) -> None:
    cluster = make_cluster(await shared_redis_url())
    async with asyncio.timeout(TEST_TIMEOUT):
        a, b = await cluster.started(2)
        clients = [Mcp.mint(http, unique(f"agent{n}")) for n in range(SESSIONS)]
        homes = [a if n % 2 else b for n in range(SESSIONS)]
        sessions = await asyncio.gather(*(c.initialize(gw) for c, gw in zip(clients, homes, strict=True)))
        agents = [Agent(c, gw, s) for c, gw, s in zip(clients, homes, sessions, strict=True)]

        stop, warmed = asyncio.Event(), asyncio.Event()
        warm: list[int] = []
        load = [asyncio.ensure_future(agent.keep_calling(stop, warmed, warm)) for agent in agents]
        await warmed.wait()
        assert await a.kill() == [], "an upstream child outlived the SIGKILLed gateway"
        stop.set()
        await asyncio.gather(*load)

        for agent in agents:
            agent.gateway = b  # the balancer sends everything to the survivor
        after = await asyncio.gather(*(agent.call() for agent in agents))

    assert [answer.outcome for answer in after] == ["served"] * SESSIONS, after
    moved = agents[1::2]  # the ones A served
    assert all(agent.answers[-1][1].body["result"]["content"][0]["text"] == f"{agent.session}-{agent.sent}"
               for agent in agents)
    resumed = {e["session_id"] for e in b.events("session_connect") if e["resumed"]}
    assert {agent.session for agent in moved} <= resumed  # B rebuilt each from its token; same id
    assert not {e["session_id"] for e in b.events("session_connect") if not e["resumed"]} & resumed
    print(f"{sum(agent.sent for agent in agents)} calls; {len(moved)} sessions moved from A to B")

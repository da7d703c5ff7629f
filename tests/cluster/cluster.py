"""Two (or more) real ``satgate-mcp serve`` processes in header mode on one Redis, and a raw HTTP MCP client.

Each test gets its own Redis namespace: a database number of its own on the machine's shared Redis
(127.0.0.1:6379), or a redis-server it starts itself, plus token ids of its own, so parallel runs never
see each other's budgets, revocations or tombstones.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis.asyncio as redis

from satgate_mcp.auth.macaroons import mint_token
from tests.answers import decode_answer
from tests.gateway_process import GatewayProcess

ROOT_KEY = "cluster-tests-root-key-0123456789abcdefghij"
SHARED_REDIS = "redis://127.0.0.1:6379"
VERSION = "2025-11-25"
#: Bound on one HTTP exchange with a gateway: a guard against a hang, not a speed target.
HTTP_TIMEOUT = 10.0
#: Databases 1-15 of the shared Redis; other tests use database 0.
_DATABASES = 15


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def shared_redis_url() -> str:
    """A database of the machine's Redis that is empty now (picked at random, so parallel runs rarely meet;
    their token ids differ anyway); skips the test without a Redis."""
    probe = redis.Redis.from_url(SHARED_REDIS, socket_connect_timeout=1, socket_timeout=1)
    try:
        await probe.ping()
    except (OSError, redis.RedisError):
        pytest.skip("no Redis at 127.0.0.1:6379")
    finally:
        await probe.aclose()
    return f"{SHARED_REDIS}/{1 + secrets.randbelow(_DATABASES)}"


@dataclass
class Cluster:
    """Gateways made on one Redis URL; every one is SIGKILLed at the end."""

    workdir: Path
    redis_url: str
    settings: dict[str, str] = field(default_factory=dict)
    made: list[GatewayProcess] = field(default_factory=list)

    def gateway(self) -> GatewayProcess:
        gw = GatewayProcess(self.workdir, root_key=ROOT_KEY,
                            settings={"SATGATE_REDIS_URL": self.redis_url, "SATGATE_ENFORCEMENT": "control",
                                      **self.settings})
        gw.cli_env["SATGATE_REDIS_URL"] = self.redis_url
        self.made.append(gw)
        return gw

    async def started(self, count: int) -> list[GatewayProcess]:
        gateways = [self.gateway() for _ in range(count)]
        for gw in gateways:
            gw.start()
        await asyncio.gather(*(gw.wait_ready() for gw in gateways))
        return gateways

    async def aclose(self) -> None:
        for gw in self.made:
            await gw.kill()


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(redis_url: str, **settings: str) -> Cluster:
        cluster = Cluster(tmp_path, redis_url, settings)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.aclose()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def outcome(self) -> str:
        """``served``, the JSON-RPC refusal's ``data.error``, or ``http <status>``."""
        if isinstance(self.body, dict):
            if "result" in self.body:
                return "served"
            data = self.body.get("error", {}).get("data")
            if isinstance(data, dict) and "error" in data:
                return str(data["error"])
        return f"http {self.status}"


class Mcp:
    """MCP over plain HTTP as a client sends it: one bearer, any gateway, any session id."""

    def __init__(self, http: httpx2.AsyncClient, token: str) -> None:
        self.http = http
        self.token = token

    @classmethod
    def mint(cls, http: httpx2.AsyncClient, token_id: str, **caveats: Any) -> Mcp:
        return cls(http, mint_token(ROOT_KEY, token_id, **caveats))

    def headers(self, session: str | None) -> dict[str, str]:
        sent = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
        if session is not None:
            sent["Mcp-Session-Id"] = session
        return sent

    async def rpc(self, gw: GatewayProcess, session: str | None, request_id: int, method: str,
                  params: dict[str, Any] | None = None) -> Answer:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        resp = await self.http.post(f"{gw.url}/mcp", content=json.dumps(message), headers=self.headers(session))
        content_type = resp.headers.get("content-type", "").partition(";")[0]
        body = (decode_answer(content_type, resp.content) if content_type in ("application/json", "text/event-stream")
                else resp.text)
        return Answer(resp.status_code, dict(resp.headers), body)

    async def initialize(self, gw: GatewayProcess) -> str:
        answer = await self.rpc(gw, None, 0, "initialize", {"protocolVersion": VERSION, "capabilities": {},
                                                            "clientInfo": {"name": "cluster", "version": "1"}})
        assert answer.status == 200, answer
        session = answer.headers["mcp-session-id"]
        resp = await self.http.post(f"{gw.url}/mcp", headers=self.headers(session),
                                    content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        assert resp.status_code == 202, resp.text
        return session

    async def echo(self, gw: GatewayProcess, session: str, request_id: int, text: str) -> Answer:
        return await self.rpc(gw, session, request_id, "tools/call", {"name": "echo", "arguments": {"text": text}})

    async def delete(self, gw: GatewayProcess, session: str) -> int:
        return (await self.http.delete(f"{gw.url}/mcp", headers=self.headers(session))).status_code


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    limits = httpx2.Limits(max_connections=200, max_keepalive_connections=100)
    async with httpx2.AsyncClient(trust_env=False, timeout=HTTP_TIMEOUT, limits=limits) as client:
        yield client

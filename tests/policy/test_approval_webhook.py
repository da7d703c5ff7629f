"""The approval webhook against a real HTTP receiver: a delivery is signed so the receiver can check it, retried
after a 5xx or a refused connection under one delivery id, given up at once on a 4xx, and ``send`` never waits for
a receiver that hangs (the queue is bounded: the oldest payload is dropped and counted)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from satgate_mcp.policy.approval_webhook import ApprovalWebhook, retry_after, verify
from satgate_mcp.settings_governance import check_webhook_url

SECRET = "webhook-secret-0123456789abcdef"
Server = Callable[..., Coroutine[Any, Any, TestServer]]


class Receiver:
    """Answers each POST with the next status of ``statuses`` (then 200), and keeps what it got."""

    def __init__(self, statuses: list[int], *, hang: bool = False) -> None:
        self.statuses = statuses
        self.hang = hang
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.delivered = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append((dict(request.headers), await request.read()))
        if self.hang:
            await asyncio.Event().wait()
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.delivered.set()
        return web.Response(status=status, headers={"Retry-After": "0"} if status == 503 else {})


async def serve(aiohttp_server: Server, receiver: Receiver) -> str:
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    server = await aiohttp_server(app)
    return str(server.make_url("/hook"))


def sender(url: str, outcomes: list[str], **options: Any) -> ApprovalWebhook:
    return ApprovalWebhook(url, SECRET, outcome=outcomes.append, first_backoff=0.01, max_backoff=0.05, **options)


async def test_a_delivery_is_signed_and_the_receiver_can_check_it(aiohttp_server: Server) -> None:
    receiver, outcomes = Receiver([]), list[str]()
    hook = sender(await serve(aiohttp_server, receiver), outcomes)
    await hook.start()
    hook.send({"event": "approval_requested", "approval_id": "apr_1", "tool": "pay"})
    await receiver.delivered.wait()
    await hook.aclose()
    [(headers, body)] = receiver.got
    assert json.loads(body) == {"approval_id": "apr_1", "event": "approval_requested", "tool": "pay"}
    assert headers["X-Satgate-Event"] == "approval_requested"
    assert verify(SECRET, headers["X-Satgate-Timestamp"], body, headers["X-Satgate-Signature"])
    assert not verify(SECRET, headers["X-Satgate-Timestamp"], body.replace(b"pay", b"PAY"),
                      headers["X-Satgate-Signature"])
    assert not verify("another-secret", headers["X-Satgate-Timestamp"], body, headers["X-Satgate-Signature"])
    assert outcomes == ["delivered"]


async def test_a_5xx_is_retried_under_one_delivery_id_and_a_4xx_is_not(aiohttp_server: Server) -> None:
    receiver, outcomes = Receiver([500, 503]), list[str]()
    hook = sender(await serve(aiohttp_server, receiver), outcomes)
    await hook.start()
    hook.send({"event": "approval_requested", "approval_id": "apr_2"})
    await receiver.delivered.wait()
    assert len({headers["X-Satgate-Delivery"] for headers, _ in receiver.got}) == 1
    assert len(receiver.got) == 3
    refused = Receiver([400])
    refusing = sender(await serve(aiohttp_server, refused), outcomes)
    await refusing.start()
    refusing.send({"event": "approval_requested", "approval_id": "apr_3"})
    await refusing.aclose()  # its grace ends once the one delivery is given up
    await hook.aclose()
    assert len(refused.got) == 1
    assert outcomes == ["delivered", "given_up"]


async def test_a_refused_connection_is_retried_then_given_up(unused_tcp_port: int) -> None:
    outcomes: list[str] = []
    hook = sender(f"http://127.0.0.1:{unused_tcp_port}/hook", outcomes, attempts=3)
    await hook.start()
    hook.send({"event": "approval_requested"})
    await hook.aclose()
    assert outcomes == ["given_up"]


async def test_send_never_waits_for_a_hung_receiver_and_drops_the_oldest(aiohttp_server: Server) -> None:
    receiver, outcomes = Receiver([], hang=True), list[str]()
    hook = sender(await serve(aiohttp_server, receiver), outcomes, max_queue=3, timeout=60)
    await hook.start()
    for n in range(20):
        hook.send({"event": "approval_requested", "n": n})  # returns at once every time
    assert outcomes.count("dropped") >= 20 - 3 - 4
    await hook.aclose()  # bounded by its grace, whatever the receiver does


@pytest.mark.parametrize(("url", "ok"), [
    ("https://hooks.example.com/x", True), ("http://127.0.0.1:9000/hook", True),
    ("ftp://hooks.example.com/x", False), ("https://", False), ("hooks.example.com/x", False),
    ("https://user:pw@hooks.example.com/x", False),
])
def test_the_url_is_checked(url: str, ok: bool) -> None:
    if ok:
        assert check_webhook_url(url) == url
    else:
        with pytest.raises(ValueError, match="must"):
            check_webhook_url(url)


@pytest.mark.parametrize(("value", "seconds"), [("3", 3.0), ("600", 30.0), (None, None), ("soon", None),
                                                 ("Wed, 21 Oct 2026 07:28:00 GMT", None)])
def test_retry_after_is_whole_seconds_capped(value: str | None, seconds: float | None) -> None:
    assert retry_after(value, 30.0) == seconds

"""One HTTP upstream's exchanges: a message POSTed, and its answer read as JSON or as an event stream.

The session's lifecycle (initialize, renew, listen) is http.py's; this layer only knows how an answer
arrives (a JSON body, an SSE stream, a stream resumed after the upstream paused it) and routes what
comes with the reply. What a lost connection means for the session is the subclass's call
(``_connection_lost``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from satgate_mcp import tracing
from satgate_mcp.errors import UpstreamUnavailable
from satgate_mcp.events import Publisher
from satgate_mcp.jsonrpc import JsonObj, RequestId
from satgate_mcp.metrics import Metrics
from satgate_mcp.settings import HttpUpstreamSpec
from satgate_mcp.trace_context import inject_headers
from satgate_mcp.upstream.connection import UpstreamConnection
from satgate_mcp.upstream.http_rules import JSON_AND_SSE, request_headers
from satgate_mcp.upstream.outgoing import encode_message
from satgate_mcp.upstream.wire import RestartPolicy, SseDecoder, clip, modern_headers

#: Resumptions of a paused call stream in a row that may bring nothing new before the call fails.
RESUME_ATTEMPTS = 3
#: Largest JSON body accepted from an upstream.
MAX_BODY = 64 * 1024 * 1024


class HttpChannel(UpstreamConnection[HttpUpstreamSpec]):
    """What one POST or GET to the upstream carries and how its answer is read; the session state it sends."""

    def __init__(self, name: str, spec: HttpUpstreamSpec, *, publisher: Publisher, metrics: Metrics,
                 restart_policy: RestartPolicy | None) -> None:
        super().__init__(name, spec, transport="http", send=self._post_message, publisher=publisher,
                         metrics=metrics, restart_policy=restart_policy)
        self._http: aiohttp.ClientSession | None = None
        self._session_id: str | None = None
        self._protocol_version: str | None = None

    def _configured_headers(self) -> Mapping[str, str]:
        """The operator's headers every request carries; an upstream with ``"auth"`` adds its credential per call."""
        return self._spec.headers

    def _connection_lost(self, why: str) -> None:
        """The upstream could not be reached: the session layer (``HttpUpstream``) decides how to recover."""
        raise NotImplementedError

    def _headers(self, message: JsonObj) -> dict[str, str]:
        """A POST's headers: the session's in 2025; in 2026-07-28 (and for discovery) the routing ones, no session."""
        headers = request_headers(self._configured_headers(), accept=JSON_AND_SSE, session_id=self._session_id,
                                  protocol_version=self._protocol_version, json_body=True)
        if self._modern or message.get("method") == "server/discover":
            headers.pop("Mcp-Session-Id", None)
            headers.update(modern_headers(message))
        if tracing.TRACER is not None:
            inject_headers(headers)  # the current span: the request's client span (none for the gateway's own)
        return headers

    async def _post(self, message: JsonObj, route: str | None = None) -> tuple[int, JsonObj | None, str | None]:
        """POST one request: (status, the reply with its id or None, the Mcp-Session-Id header).

        What the answer carries besides the reply belongs to the call ``route`` names.
        """
        assert self._http is not None
        headers = self._headers(message)
        want = message["id"]
        try:
            async with self._http.post(self._spec.url, data=encode_message(message), headers=headers) as resp:
                session_id = resp.headers.get("Mcp-Session-Id")
                if resp.content_type == "text/event-stream" and resp.status == 200:
                    decoder = SseDecoder()
                    reply = await self._read_stream(resp, want, route, decoder)
                else:
                    body = await _read_limited(resp)
                    reply = self._take(body, want, route) if body.strip() else None
                    if reply is None and resp.status == 200:
                        raise self._unavailable(f"upstream {self.name!r} answered without a reply to the request")
                    return resp.status, reply, session_id
            resumable = decoder.last_id is not None and self._session_id is not None and not self._modern
            if reply is None and want is not None and resumable:
                reply = await self._resume_stream(decoder, want, route)
            return resp.status, reply, session_id
        except (aiohttp.ClientError, OSError) as exc:
            why = str(exc) or type(exc).__name__
            self._connection_lost(why)
            # Only a failed connect proves nothing was sent; a reset or a lost reply may follow a run.
            sent = not isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)
            raise self._unavailable(f"cannot reach upstream {self.name!r}: {why}", sent=sent) from None

    async def _resume_stream(self, decoder: SseDecoder, want: RequestId, route: str | None) -> JsonObj | None:
        """The upstream closed a call's stream before its answer (SEP-1699 polling): resume it with ``Last-Event-ID``.

        The client's stream closes likewise, so it polls the gateway as it would the upstream. The upstream is
        resumed at once, not after its ``retry``: the client's own wait is the poll interval, and a client that
        came back finds what the upstream said meanwhile. Gives up (None) when the upstream refuses the
        resumption or a few resumptions in a row bring nothing new.
        """
        assert self._http is not None
        await self._inbox.pause(route)
        fruitless = 0
        while fruitless < RESUME_ATTEMPTS:
            seen = decoder.last_id
            assert seen is not None
            headers = request_headers(self._configured_headers(), accept="text/event-stream",
                                      session_id=self._session_id, protocol_version=self._protocol_version,
                                      json_body=False)
            headers["Last-Event-ID"] = seen
            async with self._http.get(self._spec.url, headers=headers) as resp:
                if resp.status != 200 or resp.content_type != "text/event-stream":
                    self._log.info("upstream_resume_refused", status=resp.status, last_event_id=seen[:80])
                    return None
                reply = await self._read_stream(resp, want, route, decoder)
            if reply is not None:
                return reply
            fruitless = 0 if decoder.last_id != seen else fruitless + 1
        return None

    async def _post_message(self, message: JsonObj) -> int:
        """POST a notification or a reply to the upstream; returns the HTTP status (202 expected)."""
        if self._http is None:
            raise UpstreamUnavailable(f"upstream {self.name!r} is not running")
        headers = self._headers(message)
        try:
            async with self._http.post(self._spec.url, data=encode_message(message), headers=headers) as resp:
                await _read_limited(resp)
                return resp.status
        except (aiohttp.ClientError, OSError) as exc:
            raise self._unavailable(f"cannot reach upstream {self.name!r}: {exc}") from None

    async def _read_stream(self, resp: aiohttp.ClientResponse, want: RequestId | None,
                           route: str | None = None, decoder: SseDecoder | None = None) -> JsonObj | None:
        """Handle everything on an event stream until the reply with id ``want`` arrives."""
        decoder = decoder or SseDecoder()
        async for chunk in resp.content.iter_any():
            try:
                batch = decoder.feed(chunk)
            except ValueError as exc:
                raise UpstreamUnavailable(f"upstream {self.name!r} sent a broken event stream: {exc}") from None
            for event in batch:
                if event.event != "message" or not event.data.strip():
                    continue
                reply = self._take(event.data.encode(), want, route)
                if reply is not None:
                    return reply
        return None

    def _take(self, body: bytes, want: RequestId | None, route: str | None = None) -> JsonObj | None:
        """Route what arrived; return the reply to ``want`` when it is among it."""
        try:
            value: Any = json.loads(body)
        except ValueError:
            self._log.warning("upstream_output_not_json", body=clip(body.decode("utf-8", "replace"), 500))
            return None
        found = None
        for message, item in self._sort_incoming(value, route):
            # A null id with an error is a refusal of the whole POST: it answers ours too.
            if want is not None and (message.id == want or (message.id is None and message.error)):
                found = item
            else:
                self._log.debug("upstream_reply_unmatched", request_id=message.id)
        return found


async def _read_limited(resp: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > MAX_BODY:
            raise UpstreamUnavailable(f"upstream answered with more than {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)

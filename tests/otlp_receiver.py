"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` decoded with ``opentelemetry-proto``.

``hang=True`` makes it a collector that accepts the connection and never answers (the gateway's exporter
then times out); a receiver never started is a collector that is down.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

#: OTLP's span kinds, by number.
KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class Event:
    name: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Span:
    """One exported span, ids as lower-case hex."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    attributes: dict[str, Any]
    status: str
    status_message: str
    events: list[Event]
    links: list[tuple[str, str]]
    resource: dict[str, Any]


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(Span(
                    s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name, KINDS.get(s.kind, "?"),
                    _attributes(s.attributes), STATUS.get(s.status.code, "?"), s.status.message,
                    [Event(e.name, _attributes(e.attributes)) for e in s.events],
                    [(link.trace_id.hex(), link.span_id.hex()) for link in s.links], resource))
    return spans


@dataclass
class OtlpReceiver:
    hang: bool = False
    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def _traces(self, request: web.Request) -> web.StreamResponse:
        self.posts += 1
        if self.hang:
            await asyncio.Event().wait()  # never answers; the client gives up (its timeout)
        self.spans.extend(decode(await request.read()))
        self.arrived.set()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        return app

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, trace_id: str | None, name: str, kind: str, timeout: float = 10.0) -> Span:
        """The span (of that trace, when given) with that name and kind, once exported (bounded wait)."""
        async with asyncio.timeout(timeout):
            while True:
                found = [s for s in self.spans if s.name == name and s.kind == kind
                         and trace_id in (None, s.trace_id)]
                if found:
                    return found[0]
                self.arrived.clear()
                await self.arrived.wait()

    async def wait_span(self, span_id: str, timeout: float = 10.0) -> Span:
        async with asyncio.timeout(timeout):
            while True:
                found = [s for s in self.spans if s.span_id == span_id]
                if found:
                    return found[0]
                self.arrived.clear()
                await self.arrived.wait()

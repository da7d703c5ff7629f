"""OpenTelemetry tracing, set up once from ``SATGATE_TRACING`` and the standard ``OTEL_*`` variables.

The request path asks one thing of this module: ``TRACER``, None while tracing is off (the default), so
the off path costs one global lookup and creates no span object. The SDK reads its own variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRACES_SAMPLER`` and its argument, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_BSP_*``); what is decided here is only which exporter (``OTEL_EXPORTER_OTLP_PROTOCOL``), the
service name when none is given, and counting the batches an exporter failed to deliver. The SDK and
the exporters are imported only when tracing is on.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import structlog
from opentelemetry.trace import Tracer

from satgate_mcp import __version__
from satgate_mcp.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from prometheus_client import Counter

log = structlog.get_logger("satgate_mcp.tracing")

#: The tracer while tracing is on; None when off. Read on every request: keep it the one check.
TRACER: Tracer | None = None

#: Instrumentation scope of every span the gateway makes.
SCOPE = "satgate_mcp"
DEFAULT_SERVICE_NAME = "satgate-mcp"

Exporter = Literal["http", "grpc", "console"]
#: ``OTEL_EXPORTER_OTLP_PROTOCOL`` values the Python exporters implement (``http/json`` has none).
PROTOCOLS: dict[str, Exporter] = {"http/protobuf": "http", "grpc": "grpc"}


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``start`` will build: checked when the app is assembled, so a wrong variable stops start-up."""

    exporter: Exporter
    #: The service name to add when the environment names none (None: it does).
    default_service_name: str | None


def plan(mode: str, env: Mapping[str, str]) -> Plan | None:
    """None when tracing is off; else the exporter (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` first, as the
    SDK reads it) and whether the service name is still ours to give."""
    if mode == "off":
        return None
    default_name = None if names_service(env) else DEFAULT_SERVICE_NAME
    if mode == "console":
        return Plan("console", default_name)
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    exporter = PROTOCOLS.get(protocol)
    if exporter is None:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not one the gateway can export with: "
                          f"use {' or '.join(repr(p) for p in PROTOCOLS)}")
    return Plan(exporter, default_name)


def names_service(env: Mapping[str, str]) -> bool:
    """Whether the environment names the service itself (``OTEL_SERVICE_NAME``, or ``service.name`` among the
    ``OTEL_RESOURCE_ATTRIBUTES``): then the SDK's name stands, else the gateway's default."""
    if env.get("OTEL_SERVICE_NAME", "").strip():
        return True
    pairs = (item.partition("=") for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","))
    return any(key.strip() == "service.name" and value.strip() for key, _, value in pairs)


def _exporter(kind: Exporter) -> SpanExporter:
    if kind == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    if kind == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    return ConsoleSpanExporter(out=sys.stderr)  # stdout carries the JSON log lines


def counting(exporter: SpanExporter, failures: Counter) -> SpanExporter:
    """``exporter``, with each batch it could not deliver (a failure, or an error it raised) counted."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            try:
                result = exporter.export(spans)
            except Exception as exc:  # an exporter bug must not end the export thread
                log.warning("trace_export_failed", spans=len(spans), error=str(exc) or type(exc).__name__)
                result = SpanExportResult.FAILURE
            if result is not SpanExportResult.SUCCESS:
                failures.inc()
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return exporter.force_flush(timeout_millis)

    return CountingExporter()


def start(chosen: Plan, failures: Counter) -> TracerProvider:
    """The provider (sampler and resource from the environment, a batching processor), made the one ``TRACER``."""
    global TRACER
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    ours: dict[str, str] = {SERVICE_VERSION: __version__}
    if chosen.default_service_name is not None:
        ours[SERVICE_NAME] = chosen.default_service_name
    resource = Resource.create(ours)
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER(_ARG), as the SDK reads them
    provider.add_span_processor(BatchSpanProcessor(counting(_exporter(chosen.exporter), failures)))
    TRACER = provider.get_tracer(SCOPE, __version__)
    log.info("tracing_started", exporter=chosen.exporter, service=str(resource.attributes.get(SERVICE_NAME)))
    return provider


def stop(provider: TracerProvider) -> None:
    """Tracing off again; the spans still queued are exported (within the processor's own timeout)."""
    global TRACER
    TRACER = None
    provider.shutdown()

"""Tracing set-up shared by every service: one call, `setup_telemetry`, at the start of each `main`.

What it turns on depends only on the standard OpenTelemetry variables:

- `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set (or `OTEL_TRACES_EXPORTER=otlp`):
  spans go over OTLP/gRPC through a BatchSpanProcessor (`OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_*` respected);
- `OTEL_TRACES_EXPORTER=console`: spans are printed on stdout (debugging);
- neither, `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true`: nothing. No interceptor is installed and
  no library is instrumented, so the services run exactly as without this module; the task spans of the
  scheduler and the worker then come from the API's no-op tracer and cost a flag check.

With tracing on: a TracerProvider whose resource names the service (`sieve-intake`, `sieve-scheduler`,
`sieve-registry`, `sieve-worker`, plus `OTEL_RESOURCE_ATTRIBUTES`), gRPC server and client spans for every
RPC except health checks (`rpc.create_server` and `rpc.channel` take the interceptors from here;
they work with grpc.aio streams, the bidirectional Pull included), and Redis and PostgreSQL client spans.
Redis and PostgreSQL calls get a span only inside a traced operation (an RPC, a task's claim or run): the
background loops (dispatch polling, housekeeping, scrapes, group commits) would otherwise start one trace
per call. The sampler is `OTEL_TRACES_SAMPLER` when set, else parent-based always-on.

`shutdown_telemetry` flushes and stops the exporter; `rpc.run_main` calls it after the service's ordered
shutdown, so the spans of the last tasks (drained on SIGTERM) are still sent.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sieve.settings import Settings

log = logging.getLogger("sieve.observe.telemetry")

#: the instrumentation scope of Sieve's own spans (claim, assign, run, ...)
TRACER_NAME = "sieve"
_PROPAGATOR = TraceContextTextMapPropagator()
_HEALTH_PREFIX = "/grpc.health.v1."


@dataclass
class Telemetry:
    """What `setup_telemetry` turned on in this process."""

    service_name: str
    #: "otlp", "console", or "" (tracing off)
    exporter: str = ""
    provider: Any = None
    server_interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)
    client_interceptors: list[grpc.aio.ClientInterceptor] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.exporter)


_state: Telemetry | None = None


def exporter_kind(env: Mapping[str, str] | None = None) -> str:
    """Which exporter the OTEL_* variables ask for: "otlp", "console" or "" (none)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ""
    wanted = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if "none" in wanted:
        return ""
    if "console" in wanted:
        return "console"
    if "otlp" in wanted:
        return "otlp"
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return "otlp"
    return ""


def setup_telemetry(
    service_name: str, settings: Settings | None = None, env: Mapping[str, str] | None = None
) -> Telemetry:
    """Sets up tracing for this process (once; a second call returns the first set-up)."""
    global _state
    if _state is not None:
        return _state
    kind = exporter_kind(env)
    state = Telemetry(service_name, kind)
    if kind:
        _start_tracing(state)
        log.info("tracing on: %s exporter, service %s", kind, service_name)
    _state = state
    return state


def _start_tracing(state: Telemetry) -> None:
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: state.service_name}))
    exporter: SpanExporter
    if state.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    state.provider = provider

    storage = ChildSpansOnly(provider)
    RedisInstrumentor().instrument(tracer_provider=storage)
    # the asyncpg and gRPC instrumentations leave these unannotated
    AsyncPGInstrumentor().instrument(tracer_provider=storage)  # type: ignore[no-untyped-call]
    state.server_interceptors = [aio_server_interceptor(tracer_provider=provider, filter_=_not_health_server)]  # type: ignore[no-untyped-call]
    state.client_interceptors = list(
        aio_client_interceptors(  # type: ignore[no-untyped-call]
            tracer_provider=provider, filter_=_not_health_client
        )
    )


def _not_health_server(details: grpc.HandlerCallDetails) -> bool:
    return not str(details.method).startswith(_HEALTH_PREFIX)


def _not_health_client(details: grpc.aio.ClientCallDetails) -> bool:
    method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
    return not method.startswith(_HEALTH_PREFIX)


def shutdown_telemetry() -> None:
    """Sends the spans still buffered and stops the exporter (safe to call when tracing is off)."""
    state = _state
    if state is None or state.provider is None:
        return
    try:
        state.provider.shutdown()
    except Exception as exc:  # the collector being away must not turn a clean exit into a crash
        log.warning("could not flush spans at exit: %s", exc)


# --- what the rest of Sieve asks -------------------------------------------------------------------
def enabled() -> bool:
    """True when this process exports spans (task spans are only made then)."""
    return _state is not None and _state.enabled


def server_interceptors() -> Sequence[grpc.aio.ServerInterceptor]:
    return _state.server_interceptors if _state is not None else ()


def client_interceptors() -> Sequence[grpc.aio.ClientInterceptor]:
    return _state.client_interceptors if _state is not None else ()


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def traceparent_of(span: trace.Span) -> str:
    """The W3C traceparent of `span` ("" when it is not a real, recorded span)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def current_traceparent() -> str:
    """The W3C traceparent of the current span ("" when none is being recorded)."""
    span = trace.get_current_span()
    return traceparent_of(span) if span.is_recording() else ""


def context_from(traceparent: str) -> otel_context.Context | None:
    """A parent context from a stored traceparent (None when empty or unreadable: the span is a root)."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def detached_context() -> contextvars.Context | None:
    """For `asyncio.create_task(..., context=)`: a copy of the current context without its span, for a
    task that outlives the operation that starts it (a Pull stream's reader), so that what it does is not
    filed under that operation. None (the default: a plain copy) when tracing is off."""
    if not enabled():
        return None
    ctx = contextvars.copy_context()
    ctx.run(otel_context.attach, otel_context.Context())
    return ctx


# --- Redis and PostgreSQL: spans only inside a traced operation -----------------------------------------
def _has_parent(context: otel_context.Context | None) -> bool:
    return trace.get_current_span(context).get_span_context().is_valid


class _ChildOnlyTracer(trace.Tracer):
    """Starts spans only under a valid parent; without one, hands out the non-recording invalid span."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def start_span(
        self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any
    ) -> trace.Span:
        if not _has_parent(context):
            return trace.INVALID_SPAN
        return self._tracer.start_span(name, context, *args, **kwargs)

    # The API declares its private _AgnosticContextManager (contextlib's manager that can also decorate a
    # coroutine function) as the result; this is contextlib's own, used as a `with` block only.
    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Iterator[trace.Span]:
        if not _has_parent(context):
            yield trace.INVALID_SPAN
            return
        with self._tracer.start_as_current_span(name, context, *args, **kwargs) as span:
            yield span


class ChildSpansOnly(trace.TracerProvider):
    """A TracerProvider for client libraries whose calls matter only as part of something traced."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._provider = provider

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _ChildOnlyTracer(self._provider.get_tracer(*args, **kwargs))


__all__ = [
    "ChildSpansOnly",
    "Telemetry",
    "context_from",
    "current_traceparent",
    "detached_context",
    "enabled",
    "exporter_kind",
    "setup_telemetry",
    "shutdown_telemetry",
    "traceparent_of",
    "tracer",
]

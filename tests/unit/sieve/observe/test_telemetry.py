"""Telemetry set-up pieces that need no service: which exporter the OTEL_* variables pick, spans of storage
calls only under a parent, metric helpers, and the deploy files naming only metrics that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sieve.observe import metrics, telemetry

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, ""),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, ""),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, ""),
    ],
)
def test_the_otel_variables_choose_the_exporter_and_none_means_off(env: dict[str, str], kind: str) -> None:
    assert telemetry.exporter_kind(env) == kind


def test_storage_spans_are_made_only_under_a_parent() -> None:
    # Given a provider recording into memory, and the storage libraries' view of it
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    storage = telemetry.ChildSpansOnly(provider).get_tracer("redis")
    # When a storage call happens outside any span, and another inside one
    with storage.start_as_current_span("GET") as orphan:
        assert not orphan.is_recording()
    with provider.get_tracer("sieve").start_as_current_span("Submit"), storage.start_as_current_span("EVALSHA"):
        pass
    assert storage.start_span("HGET") is trace.INVALID_SPAN
    # Then only the one inside is recorded, as a child
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"Submit", "EVALSHA"}
    assert spans["EVALSHA"].parent is not None
    assert spans["EVALSHA"].parent.span_id == spans["Submit"].context.span_id


def test_a_traceparent_round_trips_into_a_parent_context() -> None:
    provider = TracerProvider()
    span = provider.get_tracer("sieve").start_span("Submit")
    traceparent = telemetry.traceparent_of(span)
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", traceparent)
    parent = trace.get_current_span(telemetry.context_from(traceparent)).get_span_context()
    assert (parent.trace_id, parent.span_id) == (span.get_span_context().trace_id, span.get_span_context().span_id)
    assert telemetry.context_from("") is None
    assert telemetry.context_from("garbage") is None
    assert telemetry.traceparent_of(trace.INVALID_SPAN) == ""


def test_scrape_time_specs_render_as_prometheus_text() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    class Fixed(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            yield metrics.DISPATCHED.family(7)
            yield metrics.PENDING.family([(("HIGH", "TEXT"), 2), (("NORMAL", "OCR_IMAGE"), 1)])

    registry = CollectorRegistry()
    registry.register(Fixed())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    assert samples[("sieve_dispatched_tasks_total", ())] == 7
    assert samples[("sieve_pending_tasks", (("priority", "HIGH"), ("type", "TEXT")))] == 2


@pytest.mark.parametrize(
    ("address", "parsed"),
    [("127.0.0.1:9101", ("127.0.0.1", 9101)), ("[::]:9104", ("::", 9104)), (":0", ("0.0.0.0", 0))],
)
def test_metrics_addresses_parse(address: str, parsed: tuple[str, int]) -> None:
    assert metrics.parse_address(address) == parsed


def _known_metric_names() -> set[str]:
    names: set[str] = set()
    for collector in list(metrics.REGISTRY._collector_to_names):
        names |= set(metrics.REGISTRY._collector_to_names[collector])
    for spec in vars(metrics).values():
        if isinstance(spec, metrics.Spec):
            names.add(spec.name + ("_total" if spec.kind == "counter" else ""))
    return names


def test_the_grafana_dashboard_uses_only_metrics_sieve_serves() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/sieve-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\bsieve_[a-z_]+", e)}
    assert used and used <= _known_metric_names(), used - _known_metric_names()
    titles = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert titles == {"Queues", "Fairness", "Workers", "Latency"}


def test_prometheus_scrapes_every_service_on_its_compose_metrics_port() -> None:
    config = (ROOT / "deploy/prometheus.yml").read_text()
    compose = (ROOT / "deploy/compose.yaml").read_text()
    for service, port in (("intake", 9101), ("scheduler", 9102), ("registry", 9103)):
        assert f'"{service}:{port}"' in config
        assert f'SIEVE_{service.upper()}_METRICS_ADDR: "[::]:{port}"' in compose
    assert "port: 9104" in config and 'SIEVE_WORKER_METRICS_ADDR: "[::]:9104"' in compose
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in compose and "jaegertracing/all-in-one" in compose

"""The workers scale on the watermark: the KEDA ScaledObjects of deploy/k8s/worker-scaledobjects.yaml target the
worker Deployments, replace the CPU-only HPA, and query only metrics the scheduler exports (by the names defined in
sieve/observe/metrics.py; tests/e2e/test_scaling_metrics.py checks them against a running scheduler's /metrics)."""

from __future__ import annotations

import ast
from pathlib import Path

from sieve.observe import metrics as m
from tests.support.scaling import manifests, prometheus_queries, scaled_objects, selectors

ROOT = Path(__file__).resolve().parents[3]


def scheduler_metric_names() -> set[str]:
    """The names of the metrics `SchedulerCollector` yields (scheduler_svc/metrics.py: `m.NAME.family(...)`)."""
    tree = ast.parse((ROOT / "scheduler_svc" / "metrics.py").read_text())
    specs = {
        node.func.value.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "family"
        and isinstance(node.func.value, ast.Attribute)
    }
    return {getattr(m, spec).name for spec in specs}


def test_each_worker_deployment_has_a_scaled_object_and_no_other_autoscaler() -> None:
    docs = manifests()
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    targets = {o["spec"]["scaleTargetRef"]["name"]: o for o in scaled_objects()}
    assert set(targets) == {"sieve-worker-cpu", "sieve-worker-gpu"} and set(targets) <= deployments
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]  # KEDA owns the HPA of each
    (kustomization,) = [d for d in docs if d["kind"] == "Kustomization"]
    assert "worker-scaledobjects.yaml" in kustomization["resources"]
    for name, obj in targets.items():
        spec = obj["spec"]
        assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"], name
        kinds = [t["type"] for t in spec["triggers"]]
        assert kinds.count("prometheus") >= 2, name
        for t in spec["triggers"]:
            if t["type"] == "prometheus":
                assert t["metricType"] in ("AverageValue", "Value")
                assert float(t["metadata"]["threshold"]) > 0
                assert t["metadata"]["serverAddress"].startswith("http")


def test_the_triggers_query_the_pending_and_oldest_wait_metrics_the_scheduler_exports() -> None:
    exported = scheduler_metric_names()
    assert {"sieve_pending_tasks", "sieve_oldest_wait_seconds", "sieve_queued_tasks"} <= exported
    read = set()
    for obj, trigger, query in prometheus_queries():
        found = selectors(query)
        assert found, f"{obj}/{trigger}: no sieve metric in {query!r}"
        for s in found:
            assert s.metric in exported, f"{obj}/{trigger}: {s.metric} is not a metric the scheduler exports"
            read.add(s.metric)
    assert {"sieve_pending_tasks", "sieve_oldest_wait_seconds"} <= read
    # the GPU pool scales on images, the CPU pool (TEXT only) on texts
    by_object = {(o, t): q for o, t, q in prometheus_queries()}
    assert 'type="OCR_IMAGE"' in by_object[("sieve-worker-gpu", "ocr-backlog")]
    assert 'type="TEXT"' in by_object[("sieve-worker-cpu", "text-backlog")]


def test_selectors_are_read_from_promql() -> None:
    (s,) = selectors('max(sum by (instance) (sieve_pending_tasks{type="TEXT", priority="HIGH"}))')
    assert s.metric == "sieve_pending_tasks" and s.labels == (("type", "TEXT"), ("priority", "HIGH"))
    assert [x.metric for x in selectors("max(sieve_oldest_wait_seconds) / max(sieve_queued_tasks)")] == [
        "sieve_oldest_wait_seconds",
        "sieve_queued_tasks",
    ]

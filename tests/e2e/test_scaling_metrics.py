"""The KEDA triggers of deploy/k8s/worker-scaledobjects.yaml read metrics a real scheduler exports: with texts and
an image waiting (no worker running), a running scheduler's /metrics has every metric and label value the
triggers' queries select, and the backlog ones read what is waiting."""

from __future__ import annotations

import pytest

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.e2e.test_metrics import scrape, tiny_png
from tests.support.cluster import Cluster
from tests.support.scaling import prometheus_queries, selectors

pytestmark = pytest.mark.e2e


async def test_every_metric_the_scaled_objects_query_is_exported_by_a_running_scheduler(
    cluster_env: Cluster, pg: object, redis: object
) -> None:
    c = cluster_env
    await c.start_in_order()
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        texts = [
            intake_pb2.TaskSpec(device_id="0C:00:00:00:5C:01", type=types_pb2.TASK_TYPE_TEXT, text=f"t {i}")
            for i in range(3)
        ]
        image = intake_pb2.TaskSpec(device_id="0C:00:00:00:5C:02", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=tiny_png())
        reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=[*texts, image]))
        assert all(item.code == 0 for item in reply.items)
    samples = scrape(c.metrics["scheduler"])
    names = {name for name, _ in samples}
    for obj, trigger, query in prometheus_queries():
        for s in selectors(query):
            assert s.metric in names, f"{obj}/{trigger}: {s.metric} not in the scheduler's /metrics"
            matching = [v for (n, labels), v in samples.items() if n == s.metric and set(s.labels) <= labels]
            assert matching, f"{obj}/{trigger}: no {s.metric} sample with {dict(s.labels)}"
    pending = {dict(labels)["type"]: 0.0 for (n, labels) in samples if n == "sieve_pending_tasks"}
    for (n, labels), v in samples.items():
        if n == "sieve_pending_tasks":
            pending[dict(labels)["type"]] += v
    assert pending == {"TEXT": 3, "OCR_IMAGE": 1}

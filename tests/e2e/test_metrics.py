"""End to end: every service's /metrics parses with prometheus-client's parser, and its counters move as
expected after a known workload.

The workload, on the four services running as processes (per-device limit 3): three texts (one with an
idempotency key, submitted twice), one HIGH-priority OCR image (no worker takes OCR: it waits out a delay on its
own, the task stays PENDING), one Submit with a bad MAC, and a SubmitBatch of four texts for one device (all
four over its limit).
"""

from __future__ import annotations

import asyncio
import struct
import time
import urllib.request
import zlib
from collections.abc import Mapping

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import Cluster

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str) -> Samples:
    """Every sample of http://address/metrics, parsed by prometheus-client: {(name, labels): value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def has(samples: Samples, name: str) -> bool:
    return any(n == name for n, _ in samples)


async def scrape_all(cluster: Cluster) -> Mapping[str, Samples]:
    names = list(cluster.metrics)
    results = await asyncio.gather(*(asyncio.to_thread(scrape, cluster.metrics[n]) for n in names))
    return dict(zip(names, results, strict=True))


async def scrape_once_connected(cluster: Cluster) -> Mapping[str, Samples]:
    """Every service's metrics once both workers say their stream is open (or after 10 s)."""
    scraped = await scrape_all(cluster)
    for _ in range(100):
        if all(value(scraped[w], "sieve_worker_connected") == 1 for w in ("worker-1", "worker-2")):
            break
        await asyncio.sleep(0.1)
        scraped = await scrape_all(cluster)
    return scraped


def workers_total(scraped: Mapping[str, Samples], name: str, **labels: str) -> float:
    return sum(value(s, name, **labels) for n, s in scraped.items() if n.startswith("worker-"))


def tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * 8 for _ in range(8))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def cluster_env(cluster_env: Cluster) -> Cluster:
    cluster_env.env.update({"SIEVE_MAX_PER_DEVICE_PENDING": "3"})
    return cluster_env


def text(device: str, body: str, **kw: object) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=body, **kw)


async def test_every_services_metrics_parse_and_move_with_a_known_workload(cluster: Cluster) -> None:
    # Given every service's metrics before the workload, both workers saying their stream is open before any
    # work reached them
    before = await scrape_once_connected(cluster)
    assert set(before) == {"intake", "scheduler", "registry", "worker-1", "worker-2"}
    assert [value(before[w], "sieve_worker_connected") for w in ("worker-1", "worker-2")] == [1, 1]
    for samples in before.values():
        assert has(samples, "process_cpu_seconds_total")

    # When the workload runs
    async with rpc.channel(cluster.settings.intake_addr, cluster.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        ids = []
        for i, spec in enumerate(
            [
                text("10:00:00:00:00:01", "加 微 信 免费领取", idempotency_key="once"),
                text("10:00:00:00:00:01", "加 微 信 免费领取", idempotency_key="once"),
                text("10:00:00:00:00:02", "hello world"),
                text("10:00:00:00:00:03", "赌.博 网站"),
            ]
        ):
            reply = await stub.Submit(intake_pb2.SubmitRequest(task=spec))
            assert reply.deduplicated == (i == 1)
            ids.append(reply.task.task_id)
        await stub.Submit(
            intake_pb2.SubmitRequest(
                task=intake_pb2.TaskSpec(
                    device_id="10:00:00:00:00:04",
                    type=types_pb2.TASK_TYPE_OCR_IMAGE,
                    image=tiny_png(),
                    priority=types_pb2.PRIORITY_HIGH,
                )
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.Submit(intake_pb2.SubmitRequest(task=text("not-a-mac", "x")))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        batch = await stub.SubmitBatch(
            intake_pb2.SubmitBatchRequest(tasks=[text("10:00:00:00:00:05", f"t{i}") for i in range(4)])
        )
        assert [item.code for item in batch.items] == [grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]] * 4
        deadline = time.monotonic() + 20
        for task_id in set(ids):
            while (
                await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))
            ).task.status != types_pb2.TASK_STATUS_SUCCEEDED:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
    for _ in range(100):  # the OCR task waits out a delay (no worker takes OCR), the texts' acks are in
        after = await scrape_all(cluster)
        if (
            value(after["scheduler"], "sieve_delayed_tasks") == 1
            and value(after["scheduler"], "sieve_leased_tasks") == 0
        ):
            break
        await asyncio.sleep(0.1)

    # Then the intake counted 4 accepted (3 texts, 1 image), 1 deduplicated, and the rejections by reason
    def delta(service: str, name: str, **labels: str) -> float:
        return value(after[service], name, **labels) - value(before[service], name, **labels)

    assert delta("intake", "sieve_submitted_tasks_total", outcome="accepted") == 4
    assert delta("intake", "sieve_submitted_tasks_total", outcome="deduplicated") == 1
    assert delta("intake", "sieve_submit_rejections_total", reason="device_limit") == 4
    assert delta("intake", "sieve_submit_rejections_total", reason="invalid_argument") == 1
    submit = "/sieve.v1.IntakeService/Submit"
    assert delta("intake", "sieve_grpc_server_handled_total", grpc_method=submit, grpc_code="OK") == 5
    assert delta("intake", "sieve_grpc_server_handled_total", grpc_method=submit, grpc_code="INVALID_ARGUMENT") == 1
    assert delta("intake", "sieve_grpc_server_handling_seconds_count", grpc_method=submit) == 6
    # each call's steps were timed: the six Submits and the SubmitBatch validated, the accepted ones recorded and
    # enqueued
    assert delta("intake", "sieve_submit_step_seconds_count", step="validate") == 7
    assert delta("intake", "sieve_submit_step_seconds_count", step="record") >= 4
    assert delta("intake", "sieve_submit_step_seconds_count", step="enqueue") >= 4
    # the scheduler dispatched the 3 texts, holds the image as PENDING HIGH OCR_IMAGE, waiting on its own
    assert delta("scheduler", "sieve_dispatched_tasks_total") == 3
    assert delta("scheduler", "sieve_dispatch_batch_size_sum") == 3
    assert delta("scheduler", "sieve_queue_wait_seconds_count", priority="NORMAL") == 3
    assert value(after["scheduler"], "sieve_pending_tasks", priority="HIGH", type="OCR_IMAGE") == 1
    assert value(after["scheduler"], "sieve_pending_tasks", type="TEXT") == 0
    assert value(after["scheduler"], "sieve_delayed_tasks") == 1
    assert value(after["scheduler"], "sieve_backoff_devices") == 0
    assert value(after["scheduler"], "sieve_scheduler_connected_workers") == 2
    assert value(after["scheduler"], "sieve_leased_tasks") == 0
    assert delta("scheduler", "sieve_fencing_refusals_total") == 0
    for name in (
        "sieve_lease_reclaims_total",
        "sieve_dead_lettered_tasks_total",
        "sieve_active_devices",
        "sieve_overloaded_devices",
        "sieve_dead_letters",
        "sieve_oldest_wait_seconds",
    ):
        assert has(after["scheduler"], name), name
    # the workers ran, stored and acked the 3 texts, and timed them
    assert (
        workers_total(after, "sieve_task_results_total", type="TEXT", outcome="succeeded")
        - workers_total(before, "sieve_task_results_total", type="TEXT", outcome="succeeded")
        == 3
    )
    assert (
        workers_total(after, "sieve_worker_acked_tasks_total") - workers_total(before, "sieve_worker_acked_tasks_total")
        == 3
    )
    for name in ("sieve_submit_to_start_seconds_count", "sieve_start_to_done_seconds_count"):
        assert workers_total(after, name, type="TEXT") - workers_total(before, name, type="TEXT") == 3
    for worker in ("worker-1", "worker-2"):
        samples = after[worker]
        assert value(samples, "sieve_worker_slots") == 200
        assert value(samples, "sieve_worker_in_flight") == 0
        assert value(samples, "sieve_worker_connected") == 1
        assert 0 <= value(samples, "sieve_worker_utilisation_ratio") <= 1
        assert {ls for n, ls in samples if n == "sieve_worker_resource_percent"} == {
            frozenset({("resource", r)})
            for r in ("cpu", "cpu_own", "cpu_platform", "memory", "gpu_memory", "gpu_memory_own", "gpu_util")
        }
        assert has(samples, "sieve_worker_credits") and has(samples, "sieve_worker_over_watermark")
        assert {ls for n, ls in samples if n == "sieve_worker_held_back_seconds_total"} == {
            frozenset({("resource", r)}) for r in ("cpu", "memory", "gpu_memory")
        }
        assert has(samples, "sieve_worker_pressure_put_back_tasks_total")
    # and the registry lists both workers as TEXT workers
    assert value(after["registry"], "sieve_registry_workers", task_type="TEXT") == 2
    assert has(after["registry"], "sieve_registry_resource_percent")

"""End to end: one task's trace, exported over OTLP by the four services running as processes.

An OTLP trace receiver (the `opentelemetry.proto.collector.trace.v1.TraceService` Export RPC on a grpc.aio
server on loopback) runs inside the test; every service gets OTEL_EXPORTER_OTLP_ENDPOINT pointing at it and
a short batch delay. One submitted task must show up as one trace: Submit (intake) -> enqueue -> claim ->
assign (scheduler) -> run -> match, result write, ack (worker), with Redis and PostgreSQL spans under the
Submit, and the task's attributes on the scheduler's and the worker's spans. Each task of a SubmitBatch
is a trace of its own, linked to the batch. The registry's own spans (Register, Heartbeat) are in their
own traces; they must arrive too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import Cluster

pytestmark = pytest.mark.e2e

SERVER = trace_pb2.Span.SPAN_KIND_SERVER


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    #: (trace id, span id) of each linked span
    links: tuple[tuple[str, str], ...] = ()


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass
class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Collects every exported span."""

    spans: list[ReceivedSpan] = field(default_factory=list)

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            str(resource.get("service.name")),
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in s.attributes},
                            tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_task(self, task_id: str) -> dict[str, ReceivedSpan]:
        return {s.name: s for s in self.spans if s.attributes.get("task.id") == task_id}


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    servicer = Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, port
    await server.stop(0)


@pytest.fixture
def cluster_env(cluster_env: Cluster, receiver: tuple[Receiver, int]) -> Cluster:
    """The conftest's cluster, with every service exporting its spans to the receiver."""
    cluster_env.env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver[1]}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "SIEVE_HEARTBEAT_INTERVAL_S": "1",
        }
    )
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER"):
        cluster_env.env.pop(name, None)
    return cluster_env


async def test_one_task_is_one_trace_from_submit_to_the_workers_ack(
    cluster: Cluster, receiver: tuple[Receiver, int]
) -> None:
    spans = receiver[0]
    # Given the four services exporting to the receiver
    # When one text is submitted and done
    async with rpc.channel(cluster.settings.intake_addr, cluster.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        reply = await stub.Submit(
            intake_pb2.SubmitRequest(
                task=intake_pb2.TaskSpec(
                    device_id="AA-BB-CC-DD-EE-07", type=types_pb2.TASK_TYPE_TEXT, text="加 微 信 免费领取"
                )
            )
        )
        task_id = reply.task.task_id
        for _ in range(200):
            task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
            if task.status == types_pb2.TASK_STATUS_SUCCEEDED:
                break
            await asyncio.sleep(0.05)
        assert task.status == types_pb2.TASK_STATUS_SUCCEEDED

    # Then its spans arrive (the batch delay is 100 ms)
    for _ in range(100):
        mine = spans.of_task(task_id)
        if (
            {"enqueue", "claim", "assign", "run"} <= set(mine)
            and {"match", "result write", "ack"} <= {s.name for s in spans.spans if s.parent_id == mine["run"].span_id}
            and any(s.service == "sieve-registry" for s in spans.spans)
        ):
            break
        await asyncio.sleep(0.1)
    mine = spans.of_task(task_id)
    assert {"enqueue", "claim", "assign", "run"} <= set(mine), sorted(mine)
    trace_id = mine["claim"].trace_id
    in_trace = [s for s in spans.spans if s.trace_id == trace_id]
    submit = next(s for s in in_trace if s.name.endswith("IntakeService/Submit") and s.kind == SERVER)
    children = {s.name: s for s in in_trace if s.parent_id == mine["run"].span_id}

    # all in one trace, from intake, scheduler and worker
    assert {s.service for s in in_trace} >= {"sieve-intake", "sieve-scheduler", "sieve-worker"}
    assert submit.service == "sieve-intake" and submit.parent_id == ""
    assert {mine[n].service for n in ("claim", "assign")} == {"sieve-scheduler"}
    assert mine["run"].service == "sieve-worker"
    # Submit -> enqueue; Submit -> claim -> assign -> run -> match, result write, ack
    assert mine["enqueue"].parent_id == submit.span_id
    assert mine["claim"].parent_id == submit.span_id
    assert mine["assign"].parent_id == mine["claim"].span_id
    assert mine["run"].parent_id == mine["assign"].span_id
    assert {"match", "result write", "ack"} <= set(children), sorted(children)
    assert children["result write"].attributes["result.stored"] is True
    # Redis and PostgreSQL spans under the Submit
    systems = {s.attributes.get("db.system") or s.attributes.get("db.system.name") for s in in_trace}
    assert {"redis", "postgresql"} <= systems, systems
    # the task's attributes
    for name in ("claim", "assign", "run"):
        attrs = mine[name].attributes
        assert attrs["device"] == "AA:BB:CC:DD:EE:07"
        assert attrs["task.type"] == "TEXT"
        assert attrs["attempt"] == 1
    worker = mine["run"].attributes["worker.id"]
    assert worker in ("worker-1", "worker-2")
    assert mine["assign"].attributes["worker.id"] == worker
    # and the registry sent spans of its own
    assert any(s.service == "sieve-registry" and s.kind == SERVER for s in spans.spans)


async def test_each_task_of_a_batch_is_a_trace_of_its_own_linked_to_the_batch(
    cluster: Cluster, receiver: tuple[Receiver, int]
) -> None:
    spans = receiver[0]
    # Given the four services exporting to the receiver
    # When three texts of three devices are submitted in one SubmitBatch and done
    async with rpc.channel(cluster.settings.intake_addr, cluster.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        reply = await stub.SubmitBatch(
            intake_pb2.SubmitBatchRequest(
                tasks=[
                    intake_pb2.TaskSpec(
                        device_id=f"AA-BB-CC-DD-EE-1{i}", type=types_pb2.TASK_TYPE_TEXT, text=f"text {i}"
                    )
                    for i in range(3)
                ]
            )
        )
        task_ids = [item.task.task_id for item in reply.items]
        for _ in range(200):
            tasks = [(await stub.GetTask(intake_pb2.GetTaskRequest(task_id=t))).task for t in task_ids]
            if all(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in tasks):
                break
            await asyncio.sleep(0.05)
        assert all(t.status == types_pb2.TASK_STATUS_SUCCEEDED for t in tasks)

    # Then each task's spans arrive
    wanted = {"submit task", "claim", "assign", "run"}

    def batch_spans() -> list[Any]:
        return [s for s in spans.spans if s.name.endswith("IntakeService/SubmitBatch") and s.kind == SERVER]

    for _ in range(100):  # the batch's own span is exported on its own schedule too
        if all(wanted <= set(spans.of_task(t)) for t in task_ids) and batch_spans():
            break
        await asyncio.sleep(0.1)
    batch = batch_spans()[0]
    traces = set()
    for task_id in task_ids:
        mine = spans.of_task(task_id)
        assert wanted <= set(mine), sorted(mine)
        root = mine["submit task"]
        # one trace per task: its root span, linked to the batch, parent of the scheduler's claim
        assert root.service == "sieve-intake" and root.parent_id == ""
        assert root.links == ((batch.trace_id, batch.span_id),)
        assert mine["claim"].trace_id == mine["run"].trace_id == root.trace_id
        assert mine["claim"].parent_id == root.span_id
        traces.add(root.trace_id)
    assert len(traces) == 3 and batch.trace_id not in traces

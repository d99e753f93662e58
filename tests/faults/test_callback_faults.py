"""Completion callbacks under kill -9: 60 tasks with a callback_url go through real service processes into a real
HTTP receiver on loopback that answers the first three attempts of every delivery 503. Between attempts the
scheduler (which sends them) is killed twice and the intake once, each started again. Every task's delivery is
accepted, every attempt is signed with the caller's secret, and GetTask shows each delivery DELIVERED after at least
four attempts: the outbox in PostgreSQL loses nothing to a restart. Delivery is at least once (README): a scheduler
killed after the receiver answered 200 and before it recorded DELIVERED sends that delivery again, under the same
X-Sieve-Delivery id; so a second acceptance is allowed only for a delivery first accepted just before a scheduler
kill, and always under the id of the first."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.faults.harness import FAST_ENV, kill9
from tests.support.cluster import Cluster
from tests.support.receiver import callback_receiver
from tests.support.tasks import text_spec

pytestmark = pytest.mark.timeout(240)

TASKS = 60
SECRET = "fault-suite-secret"
#: the longest a notifier may take from the receiver's 200 to DELIVERED committed (its POST limit, plus margin)
RECORD_WINDOW_S = 3.0


async def test_callbacks_survive_scheduler_and_intake_kills_between_attempts(
    fault_cluster: Cluster, pg: asyncpg.Pool
) -> None:
    c = fault_cluster
    async with callback_receiver(SECRET.encode(), fail_first=3) as receiver:
        c.env.update(FAST_ENV)
        c.env.update(
            SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS="127.0.0.0/8",
            SIEVE_CALLBACK_SECRETS=f"client={SECRET}",
            SIEVE_CALLBACK_BACKOFF_BASE_S="0.4",
            SIEVE_CALLBACK_BACKOFF_MAX_S="1.5",
            # a killed replica's claims come due again after the POST limit plus the margin: keep it short
            SIEVE_CALLBACK_TIMEOUT_S="2",
        )
        await c.start_all(workers=1)
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            specs = [
                text_spec(
                    f"AA:BB:CC:40:00:{n % 6:02X}", f"task {n}", callback_url=receiver.url, idempotency_key=f"k{n}"
                )
                for n in range(TASKS)
            ]
            reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
            ids = [item.task.task_id for item in reply.items]
            assert all(item.code == 0 for item in reply.items)

        # kill while deliveries are between attempts: after the first failures, then again later
        scheduler_kills: list[float] = []
        for name, new_name, after in (
            ("scheduler", "scheduler-2", TASKS),
            ("intake", "intake-2", 2 * TASKS),
            ("scheduler-2", "scheduler-3", 3 * TASKS),
        ):
            deadline = time.monotonic() + 60
            while len(receiver.received) < after:
                assert time.monotonic() < deadline, f"{len(receiver.received)} attempts seen:\n{c.log_of(name)}"
                await asyncio.sleep(0.02)
            if name.startswith("scheduler"):
                scheduler_kills.append(time.time())
            kill9(c, name)
            await asyncio.sleep(0.3)
            module = "scheduler_svc" if name.startswith("scheduler") else "intake_svc"
            c.start(new_name, module)
            address = c.settings.scheduler_addr if module == "scheduler_svc" else c.settings.intake_addr
            await c.wait_healthy(address, new_name)

        deadline = time.monotonic() + 90
        while len(receiver.accepted_per_task()) < TASKS:
            assert time.monotonic() < deadline, f"{len(receiver.accepted_per_task())} of {TASKS} accepted"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # nothing further arrives for a delivered task

        accepted = receiver.accepted_per_task()
        assert set(accepted) == set(ids)
        repeated = {t: n for t, n in accepted.items() if n > 1}
        for task_id in repeated:
            accepts = [r for r in receiver.accepted() if r.payload["task_id"] == task_id]
            assert len({r.delivery_id for r in accepts}) == 1, accepts  # a receiver deduplicating on it sees one
            first = accepts[0].at
            killed_meanwhile = [k for k in scheduler_kills if first <= k <= first + RECORD_WINDOW_S]
            assert killed_meanwhile, (task_id, first, scheduler_kills)
            assert len(accepts) <= 1 + len(scheduler_kills)
        assert receiver.all_signed()
        async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            for task_id in ids:
                task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
                (delivery,) = task.deliveries
                assert delivery.state == types_pb2.CallbackDelivery.STATE_DELIVERED, delivery
                assert delivery.attempts >= 4 and delivery.last_http_status == 200
        print(
            f"{TASKS} callbacks, {len(receiver.received)} attempts, scheduler killed twice and the intake once; "
            f"accepted again after a kill mid-delivery: {len(repeated)}"
        )

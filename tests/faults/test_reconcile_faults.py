"""Reconciliation under faults: every service a process (authentication on), a Redis server of the test's own, at
least 2 000 tasks with idempotency keys per case, and a fault that hits work in flight; afterwards every accepted
task is SUCCEEDED exactly once and the counters are exact. What the fault hit is asserted, not only the end:

(a) the queue lists and meta of three busy devices deleted behind Sieve's back: reconciliation re-queues exactly
    the tasks the deletion took (read atomically with it) and recounts the pending counter;
(b) a registered worker that acks every assignment without storing a result: each such ack is refused and the
    task put back; reconciliation, running through all that churn, re-queues nothing (no false positive);
(c) the intake killed with SIGKILL five times under the load of 20 clients that retry with the same idempotency
    keys, its Redis link slowed (20 ms a request) so that kills land between a task's row and its enqueue: the
    retries are answered `deduplicated` for tasks no queue held, and reconciliation queues them.

The table of each case (accepted, succeeded, duplicates executed as counted from fencing refusals, tasks
re-queued by reconciliation, recovery time) is printed at the end of the run and the usual audit rows join the
suite's table.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.redis.keys import PRIORITIES
from sieve.redis.queue_store import QueueStore
from sieve.v1 import intake_pb2, intake_pb2_grpc, registry_pb2, registry_pb2_grpc, types_pb2
from tests.faults.harness import (
    AUDITS,
    FAST_ENV,
    TASKS,
    Audit,
    Load,
    audit,
    count_refusals,
    kill9,
    start_services,
    start_worker,
    wait_all_final,
    when_results_reach,
)
from tests.integration.pull_client import ScriptedWorker
from tests.support.cluster import Cluster
from tests.support.counters import counters

pytestmark = pytest.mark.timeout(300)

REQUEUED = re.compile(r"reconciliation re-queued (\d+) tasks")
UNPROVEN = re.compile(r"acked (\d+) tasks without a stored result")


@dataclass
class FaultRow:
    case: str
    accepted: int
    succeeded: int
    duplicates_executed: int
    reconciled: int
    hit: str
    recovery_s: float

    HEADER = (
        f"{'case':<38} {'accepted':>8} {'succeeded':>9} {'dup. executed':>13} {'reconciled':>10} "
        f"{'recovery s':>10}  fault hit"
    )

    def row(self) -> str:
        return (
            f"{self.case:<38} {self.accepted:>8} {self.succeeded:>9} {self.duplicates_executed:>13} "
            f"{self.reconciled:>10} {self.recovery_s:>10.1f}  {self.hit}"
        )


ROWS: list[FaultRow] = []


class _Table:
    """Prints ROWS with the terminal summary (a plugin registered by the module's fixture)."""

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if ROWS:
            terminalreporter.section("reconciliation under faults")
            terminalreporter.write_line(FaultRow.HEADER)
            for r in ROWS:
                terminalreporter.write_line(r.row())


@pytest.fixture(scope="module", autouse=True)
def fault_table(request: pytest.FixtureRequest) -> None:
    if not request.config.pluginmanager.has_plugin("reconcile-fault-table"):
        request.config.pluginmanager.register(_Table(), "reconcile-fault-table")


def log_count(logs: Path, pattern: re.Pattern[str], prefix: str = "scheduler") -> int:
    return sum(int(n) for p in logs.glob(f"{prefix}*.log") for n in pattern.findall(p.read_text(errors="replace")))


def assert_clean(a: Audit, accepted: int) -> None:
    AUDITS.append(a)
    assert a.accepted == accepted, a
    assert a.succeeded == a.accepted == a.results, a
    assert (a.duplicates, a.lost, a.extra_rows, a.pending_left) == (0, 0, 0, 0), a


async def counters_exact(redis: Redis, queues: QueueStore) -> None:
    """Nothing is left anywhere: no queued entry, no lease, no delayed task, every counter at zero."""
    now = await counters(redis, queues.keys)
    assert [k for k, n in now.queue_lengths.items() if n] == []
    assert await redis.zcard(queues.keys.leases) == 0 and await redis.hlen(queues.keys.lease_data) == 0
    assert await redis.zcard(queues.keys.delayed) == 0
    assert await queues.pending() == 0
    assert {k: n for k, n in now.backlogs.items() if n} == {}


# --- (a) a device's keys deleted behind Sieve's back -----------------------------------------------------


async def test_deleted_queue_lists_and_meta_of_busy_devices_are_requeued_and_all_finish(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    c.env["SIEVE_WORKER_CONCURRENCY"] = "4"  # the workers drain slower than the load comes: queues have work
    await start_services(c, workers=2)
    queues = QueueStore(own_redis, c.settings)
    lost: list[str] = []
    fault_at = 0.0

    async def fault() -> None:
        nonlocal fault_at
        await when_results_reach(pg, 200)
        deadline = time.monotonic() + 60
        while True:  # until the three busiest devices hold at least 20 queued tasks between them
            assert time.monotonic() < deadline, "the queues never held work"
            devices = sorted(await own_redis.smembers(queues.keys.devices))
            async with own_redis.pipeline(transaction=False) as pipe:
                for mac in devices:
                    pipe.hget(queues.keys.meta(mac), "backlog")
                backlogs = [int(b or 0) for b in await pipe.execute()]
            ranked = sorted(zip(backlogs, devices, strict=True), reverse=True)[:3]
            if sum(n for n, _ in ranked) >= 20:
                break
            await asyncio.sleep(0.01)
        # the deletion and the read of what it deletes in one transaction: exactly these tasks are lost
        async with own_redis.pipeline(transaction=True) as pipe:
            for _, mac in ranked:
                for prio in PRIORITIES:
                    pipe.lrange(queues.keys.queue(mac, prio), 0, -1)
                pipe.delete(queues.keys.meta(mac), *(queues.keys.queue(mac, prio) for prio in PRIORITIES))
            replies = await pipe.execute()
        lost.extend(raw.split("|", 1)[0] for reply in replies if isinstance(reply, list) for raw in reply)
        fault_at = time.monotonic()

    load = Load(c.settings)
    runner = asyncio.create_task(load.run())
    await fault()
    await runner
    await wait_all_final(pg, lost)
    recovery = time.monotonic() - fault_at
    a = await audit("Redis keys of 3 devices deleted", load, pg, own_redis, c.settings, c.log_dir)
    assert_clean(a, TASKS)
    reconciled = log_count(c.log_dir, REQUEUED)
    # the fault hit queued work, and exactly that work was re-queued by reconciliation (no false positive)
    assert len(lost) >= 20 and len(set(lost)) == len(lost)
    assert reconciled == len(lost), (reconciled, len(lost))
    noted = await pg.fetchval(
        "SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND history::text LIKE '%re-queued by reconciliation%'",
        lost,
    )
    assert noted == len(lost)
    await counters_exact(own_redis, queues)
    ROWS.append(
        FaultRow(
            "(a) Redis keys of 3 devices deleted",
            a.accepted,
            a.succeeded,
            count_refusals(c.log_dir),
            reconciled,
            f"{len(lost)} queued tasks deleted",
            recovery,
        )
    )


# --- (b) a worker that acks without results ----------------------------------------------------------------


async def test_a_worker_that_acks_without_results_loses_nothing_and_reconciliation_requeues_nothing(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis
) -> None:
    c = fault_cluster
    # a task the liar takes several times is neither dead-lettered for it nor kept waiting long
    c.env.update({"SIEVE_MAX_ATTEMPTS": "50", "SIEVE_RETRY_BACKOFF_MAX_S": "1"})
    c.env["SIEVE_WORKER_CONCURRENCY"] = "4"  # the liar (10) has the most room: the scheduler prefers it
    liar = c.as_caller("liar", "worker")
    await start_services(c, workers=2)
    queues = QueueStore(own_redis, c.settings)
    left_at = 0.0

    async def register_forever() -> None:
        async with rpc.channel(c.settings.registry_addr, liar) as channel:
            stub = registry_pb2_grpc.RegistryServiceStub(channel)
            while True:
                await stub.Register(
                    registry_pb2.RegisterRequest(
                        worker_id="liar", hostname="liar", pid=1, task_types=[types_pb2.TASK_TYPE_TEXT], concurrency=10
                    ),
                    timeout=5,
                )
                await asyncio.sleep(1)

    load = Load(c.settings)
    registering = asyncio.create_task(register_forever())
    try:
        await asyncio.sleep(0.5)  # registered first, as a worker does
        async with ScriptedWorker(liar, worker_id="liar", credits=10) as scripted:
            await asyncio.sleep(1)  # its stream open: it competes for the load from the start
            runner = asyncio.create_task(load.run())
            deadline = time.monotonic() + 60
            while len(scripted.received) < 300 and not load.done.is_set():
                assert time.monotonic() < deadline, len(scripted.received)
                await asyncio.sleep(0.05)
        left_at = time.monotonic()
        await runner
    finally:
        registering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await registering
    assert scripted.error is None, scripted.error
    a = await audit("worker acks without results", load, pg, own_redis, c.settings, c.log_dir)
    recovery = time.monotonic() - left_at
    assert_clean(a, TASKS)
    # the fault hit work in flight: the liar got tasks and each of its acks was refused (the task put back)
    unproven = log_count(c.log_dir, UNPROVEN)
    # (all but what it held when it left: those went back when its stream closed)
    assert len(scripted.received) >= 100 and unproven >= len(scripted.received) - 10, (len(scripted.received), unproven)
    results_by_liar = await pg.fetchval("SELECT count(*) FROM results WHERE worker_id = 'liar'")
    assert results_by_liar == 0
    # and reconciliation, looking at tasks bouncing between leases, the delayed set and queues, queued none again
    reconciled = log_count(c.log_dir, REQUEUED)
    assert reconciled == 0
    await counters_exact(own_redis, queues)
    ROWS.append(
        FaultRow(
            "(b) worker acks without results",
            a.accepted,
            a.succeeded,
            count_refusals(c.log_dir),
            reconciled,
            f"{len(scripted.received)} hand-outs acked empty, {unproven} put back",
            recovery,
        )
    )


# --- (c) intake killed between rows and enqueues ------------------------------------------------------------


class SlowLink:
    """A TCP proxy that delivers what its clients send `delay_s` late and drops what it has not delivered when a
    client goes away (the last writes of a killed process never reach the server); replies pass at once."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        outbox: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward() -> None:
            while True:
                due, data = await outbox.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                up_writer.write(data)
                await up_writer.drain()

        async def back() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(forward()), asyncio.create_task(back())]
        try:
            while data := await reader.read(65536):
                outbox.put_nowait((loop.time() + self.delay_s, data))
        except ConnectionError:
            pass
        finally:  # the client is gone: what it sent and is still on the way is dropped
            for pump in pumps:
                pump.cancel()
            for w in (up_writer, writer):
                w.close()


@dataclass
class Clients:
    """`count` clients submitting `tasks` keyed tasks (batches of `batch`), each retrying what was not accepted."""

    loads: list[Load]
    tasks: int
    batch: int = 10

    @property
    def accepted(self) -> dict[str, str]:
        return {k: v for load in self.loads for k, v in load.accepted.items()}

    async def run(self) -> None:
        specs = [
            intake_pb2.TaskSpec(
                device_id=f"0F:00:00:00:{i % 50:02x}:00",
                type=types_pb2.TASK_TYPE_TEXT,
                text=f"hello {i}",
                idempotency_key=f"kill-{i}",
            )
            for i in range(self.tasks)
        ]
        share = len(specs) // len(self.loads) + 1

        async def one(load: Load, mine: list[intake_pb2.TaskSpec]) -> None:
            async with rpc.channel(load.settings.intake_addr, load.settings) as channel:
                stub = intake_pb2_grpc.IntakeServiceStub(channel)
                for i in range(0, len(mine), self.batch):
                    await load._submit(stub, mine[i : i + self.batch])

        await asyncio.gather(*(one(load, specs[n * share : (n + 1) * share]) for n, load in enumerate(self.loads)))


async def test_intake_killed_five_times_between_rows_and_enqueues_loses_no_accepted_task(
    fault_cluster: Cluster, pg: asyncpg.Pool, own_redis: Redis, redis_server: object
) -> None:
    c = fault_cluster
    tasks = 4000
    c.env.update(FAST_ENV)
    c.start("registry", "registry_svc")
    await c.wait_healthy(c.settings.registry_addr, "registry")
    c.start("scheduler", "scheduler_svc")
    await c.wait_healthy(c.settings.scheduler_addr, "scheduler")
    c.env["SIEVE_SCHEDULER_ADDR"] = "ipv4:" + c.settings.scheduler_addr
    link = SlowLink(redis_server.port, delay_s=0.02)  # type: ignore[attr-defined]
    await link.start()
    intake_env = {"SIEVE_REDIS_URL": f"redis://127.0.0.1:{link.port}/0"}
    c.start("intake", "intake_svc", **intake_env)
    await c.wait_healthy(c.settings.intake_addr, "intake")
    for i in (1, 2):
        await start_worker(c, f"worker-{i}")

    clients = Clients([Load(c.settings) for _ in range(20)], tasks)
    runner = asyncio.create_task(clients.run())
    kills, last_kill = 0, 0.0
    try:
        for threshold in (400, 1000, 1600, 2200, 2800):
            while len(clients.accepted) < threshold:
                assert not runner.done() or runner.exception() is None, runner.exception()
                await asyncio.sleep(0.005)
            kill9(c, "intake" if kills == 0 else f"intake-{kills + 1}")
            kills += 1
            last_kill = time.monotonic()
            await asyncio.sleep(0.3)  # the clients see it gone and retry
            c.start(f"intake-{kills + 1}", "intake_svc", **intake_env)
            await c.wait_healthy(c.settings.intake_addr, f"intake-{kills + 1}")
        await runner
    finally:
        await link.close()
    accepted = clients.accepted
    assert len(accepted) == tasks and kills == 5
    await wait_all_final(pg, list(accepted.values()), timeout_s=120)
    recovery = time.monotonic() - last_kill

    # every key is one task, SUCCEEDED once, nothing left in Redis
    load = Load(c.settings)
    load.accepted = accepted
    a = await audit("intake kill -9 x5, 20 clients", load, pg, own_redis, c.settings, c.log_dir)
    a.submitted = tasks
    AUDITS.append(a)
    assert a.succeeded == a.results == tasks and len(set(accepted.values())) == tasks, a
    assert (a.duplicates, a.lost, a.extra_rows, a.pending_left) == (0, 0, 0, 0), a
    # the kills hit work in flight: rows whose enqueue never reached Redis, answered `deduplicated` to the retry,
    # and queued by reconciliation (each one's history says so)
    reconciled = log_count(c.log_dir, REQUEUED)
    stuck = await pg.fetch("SELECT id, history FROM tasks WHERE history::text LIKE '%re-queued by reconciliation%'")
    assert reconciled >= 1 and len(stuck) == reconciled, (reconciled, len(stuck))
    histories = [r["history"] for r in stuck]
    # each was queued again within the bound (grace + interval + a pass: 2 x the 3 s lease TTL, and some slack for
    # a busy machine), and finished soon after
    back_s = max(_noted(h) - _at(h, "PENDING") for h in histories)
    done_s = max(_at(h, "SUCCEEDED") - _at(h, "PENDING") for h in histories)
    assert back_s <= 2 * 3 + 4, back_s
    await counters_exact(own_redis, QueueStore(own_redis, c.settings))
    ROWS.append(
        FaultRow(
            "(c) intake kill -9 x5, 20 clients",
            len(accepted),
            a.succeeded,
            count_refusals(c.log_dir),
            reconciled,
            f"{reconciled} rows never enqueued; re-queued <= {back_s:.1f}s, done <= {done_s:.1f}s after accepted",
            recovery,
        )
    )


def _at(history: list[dict[str, object]], status: str) -> float:
    """When the task first reached `status`."""
    moments = [datetime.fromisoformat(str(h["at"])) for h in history if h["status"] == status]
    return moments[0].timestamp() if moments else 0.0


def _noted(history: list[dict[str, object]]) -> float:
    """When reconciliation noted that it queued the task again."""
    return max(
        datetime.fromisoformat(str(h["at"])).timestamp()
        for h in history
        if "re-queued by reconciliation" in str(h["detail"])
    )

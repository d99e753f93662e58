"""A real PostgreSQL restart under load (issue 11, point 8): the cluster's PostgreSQL is a server of the test's own,
stopped with `pg_ctl stop -m immediate` (no checkpoint, no flush: WAL still in its memory is gone) for a few
seconds and started again (crash recovery), while 2 000 tasks with idempotency keys are submitted and retried.

The server commits like a production one (synchronous_commit on; fsync off, which the stop does not test since
the OS stays up), so what an immediate stop loses is the WAL not yet written out of its memory: the commits that
did not wait for it, the scheduler's ASSIGNED marks and the workers' RUNNING marks (`TaskStore.assigned` / `start`,
synchronous_commit off per statement; a first attempt of a text is run without a RUNNING mark, so here the marks
are the scheduler's, written once a hand-out has been out for `ASSIGNED_DELAY_S`). So that the stop finds such
marks in flight every time, not by luck of timing, the test sets the moment up: clients held back (an intake commit
writes out the WAL before it), the `results` table locked (workers hold their batches and wait to store their
results, so the scheduler marks them ASSIGNED), the WAL writer paused (SIGSTOP: it would write those commits out
within 200 ms), one batch of clients let through (its commit is written out; the marks of its tasks come after
it, in memory only), then the stop; the paused WAL writer gets the stop's SIGQUIT and quits on it, writing nothing.
The stop loses those marks and the workers' result writes fail and are retried; once PostgreSQL is back each such
write is stored for the hand-out whose mark was lost (it carries the mark's condition: a lease newer than the
row's), so the lost mark costs no second run.

Asserted: every accepted key is one task, SUCCEEDED, with one result and one final status; nothing lost, no row
not accepted, no pending count left; and the fault hit work in flight: marks were made after the last WAL write
(in memory only), workers' group-commit writes failed and were retried (their logs), the intake refused clients
who retried (the load's count), and each hand-out whose mark was lost stored its own result. Reported: those
counts, the duplicates executed (fencing refusals logged) and the recovery time (PostgreSQL back -> every task
accepted before the stop final, and -> all final).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from scheduler_svc.lifecycle import ASSIGNED_DELAY_S
from sieve.db import create_pool
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc
from tests.faults.harness import (
    AUDITS,
    TASKS,
    Load,
    audit,
    start_services,
    wait_all_final,
    when_results_reach,
)
from tests.support.cluster import Cluster, on_free_ports, service_env
from tests.support.servers import PostgresProcess, RedisProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: how long PostgreSQL stays down
DOWN_S = 4.0
#: synchronous commits as in production; no autovacuum during this short test (its evictions of dirty pages
#: write the WAL out, while the WAL writer is paused)
PG_OPTIONS = {"synchronous_commit": "on", "autovacuum": "off"}
WRITE_FAILED = re.compile(r"(start|read|results): write failed")
UNPROVEN = re.compile(r"acked (\d+) tasks without a stored result")
#: the last line of a stack that says only that PostgreSQL was away (refused, reset, closed, starting up)
STORE_AWAY = re.compile(
    r"ConnectionRefusedError|ConnectionResetError|ConnectionDoesNotExistError|"
    r"CannotConnectNowError|connection was closed|Connect call failed|the database system is"
)


def _open_gate() -> asyncio.Event:
    gate = asyncio.Event()
    gate.set()
    return gate


@dataclass
class GatedLoad(Load):
    """The harness's load, whose clients can be held back between two batches (`gate` cleared) and then let
    through one batch at a time (`one_batch`)."""

    gate: asyncio.Event = field(default_factory=_open_gate)
    submitting: int = 0
    permits: int = 0
    batches: int = 0
    #: the keys accepted when PostgreSQL was stopped
    before_stop: list[str] = field(default_factory=list)

    async def _submit(self, stub: intake_pb2_grpc.IntakeServiceStub, specs: list[intake_pb2.TaskSpec]) -> None:
        await self.gate.wait()
        if self.permits:  # let through by `one_batch`: closed again behind it
            self.permits -= 1
            self.gate.clear()
        self.submitting += 1
        try:
            await super()._submit(stub, specs)
        finally:
            self.submitting -= 1
            self.batches += 1

    async def held_back(self, timeout_s: float = 30) -> None:
        """Until no client call is in flight (the gate is closed)."""
        deadline = time.monotonic() + timeout_s
        while self.submitting:
            assert time.monotonic() < deadline, "a client call did not end"
            await asyncio.sleep(0.01)

    async def one_batch(self, timeout_s: float = 30) -> None:
        """Lets one batch through the closed gate and waits until it is accepted."""
        target = self.batches + 1
        self.permits += 1
        self.gate.set()
        deadline = time.monotonic() + timeout_s
        while self.batches < target:
            assert time.monotonic() < deadline, "the batch let through was not accepted"
            await asyncio.sleep(0.005)


@pytest.fixture
def pg_server() -> Iterator[PostgresProcess]:
    server = PostgresProcess(PG_OPTIONS)
    server.start()
    yield server
    server.remove()


@pytest.fixture
def pg_cluster(
    settings: Settings, redis_server: RedisProcess, pg_server: PostgresProcess, tmp_path: Path
) -> Iterator[Cluster]:
    """A cluster on the test's own Redis and PostgreSQL servers (services not started yet)."""
    settings = on_free_ports(settings.replace(redis_url=redis_server.url, database_url=pg_server.url))
    # metrics on ports of their own (the default ports are one per host)
    env = service_env(
        settings, **{f"SIEVE_{n}_METRICS_ADDR": "127.0.0.1:0" for n in ("INTAKE", "SCHEDULER", "REGISTRY", "WORKER")}
    )
    cluster = Cluster.create(settings, env, tmp_path)
    yield cluster
    cluster.kill_all()


@pytest.fixture
async def own_pg(pg_cluster: Cluster) -> AsyncIterator[list[asyncpg.Pool]]:
    """The test's pool on its own server (migrated), in a list: replaced after the restart."""
    pools = [await create_pool(pg_cluster.settings)]
    yield pools
    for pool in pools:
        pool.terminate()


def sigquit_pending(pid: int) -> bool:
    """Whether SIGQUIT waits to be delivered to process `pid` (a stopped one)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True  # gone already
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", status, re.M)
    return any(int(mask, 16) & (1 << (signal.SIGQUIT - 1)) for mask in masks)


def stop_immediately(server: PostgresProcess, paused_walwriter: int) -> None:
    """What `pg_ctl stop -m immediate` does, SIGQUIT to the postmaster: it sends every server process SIGQUIT, and
    they quit at once, nothing checkpointed or written out; the next start runs crash recovery. Sent from here,
    not by forking pg_ctl (CI once saw pg_ctl, forked from this process with gRPC's threads running, die of
    SIGSEGV before it signalled anything). The paused WAL writer is continued only once the SIGQUIT waits for it,
    so that it quits before anything else."""
    assert server.proc is not None and server.proc.poll() is None
    os.kill(server.proc.pid, signal.SIGQUIT)
    deadline = time.monotonic() + 20
    while not sigquit_pending(paused_walwriter):
        assert time.monotonic() < deadline, "the WAL writer was never told to quit"
        time.sleep(0.002)
    resume(paused_walwriter)
    assert server.proc is not None
    server.proc.wait(timeout=30)


def resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


async def handed_out_now(conn: asyncpg.Connection, timeout_s: float = 20) -> dict[str, int]:
    """The tasks marked ASSIGNED or RUNNING (id -> lease) once they stop changing for longer than an ASSIGNED mark
    waits: the workers' slots are full of batches that wait to store their results."""
    deadline = time.monotonic() + timeout_s
    steady_s = ASSIGNED_DELAY_S + 0.5
    seen: dict[str, int] = {}
    since = time.monotonic()
    while True:
        rows = await conn.fetch("SELECT id::text, lease FROM tasks WHERE status IN ('ASSIGNED', 'RUNNING')")
        now = {r["id"]: r["lease"] for r in rows}
        if now != seen:
            seen, since = now, time.monotonic()
        elif now and time.monotonic() - since >= steady_s:
            return now
        assert time.monotonic() < deadline, f"hand-outs kept changing: {len(now)}"
        await asyncio.sleep(0.2)


async def connect_when_up(url: str, schema: str, timeout_s: float = 30) -> asyncpg.Connection:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await asyncpg.connect(url, server_settings={"search_path": schema})
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.PostgresConnectionError):
            assert time.monotonic() < deadline, "PostgreSQL did not come back"
            await asyncio.sleep(0.1)


def final_error(stack: str) -> str:
    """The last exception of a logged stack, all its lines (PostgreSQL's messages end in a DETAIL line)."""
    lines = stack.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
    return "\n".join(lines[frames[-1] + 1 :] if frames else lines)


def other_errors(logs: Path) -> list[str]:
    """Log lines with a stack whose error is not PostgreSQL being unreachable (a bug the restart found)."""
    found = []
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            stack = str(entry.get("exception") or "").strip()
            if stack and not STORE_AWAY.search(error := final_error(stack)):
                found.append(f"{path.stem}: {entry.get('message')}: {error}")
    return found


def log_counts(logs: Path) -> tuple[int, int]:
    """(group-commit writes that failed and were retried, tasks acked without a stored result and put back)."""
    failed = unproven = 0
    for path in logs.glob("*.log"):
        text = path.read_text(errors="replace")
        failed += len(WRITE_FAILED.findall(text))
        unproven += sum(int(n) for n in UNPROVEN.findall(text))
    return failed, unproven


async def test_postgresql_stopped_immediately_and_started_again_under_load_loses_nothing(
    pg_cluster: Cluster, pg_server: PostgresProcess, own_pg: list[asyncpg.Pool], own_redis: Redis
) -> None:
    c = pg_cluster
    schema = c.settings.database_schema
    # fixed resource readings: this busy host's CPU must not hold the workers back (recovery is measured)
    c.env.update(SIEVE_TEST_HOOKS="true", SIEVE_FIXED_RESOURCES="cpu=10,memory=20,gpu_memory=0")
    await start_services(c, workers=2)
    load = GatedLoad(c.settings)
    submitting = asyncio.create_task(load.run(pause_s=0.1))
    holder: asyncpg.Connection | None = None
    walwriter = 0
    try:
        # with work at every stage: results stored, tasks queued, and clients still submitting
        await when_results_reach(own_pg[0], 200, timeout_s=90)
        while len(load.accepted) < TASKS // 3:
            assert not submitting.done(), "the load ended before the fault"
            await asyncio.sleep(0.02)
        assert len(load.accepted) < TASKS, "the load ended before the fault"
        # Given batches between their ASSIGNED mark (in the server's memory only) and their result: clients held
        # back, results locked, the WAL writer paused, one batch let through (its commit writes the WAL out)
        load.gate.clear()
        await load.held_back()
        holder = await connect_when_up(pg_server.url, schema)
        await holder.execute("BEGIN; LOCK TABLE results IN SHARE ROW EXCLUSIVE MODE")
        walwriter = await holder.fetchval("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")
        os.kill(walwriter, signal.SIGSTOP)
        earlier = set(load.accepted)
        await load.one_batch()
        let_through = {load.accepted[k] for k in set(load.accepted) - earlier}
        written = await holder.fetchval("SELECT pg_current_wal_lsn()")
        handed = await handed_out_now(holder)
        marked_after = let_through & set(handed)  # marks whose commits are in memory only
        unwritten = int(await holder.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", written))
        assert await holder.fetchval("SELECT pg_current_wal_lsn() = $1", written), "the WAL was written out"
        load.before_stop = list(load.accepted)
        # When PostgreSQL is stopped for real (immediate: its unwritten WAL is lost) and clients go on meanwhile
        await asyncio.to_thread(stop_immediately, pg_server, walwriter)
        holder.terminate()
        holder = None
        load.gate.set()
        await asyncio.sleep(DOWN_S)
        # and started again (crash recovery)
        await asyncio.to_thread(pg_server.start)
        back = time.monotonic()
        own_pg[0].terminate()
        own_pg[0] = await create_pool(c.settings, attempts=120, delay_s=0.25)
        pool = own_pg[0]
        # Then every task accepted before the stop ends final, and then all do
        await wait_all_final(pool, [load.accepted[k] for k in load.before_stop], timeout_s=90)
        in_flight_s = time.monotonic() - back
        await submitting
        await wait_all_final(pool, list(load.accepted.values()), timeout_s=90)
        all_s = time.monotonic() - back
    finally:
        if walwriter:
            resume(walwriter)
        if holder is not None:
            holder.terminate()
        if not submitting.done():
            submitting.cancel()

    a = await audit("PostgreSQL restart (-m immediate)", load, pool, own_redis, c.settings, c.log_dir)
    # the hand-outs out at the stop whose result was stored by that hand-out (no later attempt was needed)
    kept = {
        r["id"]
        for r in await pool.fetch(
            "SELECT t.id::text FROM tasks t JOIN unnest($1::uuid[], $2::int[]) AS r(id, lease) ON r.id = t.id "
            "JOIN results s ON s.task_id = t.id "
            "WHERE t.status = 'SUCCEEDED' AND t.lease = r.lease AND s.attempt = r.lease",
            list(handed),
            list(handed.values()),
        )
    }
    failed_writes, unproven = log_counts(c.log_dir)
    a.note = (
        f"{len(handed)} handed out at stop, {len(marked_after)} marked after the last WAL write ({unwritten} B), "
        f"{len(kept)} stored by that hand-out, "
        f"{failed_writes} failed writes retried, {unproven} put back, {load.retries} client retries; "
        f"back->in-flight final {in_flight_s:.1f}s, ->all final {all_s:.1f}s"
    )
    AUDITS.append(a)
    print(f"\n{a.case}: {a.note}; duplicates executed (fencing refusals) {a.refusals}")

    # every accepted key is one task, SUCCEEDED once, with one result (results are unique per task)
    assert a.accepted == TASKS and len(set(load.accepted.values())) == TASKS, a
    assert a.succeeded == a.results == TASKS, a
    assert (a.duplicates, a.lost, a.extra_rows, a.pending_left) == (0, 0, 0, 0), a
    assert (
        await pool.fetchval(
            "SELECT count(DISTINCT task_id) FROM results r JOIN tasks t ON t.id = r.task_id AND t.status = 'SUCCEEDED'"
        )
        == TASKS
    )
    # and the fault hit work in flight: the marks that did not wait for the WAL were lost with it, and harmlessly:
    # each of those hand-outs stored its own result once PostgreSQL was back
    assert marked_after and unwritten > 0, (len(marked_after), unwritten)
    assert marked_after <= kept, (len(marked_after - kept), len(marked_after))
    assert failed_writes > 0, "no group-commit write failed: the stop hit no worker's write"
    assert load.retries > 0, "the intake never refused a client while PostgreSQL was down"
    # every service is still running, and the only errors it logged with a stack were PostgreSQL being away
    for name, proc in c.procs.items():
        assert proc.poll() is None, f"{name} exited:\n{c.log_of(name)}"
    assert not (other := other_errors(c.log_dir)), other

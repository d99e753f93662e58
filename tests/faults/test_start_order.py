"""Start in any order: every service started before its Redis and PostgreSQL exist listens at once, answers
health NOT_SERVING (and its RPCs UNAVAILABLE), stays alive, and serves once the stores come up; when Redis goes
away later health turns NOT_SERVING, and when it comes back (empty: the scheduler rebuilds it from PostgreSQL)
everything serves again and work flows, with no restart.

The stores come up SIEVE_TEST_STORE_DELAY_S seconds after the services (default 8; the issue's case is 60:
`SIEVE_TEST_STORE_DELAY_S=60 pytest -s tests/faults/test_start_order.py`). Run with -s for the timings.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sieve import rpc
from sieve.launch import free_port
from sieve.rpc.readiness import LIVENESS
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import Cluster, service_env
from tests.support.servers import PostgresProcess, RedisProcess

pytestmark = pytest.mark.e2e

STORE_DELAY_S = float(os.environ.get("SIEVE_TEST_STORE_DELAY_S", "8"))
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
FAST_ENV = {
    "SIEVE_HEARTBEAT_INTERVAL_S": "1",
    "SIEVE_WORKER_TTL_S": "4",
    "SIEVE_LEASE_TTL_S": "5",
    "SIEVE_HOUSEKEEPING_INTERVAL_S": "0.3",
    "SIEVE_SHUTDOWN_GRACE_S": "5",
}


async def health(address: str, settings: Settings, service: str = "") -> int | None:
    """The health status at `address`, or None while nothing answers there."""
    async with rpc.channel(address, settings) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1
            )
        except grpc.aio.AioRpcError:
            return None
        return reply.status


async def until(cluster: Cluster, addresses: dict[str, str], status: int, timeout_s: float) -> dict[str, float]:
    """Waits until each service answers `status`; returns the seconds each took. Every service must stay alive."""
    started = time.monotonic()
    took: dict[str, float] = {}
    while len(took) < len(addresses):
        for name, address in addresses.items():
            proc = cluster.procs[name]
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{cluster.log_of(name)}"
            if name not in took and await health(address, cluster.settings) == status:
                took[name] = time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            missing = sorted(set(addresses) - set(took))
            raise AssertionError(
                f"{missing} not {health_pb2.HealthCheckResponse.ServingStatus.Name(status)} in "
                f"{timeout_s}s:\n" + "\n".join(cluster.log_of(n, 15) for n in missing)
            )
        await asyncio.sleep(0.1)
    return took


async def submit_and_finish(cluster: Cluster, text: str, timeout_s: float = 45) -> float:
    """Submits one text (retrying UNAVAILABLE like a client) and waits until it succeeded; returns the seconds."""
    started = time.monotonic()
    async with rpc.channel(cluster.settings.intake_addr, cluster.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        spec = intake_pb2.TaskSpec(device_id="0A:00:00:00:00:01", type=types_pb2.TASK_TYPE_TEXT, text=text)
        while True:
            try:
                task_id = (await stub.Submit(intake_pb2.SubmitRequest(task=spec), timeout=5)).task.task_id
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert time.monotonic() - started < timeout_s, f"intake refused for {timeout_s}s: {exc.details()}"
                await asyncio.sleep(0.3)
        while True:
            task = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)).task
            if task.status == types_pb2.TASK_STATUS_SUCCEEDED:
                return time.monotonic() - started
            assert task.status in (
                types_pb2.TASK_STATUS_PENDING,
                types_pb2.TASK_STATUS_ASSIGNED,
                types_pb2.TASK_STATUS_RUNNING,
            ), task
            assert time.monotonic() - started < timeout_s, f"task still {task.status} after {timeout_s}s"
            await asyncio.sleep(0.2)


@pytest.mark.timeout(240 + 2 * STORE_DELAY_S)
async def test_services_started_before_their_stores_wait_then_serve_and_survive_a_redis_restart(
    settings: Settings, tmp_path: Path
) -> None:
    redis = RedisProcess(tmp_path)
    pg = PostgresProcess()
    ports = {name: free_port() for name in ("intake", "scheduler", "registry", "worker")}
    settings = settings.replace(
        redis_url=redis.url,
        database_url=pg.url,
        intake_addr=f"127.0.0.1:{ports['intake']}",
        scheduler_addr=f"127.0.0.1:{ports['scheduler']}",
        registry_addr=f"127.0.0.1:{ports['registry']}",
    )
    env = service_env(settings, **FAST_ENV)
    env.update(
        {f"SIEVE_{n.upper()}_METRICS_ADDR": "127.0.0.1:0" for n in ("intake", "scheduler", "registry", "worker")}
    )
    cluster = Cluster.create(settings, env, tmp_path)
    addresses = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    try:
        # Given every service started before Redis and PostgreSQL exist
        started = time.monotonic()
        cluster.start("registry", "registry_svc")
        cluster.start("scheduler", "scheduler_svc")
        cluster.start("intake", "intake_svc")
        cluster.start("worker", "worker_svc", SIEVE_WORKER_ID="worker-1", SIEVE_WORKER_HEALTH_ADDR=addresses["worker"])
        # Then each listens and answers NOT_SERVING, and calls get a clean UNAVAILABLE
        listening = await until(cluster, addresses, NOT_SERVING, timeout_s=60)
        async with rpc.channel(settings.intake_addr, cluster.settings) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await intake_pb2_grpc.IntakeServiceStub(channel).GetTask(
                    intake_pb2.GetTaskRequest(task_id="00000000-0000-0000-0000-000000000000"), timeout=5
                )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not ready" in (refused.value.details() or "")
        # and they stay alive and NOT_SERVING while the stores are away
        await asyncio.sleep(max(1.0, STORE_DELAY_S - (time.monotonic() - started)))
        still = await until(cluster, addresses, NOT_SERVING, timeout_s=10)
        assert all(t < 5 for t in still.values()), still
        for address in addresses.values():  # alive, as far as a liveness probe can tell
            assert await health(address, cluster.settings, LIVENESS) == SERVING

        # When the stores come up
        pg.start()
        redis.start()
        # Then all serve, and a submitted task succeeds
        ready = await until(cluster, addresses, SERVING, timeout_s=60)
        first = await submit_and_finish(cluster, "加 微 信 first")
        logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace") for name in addresses}
        assert all("not ready (attempt" in text for text in logs.values()), "one line per attempt is logged"
        traced = {
            name: text[max(0, text.index("Traceback") - 300) :][:1500]
            for name, text in logs.items()
            if "Traceback" in text
        }
        assert not traced, f"no stack trace while waiting: {traced}"

        # When Redis goes away
        redis.kill()
        lost = await until(
            cluster, {n: addresses[n] for n in ("intake", "scheduler", "registry")}, NOT_SERVING, timeout_s=30
        )
        assert await health(addresses["worker"], cluster.settings) == SERVING  # the worker needs PostgreSQL only
        # and comes back empty
        redis.start()
        back = await until(cluster, addresses, SERVING, timeout_s=60)
        second = await submit_and_finish(cluster, "加 微 信 second")
        assert "Redis rebuilt from PostgreSQL" in cluster.log_of("scheduler", 400)

        print(
            f"\nstart order (stores up {STORE_DELAY_S:.0f}s after the services): listening in "
            f"{max(listening.values()):.1f}s; stores up -> SERVING "
            + ", ".join(f"{n} {t:.1f}s" for n, t in ready.items())
            + f"; first task done {first:.1f}s later; Redis killed -> NOT_SERVING "
            + ", ".join(f"{n} {t:.1f}s" for n, t in lost.items())
            + "; Redis back -> SERVING "
            + ", ".join(f"{n} {t:.1f}s" for n, t in back.items())
            + f"; task after that done in {second:.1f}s"
        )
        # And SIGTERM still stops everything cleanly
        codes = cluster.terminate_all()
        assert codes == dict.fromkeys(codes, 0), {n: cluster.log_of(n) for n, c in codes.items() if c}
    finally:
        cluster.kill_all()
        redis.kill()
        pg.remove()


async def test_a_service_waiting_for_its_stores_stops_cleanly_on_sigterm(settings: Settings, tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path)  # never started
    port = free_port()
    settings = settings.replace(
        redis_url=redis.url,
        database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/x",
        registry_addr=f"127.0.0.1:{port}",
        intake_addr=f"127.0.0.1:{free_port()}",
    )
    env = service_env(settings, SIEVE_REGISTRY_METRICS_ADDR="", SIEVE_INTAKE_METRICS_ADDR="")
    cluster = Cluster.create(settings, env, tmp_path)
    addresses = {"registry": settings.registry_addr, "intake": settings.intake_addr}
    try:
        cluster.start("registry", "registry_svc")
        cluster.start("intake", "intake_svc")
        await until(cluster, addresses, NOT_SERVING, timeout_s=60)
        await asyncio.sleep(1)
        started = time.monotonic()
        codes = cluster.terminate_all(timeout_s=15)
        assert codes == {"registry": 0, "intake": 0}, {n: cluster.log_of(n) for n in codes}
        assert time.monotonic() - started < 15
        assert "Traceback" not in cluster.log_of("intake", 200)
    finally:
        cluster.kill_all()

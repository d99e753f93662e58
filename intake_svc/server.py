"""Entry point of the intake service: `python -m intake_svc`."""

from __future__ import annotations

from redis.asyncio import Redis

from intake_svc.rejections import RejectionCounter
from intake_svc.servicer import IntakeServicer
from sieve import rpc
from sieve.db import create_pool
from sieve.db.audit import AuditLog
from sieve.db.tasks import TaskStore
from sieve.logs import setup_logging
from sieve.metrics import start_metrics_server
from sieve.queue_store import QueueStore
from sieve.redis_conn import create_redis
from sieve.settings import Settings
from sieve.telemetry import setup_telemetry
from sieve.v1 import intake_pb2, intake_pb2_grpc

SERVICE_NAME = intake_pb2.DESCRIPTOR.services_by_name["IntakeService"].full_name


def build_service(settings: Settings, redis: Redis, tasks: TaskStore) -> rpc.Service:
    servicer = IntakeServicer(tasks, QueueStore(redis, settings), settings)
    return rpc.Service(
        name="sieve-intake",
        service_names=[SERVICE_NAME],
        register=lambda server: intake_pb2_grpc.add_IntakeServiceServicer_to_server(servicer, server),
        interceptors=[RejectionCounter()],
        audit=AuditLog(tasks.pool),
    )


async def main() -> None:
    settings = Settings.from_env()
    setup_logging("sieve-intake", settings.log_level)
    setup_telemetry("sieve-intake", settings)
    start_metrics_server(settings.intake_metrics_addr)
    redis = await create_redis(settings)
    pool = await create_pool(settings)
    running = await rpc.create_server(build_service(settings, redis, TaskStore(pool)),
                                      settings.intake_addr, settings)
    try:
        await rpc.serve(running, settings)
    finally:
        await pool.close()
        await redis.aclose()


def run() -> None:
    rpc.run_main(main)

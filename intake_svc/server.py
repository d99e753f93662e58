"""Entry point of the intake service: `python -m intake_svc`."""

from __future__ import annotations

from redis.asyncio import Redis

from intake_svc.rejections import RejectionCounter
from intake_svc.servicer import IntakeServicer
from sieve import rpc
from sieve.db.audit import AuditLog
from sieve.db.tasks import TaskStore
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.redis.queue_store import QueueStore
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
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

    async def build(stores: Stores) -> Built:
        return Built(build_service(settings, stores.redis, TaskStore(stores.pool)))

    # listens at once (health NOT_SERVING) and serves once Redis and PostgreSQL answer (sieve/rpc/readiness.py)
    readiness = Readiness(settings, "sieve-intake", [SERVICE_NAME], build, redis=True, postgres=True)
    await readiness.run(settings.intake_addr)


def run() -> None:
    rpc.run_main(main)

"""The registry process: builds the service on the shared server shape and runs it until SIGTERM."""

from __future__ import annotations

import logging

import grpc
from redis.asyncio import Redis

from registry_svc.metrics import RegistryCollector
from registry_svc.servicer import RegistryServicer
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import REGISTRY, start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc import Service
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc

log = logging.getLogger("sieve.registry")

SERVICE_NAME = registry_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name


def build_service(settings: Settings, redis: Redis) -> Service:
    """The registry's servicer on the shared server shape (health and reflection come with it)."""
    servicer = RegistryServicer(settings, redis)

    def register(server: grpc.aio.Server) -> None:
        registry_pb2_grpc.add_RegistryServiceServicer_to_server(servicer, server)

    return Service(name="sieve-registry", service_names=[SERVICE_NAME], register=register)


async def main() -> None:
    settings = Settings.from_env()
    setup_logging("sieve-registry", settings.log_level)
    setup_telemetry("sieve-registry", settings)
    start_metrics_server(settings.registry_metrics_addr)

    async def build(stores: Stores) -> Built:
        REGISTRY.register(RegistryCollector(WorkerRecords(stores.redis, settings)))
        return Built(build_service(settings, stores.redis))

    # listens at once (health NOT_SERVING) and serves once Redis answers (sieve/rpc/readiness.py)
    readiness = Readiness(settings, "sieve-registry", [SERVICE_NAME], build, redis=True, postgres=False)
    await readiness.run(settings.registry_addr)

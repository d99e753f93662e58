"""The registry process: `build` wires the servicer onto the shared server shape, `main` runs it until SIGTERM."""

from __future__ import annotations

import logging

import grpc

from registry_svc.metrics import RegistryCollector
from registry_svc.servicer import RegistryServicer
from sieve import rpc
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import REGISTRY, start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc

log = logging.getLogger("sieve.registry")

SERVICE_NAME = registry_pb2.DESCRIPTOR.services_by_name["RegistryService"].full_name


class RegistryApp:
    """The registry of one process: its `RegistryServicer` over the worker records in Redis, and the
    `rpc.Service` that serves it (health and reflection come with the shared server shape)."""

    def __init__(self, settings: Settings, stores: Stores) -> None:
        self.servicer = RegistryServicer(settings, stores.redis)
        self.service = rpc.Service(name="sieve-registry", service_names=[SERVICE_NAME], register=self._register)

    def _register(self, server: grpc.aio.Server) -> None:
        registry_pb2_grpc.add_RegistryServiceServicer_to_server(self.servicer, server)


async def build(settings: Settings, stores: Stores) -> RegistryApp:
    """The registry on these stores (Redis only)."""
    return RegistryApp(settings, stores)


async def main() -> None:
    settings = Settings.from_env()
    setup_logging("sieve-registry", settings.log_level)
    setup_telemetry("sieve-registry", settings)
    start_metrics_server(settings.registry_metrics_addr)

    async def build_step(stores: Stores) -> Built:
        app = await build(settings, stores)
        REGISTRY.register(RegistryCollector(WorkerRecords(stores.redis, settings)))
        return Built(app.service)

    # listens at once (health NOT_SERVING) and serves once Redis answers (sieve/rpc/readiness.py)
    readiness = Readiness(settings, "sieve-registry", [SERVICE_NAME], build_step, redis=True, postgres=False)
    await readiness.run(settings.registry_addr)


def run() -> None:
    rpc.run_main(main)

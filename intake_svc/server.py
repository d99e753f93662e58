"""The intake process: `build` wires the servicer onto the shared server shape, `main` runs it until SIGTERM.

`python -m intake_svc` calls `run`.
"""

from __future__ import annotations

import grpc

from intake_svc.lexicon import LEXICON_SERVICE_NAME, LexiconServicer
from intake_svc.rejections import RejectionCounter
from intake_svc.servicer import IntakeServicer
from sieve import rpc
from sieve.db import Warm
from sieve.db.audit import AuditLog
from sieve.db.lexicon import LexiconStore
from sieve.db.tasks import INSERT_PARTS, TaskStore
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.redis.queue_store import QueueStore
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, lexicon_pb2_grpc

SERVICE_NAME = intake_pb2.DESCRIPTOR.services_by_name["IntakeService"].full_name
#: what the intake process serves: IntakeService and, for operators, LexiconService (intake_svc/lexicon.py)
SERVICE_NAMES = [SERVICE_NAME, LEXICON_SERVICE_NAME]


class IntakeApp:
    """The intake of one process: its `IntakeServicer` over the task rows (PostgreSQL) and the queues (Redis), the
    `LexiconServicer` over the lexicon table, and the `rpc.Service` that serves them with the refusal counter and the
    audit log of operator calls."""

    def __init__(self, settings: Settings, stores: Stores) -> None:
        tasks = TaskStore(stores.pool)
        self.servicer = IntakeServicer(tasks, QueueStore(stores.redis, settings), settings)
        self.lexicon = LexiconServicer(LexiconStore(stores.pool))
        self.service = rpc.Service(
            name="sieve-intake",
            service_names=SERVICE_NAMES,
            register=self._register,
            interceptors=[RejectionCounter()],
            audit=AuditLog(tasks.pool),
            before_stop=self._stop_watching,
            background=[self.servicer.watch.run],
        )

    async def _stop_watching(self) -> None:
        """WatchTask streams end first (UNAVAILABLE: resume elsewhere), so that they do not hold the stop."""
        self.servicer.watch.close()

    def _register(self, server: grpc.aio.Server) -> None:
        intake_pb2_grpc.add_IntakeServiceServicer_to_server(self.servicer, server)
        lexicon_pb2_grpc.add_LexiconServiceServicer_to_server(self.lexicon, server)


async def build(settings: Settings, stores: Stores) -> IntakeApp:
    """The intake on these stores (Redis and PostgreSQL)."""
    return IntakeApp(settings, stores)


async def main() -> None:
    settings = Settings.from_env()
    setup_logging("sieve-intake", settings.log_level)
    setup_telemetry("sieve-intake", settings)
    start_metrics_server(settings.intake_metrics_addr)

    async def build_step(stores: Stores) -> Built:
        app = await build(settings, stores)
        return Built(app.service)

    # listens at once (health NOT_SERVING) and serves once Redis and PostgreSQL answer (sieve/rpc/readiness.py)
    # the connections a large batch's record uses at once, its statement prepared on each (sieve/db/tasks.py)
    warm = Warm(INSERT_PARTS + 1, TaskStore.warm_connection)
    readiness = Readiness(settings, "sieve-intake", SERVICE_NAMES, build_step, redis=True, postgres=True, warm=warm)
    await readiness.run(settings.intake_addr)


def run() -> None:
    rpc.run_main(main)

"""Entry point of the scheduler service: `python -m scheduler_svc`.

Shutdown order: stop dispatching, give workers a moment to ack what they hold, put back the rest
(without counting the attempt), then end the streams with UNAVAILABLE so workers reconnect elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from redis.asyncio import Redis

from scheduler_svc.board import Board
from scheduler_svc.dead_letters import DeadLetters
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.housekeeping import Housekeeping
from scheduler_svc.metrics import SchedulerCollector
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.pull import SchedulerServicer
from scheduler_svc.rebuild import Rebuilder
from scheduler_svc.routing import Router
from scheduler_svc.watermark import Watermark
from sieve import rpc
from sieve.db.audit import AuditLog
from sieve.db.tasks import TaskStore
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import REGISTRY, start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.redis.queue_store import QueueStore
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("sieve.scheduler")
SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name


@dataclass
class Scheduler:
    """The parts of one scheduler replica, wired together."""

    queues: QueueStore
    board: Board
    dispatcher: Dispatcher
    housekeeping: Housekeeping
    servicer: SchedulerServicer
    settings: Settings

    async def drain(self) -> None:
        self.servicer.stop_accepting()
        self.dispatcher.stop()
        # workers finishing their batches ack them; wait for that, within half the grace period
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.board.all_acked(), timeout=self.settings.shutdown_grace_s / 2)
        for session in list(self.board.sessions):
            await self.servicer.end_session(session, "scheduler shutting down", count_attempt=False)


def build_scheduler(settings: Settings, redis: Redis, tasks: TaskStore) -> tuple[Scheduler, rpc.Service]:
    queues = QueueStore(redis, settings)
    board = Board()
    outcomes = Outcomes(tasks)
    records = WorkerRecords(redis, settings)
    watermark = Watermark(redis, queues, settings, records.live_count)
    dispatcher = Dispatcher(redis, queues, outcomes, board, Router(board, settings, redis), settings)
    servicer = SchedulerServicer(queues, board, outcomes, watermark, DeadLetters(queues, tasks), records)
    housekeeping = Housekeeping(queues, tasks, board, outcomes, watermark, dispatcher, records,
                                servicer.end_session, Rebuilder(queues, tasks))
    scheduler = Scheduler(queues, board, dispatcher, housekeeping, servicer, settings)
    service = rpc.Service(
        name="sieve-scheduler",
        service_names=[SERVICE_NAME],
        register=lambda server: scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server),
        before_stop=scheduler.drain,
        background=[dispatcher.run, dispatcher.listen_for_work, housekeeping.run],
        audit=AuditLog(tasks.pool),
    )
    return scheduler, service


async def main() -> None:
    settings = Settings.from_env()
    setup_logging("sieve-scheduler", settings.log_level)
    setup_telemetry("sieve-scheduler", settings)
    start_metrics_server(settings.scheduler_metrics_addr)

    async def build(stores: Stores) -> Built:
        scheduler, service = build_scheduler(settings, stores.redis, TaskStore(stores.pool))
        REGISTRY.register(SchedulerCollector(scheduler))
        # Redis must hold every unfinished task before anything is dispatched or accepted: the rebuild runs
        # before the first SERVING (and before the dispatcher starts), and again after Redis was away
        return Built(service, before_serving=scheduler.housekeeping.rebuilder.ensure)

    # listens at once (health NOT_SERVING) and serves once Redis and PostgreSQL answer (sieve/rpc/readiness.py)
    readiness = Readiness(settings, "sieve-scheduler", [SERVICE_NAME], build, redis=True, postgres=True)
    await readiness.run(settings.scheduler_addr)


def run() -> None:
    rpc.run_main(main)

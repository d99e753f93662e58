"""The scheduler process: `build` wires one replica (`SchedulerApp`) on its stores, `main` runs it until SIGTERM.

`python -m scheduler_svc` calls `run`. The orderly stop is `SchedulerApp.drain` (scheduler_svc/app.py).
"""

from __future__ import annotations

from scheduler_svc.app import SERVICE_NAME, SchedulerApp
from scheduler_svc.board import Board
from scheduler_svc.callbacks import CallbackNotifier
from scheduler_svc.console.build import ConsoleParts, build_console
from scheduler_svc.cost import CostMeter
from scheduler_svc.dead_letters import DeadLetters
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.housekeeping import Housekeeping, HousekeepingStores, ReplicaHooks
from scheduler_svc.lifecycle import Returns
from scheduler_svc.metrics import SchedulerCollector
from scheduler_svc.outcomes import Outcomes
from scheduler_svc.rebuild import Rebuilder
from scheduler_svc.routing import Router
from scheduler_svc.servicer import SchedulerServicer
from scheduler_svc.slot_pools import SlotPoolView
from scheduler_svc.streams import PullStreams
from scheduler_svc.watermark import Watermark
from sieve import rpc
from sieve.db.audit import AuditLog
from sieve.db.callbacks import CallbackStore
from sieve.db.external_jobs import ExternalJobStore
from sieve.db.tasks import TaskStore
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import REGISTRY, start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.redis.scheduler_state import SchedulerState
from sieve.redis.slot_pools import SlotPools
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings

__all__ = ["SERVICE_NAME", "SchedulerApp", "build", "main", "run"]


async def build(settings: Settings, stores: Stores) -> SchedulerApp:
    """One scheduler replica on these stores (Redis and PostgreSQL)."""
    redis, tasks = stores.redis, TaskStore(stores.pool)
    queues = QueueStore(redis, settings)
    state = SchedulerState(queues)
    records = WorkerRecords(redis, settings)
    outcomes = Outcomes(tasks)
    board = Board(signer=state.lease_signer(), lifecycle=outcomes.lifecycle)
    watermark = Watermark(state, queues, settings, records.live_count)
    router = Router(board, settings, state)
    dispatcher = Dispatcher(queues, state, outcomes, board, router, settings)
    streams = PullStreams(queues, board, outcomes, records, costs=CostMeter(settings))
    slot_pools = SlotPools(redis, Keys(settings.redis_prefix), settings.external.pools)
    pools = SlotPoolView(slot_pools, ExternalJobStore(stores.pool))
    dead_letters = DeadLetters(queues, tasks)
    servicer = SchedulerServicer(streams, board, watermark, dead_letters, pools)
    rebuilder = Rebuilder(queues, tasks)
    hooks = ReplicaHooks(
        replica=dispatcher.drain.replica,
        wake=dispatcher.wake.set,
        observe_workers=router.observe,
        end_session=streams.end_session,
        rebuild=rebuilder.ensure,
        publish_watermark=watermark.publish_record,
    )
    housekeeping = Housekeeping(
        HousekeepingStores(queues, state, tasks, records), board, Returns(queues, outcomes), hooks
    )
    collector = SchedulerCollector(
        board=board,
        dispatcher=dispatcher,
        streams=streams,
        housekeeping=housekeeping,
        outcomes=outcomes,
        state=state,
        queues=queues,
        tasks=tasks,
    )
    notifier = CallbackNotifier(CallbackStore(stores.pool), settings)
    console = None
    if settings.console_addr.strip():
        parts = ConsoleParts(
            state,
            queues,
            records,
            dead_letters,
            tasks,
            board,
            dispatcher,
            streams,
            slot_pools if slot_pools.maxima else None,
        )
        console = build_console(settings, parts)
    return SchedulerApp(
        settings,
        queues,
        board,
        dispatcher,
        housekeeping,
        servicer,
        streams,
        rebuilder,
        collector,
        AuditLog(tasks.pool),
        notifier,
        console,
    )


async def main() -> None:
    settings = Settings.from_env()
    setup_logging("sieve-scheduler", settings.log_level)
    setup_telemetry("sieve-scheduler", settings)
    start_metrics_server(settings.scheduler_metrics_addr)

    async def build_step(stores: Stores) -> Built:
        app = await build(settings, stores)
        REGISTRY.register(app.metrics)
        return Built(app.service, before_serving=app.before_serving)

    # listens at once (health NOT_SERVING) and serves once Redis and PostgreSQL answer (sieve/rpc/readiness.py)
    readiness = Readiness(settings, "sieve-scheduler", [SERVICE_NAME], build_step, redis=True, postgres=True)
    await readiness.run(settings.scheduler_addr)


def run() -> None:
    rpc.run_main(main)

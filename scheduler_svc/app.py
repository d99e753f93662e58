"""One scheduler replica, its parts wired together (`scheduler_svc.server.build` makes it).

Shutdown order (`SchedulerApp.drain`, the server's drain step): stop accepting streams and dispatching, give
workers a moment to ack what they hold, put back the rest (without counting the attempt), then end the streams
with UNAVAILABLE so workers reconnect elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from scheduler_svc.board import Board
from scheduler_svc.callbacks import CallbackNotifier
from scheduler_svc.console.server import Console
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.housekeeping import Housekeeping
from scheduler_svc.metrics import SchedulerCollector
from scheduler_svc.rebuild import Rebuilder
from scheduler_svc.servicer import SchedulerServicer
from scheduler_svc.streams import PullStreams
from sieve import rpc
from sieve.db.audit import AuditLog
from sieve.jobs import Jobs
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from sieve.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name


class SchedulerApp:
    """One scheduler replica: the `Board` of its workers' sessions, the `Dispatcher` that hands out work, the
    `SchedulerServicer` (the RPCs) and the `PullStreams` protocol, `Housekeeping` (the periodic tick), the
    `Rebuilder` that refills an empty Redis from PostgreSQL, the `CallbackNotifier` of completion callbacks, its
    `metrics`, and its web `console` when one is configured. `service` serves them (the dispatch
    loop, the wake-up listener and the replica's sign of life run as its background loops, housekeeping's chores as
    its periodic `jobs`), `before_serving` rebuilds Redis when it lost its memory, `drain` is the orderly stop (see
    the module)."""

    def __init__(
        self,
        settings: Settings,
        queues: QueueStore,
        board: Board,
        dispatcher: Dispatcher,
        housekeeping: Housekeeping,
        servicer: SchedulerServicer,
        streams: PullStreams,
        rebuilder: Rebuilder,
        metrics: SchedulerCollector,
        audit: AuditLog,
        notifier: CallbackNotifier,
        console: Console | None = None,
    ) -> None:
        self.settings = settings
        self.queues = queues
        self.board = board
        self.dispatcher = dispatcher
        self.housekeeping = housekeeping
        self.servicer = servicer
        self.streams = streams
        self.rebuilder = rebuilder
        #: completion callbacks from the outbox (scheduler_svc/callbacks.py)
        self.notifier = notifier
        #: the web console (scheduler_svc/console/), when SIEVE_CONSOLE_ADDR names an address
        self.console = console
        #: the replica's scrape-time metrics (registered by `main`: a process may build more than one replica)
        self.metrics = metrics
        #: the replica's periodic jobs (scheduler_svc/housekeeping.py), served by JobsService
        self.jobs = Jobs(replica=housekeeping.replica)
        housekeeping.register_jobs(self.jobs)
        self.service = rpc.Service(
            name="sieve-scheduler",
            service_names=[SERVICE_NAME],
            register=self._register,
            before_stop=self.drain,
            background=[
                dispatcher.run,
                dispatcher.listen_for_work,
                housekeeping.run,
                notifier.run,
                *([console.serve] if console is not None else []),
            ],
            audit=audit,
            jobs=self.jobs,
        )

    def _register(self, server: grpc.aio.Server) -> None:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(self.servicer, server)

    async def before_serving(self) -> bool:
        """Redis must hold every unfinished task before anything is dispatched or accepted: the rebuild runs
        before the first SERVING (and before the dispatcher starts), and again after Redis was away. True when
        this call rebuilt Redis."""
        return await self.rebuilder.ensure()

    async def drain(self) -> None:
        self.servicer.stop_accepting()
        self.dispatcher.stop()
        # workers finishing their batches ack them; wait for that, within half the grace period
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.board.all_acked(), timeout=self.settings.shutdown_grace_s / 2)
        for session in list(self.board.sessions):
            await self.streams.end_session(session, "scheduler shutting down", count_attempt=False)

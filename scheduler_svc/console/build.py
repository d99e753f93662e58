"""Wires a replica's console from its parts (`scheduler_svc.server.build` calls `build_console` when
SIEVE_CONSOLE_ADDR is set): the tally goes on the dispatcher's observer, the history counts the streams' acks."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.board import Board
from scheduler_svc.console.history import History, Totals
from scheduler_svc.console.server import Console
from scheduler_svc.console.tally import Tally
from scheduler_svc.console.views import Parts, Views
from scheduler_svc.dead_letters import DeadLetters
from scheduler_svc.dispatcher import Dispatcher
from scheduler_svc.streams import PullStreams
from sieve.db.tasks import TaskStore
from sieve.redis.queue_store import QueueStore
from sieve.redis.scheduler_state import SchedulerState
from sieve.redis.slot_pools import SlotPools
from sieve.redis.worker_records import WorkerRecords
from sieve.rpc.auth import load_authenticator
from sieve.settings import Settings


@dataclass(frozen=True, slots=True)
class ConsoleParts:
    """What of a replica the console reads."""

    state: SchedulerState
    queues: QueueStore
    records: WorkerRecords
    dead_letters: DeadLetters
    tasks: TaskStore
    board: Board
    dispatcher: Dispatcher
    streams: PullStreams
    #: the installation's slot pools (external providers); None when it configures none
    pools: SlotPools | None = None


def build_console(settings: Settings, parts: ConsoleParts) -> Console:
    """The console of one replica, on `settings.console_addr`, with the services' credentials."""
    tally = Tally()
    parts.dispatcher.observer.tally = tally
    streams, board, state = parts.streams, parts.board, parts.state

    async def totals() -> Totals:
        gauges = await state.gauges()
        return Totals(pending=gauges.pending, leased=gauges.leased)

    history = History(tally, acked=lambda: streams.acked, weight_of=settings.weight_of, totals=totals)
    views = Views(
        Parts(
            state=state,
            queues=parts.queues,
            records=parts.records,
            dead_letters=parts.dead_letters,
            tasks=parts.tasks,
            history=history,
            weight_of=settings.weight_of,
            connected_workers=lambda: len(board.sessions),
            acked=lambda: streams.acked,
            replica=parts.dispatcher.drain.replica,
            pools=parts.pools,
        )
    )
    authenticator = load_authenticator(settings.auth_tokens, settings.auth_tokens_file)
    return Console(
        views, history, authenticator, allow_anonymous=settings.allow_anonymous, address=settings.console_addr
    )


__all__ = ["ConsoleParts", "build_console"]

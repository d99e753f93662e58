"""Which workers may run a task type, and what happens when none can.

OCR goes to GPU workers first. When no GPU worker is alive, what happens depends on whether GPU workers are
*expected*: a GPU worker that takes OCR was alive within `gpu_expected_s` (seen by any scheduler replica:
`SchedulerState.mark_gpu_expected` sets a key with that TTL while one is alive).

- GPU workers expected (they are only gone for now): the `no_gpu_strategy` setting decides — `defer` (the
  device's OCR tasks wait, with exponential delays, and are dead-lettered after max_attempts defers), `cpu`
  (CPU workers that take OCR run it) or `dead_letter`.
- No GPU worker seen recently (a fleet without GPUs, or one whose GPUs have been gone longer than the window):
  CPU workers that take OCR run it, as the ordinary route. With no CPU worker taking OCR either, nobody can run
  it, and the strategy decides as above.

Other types go to any worker that takes them. A type nobody can run waits on its own (`Action.DEFER`:
`QueueStore.defer_types`): the device's other types keep flowing. A type whose workers are only full for the
moment (`Action.WAIT`) keeps its place in the device's queue.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from scheduler_svc.sessions import Session
from sieve.enums import enum_name
from sieve.redis.worker_records import WorkerRecord
from sieve.settings import Settings
from sieve.v1 import types_pb2

OCR = types_pb2.TASK_TYPE_OCR_IMAGE
ALL_TYPES = (types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE, types_pb2.TASK_TYPE_EXTERNAL)


class Action(Enum):
    """What happens to a task no eligible worker has room for."""

    WAIT = "wait"  # eligible workers exist but are full: back to the queue, no penalty
    DEFER = "defer"  # nobody can run it now: it waits (exponential delay), the device's other types do not
    DEAD_LETTER = "dead_letter"  # given up on at once (strategy dead_letter)


class Connected(Protocol):
    """The sessions of this replica (`scheduler_svc.board.Board`)."""

    @property
    def sessions(self) -> Collection[Session]: ...

    def takers(self, task_type: int) -> list[Session]: ...


class GpuSightings(Protocol):
    """Where every replica records that it saw a GPU worker that takes OCR, for `gpu_expected_s`
    (`sieve.redis.scheduler_state.SchedulerState`)."""

    async def mark_gpu_expected(self, window_ms: int) -> None: ...

    async def gpu_expected(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Route:
    """Where a task type goes now: the sessions that may run it and what happens when none has room."""

    #: sessions that may run the task, best first
    sessions: list[Session]
    #: what to do when none of them has a credit
    otherwise: Action
    #: why, for the task's history ("" when routing is the ordinary one)
    reason: str = ""


class Router:
    """Routes task types to sessions; knows (from the registry, through housekeeping) whether a GPU worker is
    alive somewhere and whether GPU workers are expected at all. Without `sightings` (shared by the replicas) it
    remembers its own: GPU workers are expected once one was seen."""

    def __init__(self, board: Connected, settings: Settings, sightings: GpuSightings | None = None) -> None:
        self.board = board
        self.settings = settings
        self.strategy = settings.no_gpu_strategy
        self._sightings = sightings
        #: a GPU worker that takes OCR is alive somewhere (registry), maybe connected to another replica
        self.gpu_alive_elsewhere = False
        #: a GPU worker that takes OCR was alive within gpu_expected_s (the no-GPU strategy applies)
        self.gpu_expected = False
        self._gpu_routed = False  # a GPU session was routed to since the last observe()

    def _gpu_connected(self) -> bool:
        return any(s.gpu and OCR in s.task_types and not s.closed for s in self.board.sessions)

    async def observe(self, records: Iterable[WorkerRecord]) -> None:
        """Takes in the registry's live workers: whether a GPU worker is alive, and whether one was recently
        (shared by every replica: a key that lives gpu_expected_s after the last sighting)."""
        alive = any(r.gpu_available and r.takes(OCR) for r in records)
        self.gpu_alive_elsewhere = alive
        window_ms = int(self.settings.gpu_expected_s * 1000)
        seen = alive or self._gpu_connected() or self._gpu_routed
        self._gpu_routed = False
        if window_ms <= 0:
            self.gpu_expected = False
        elif self._sightings is None:
            self.gpu_expected = seen or self.gpu_expected
        elif seen:
            await self._sightings.mark_gpu_expected(window_ms)
            self.gpu_expected = True
        else:
            self.gpu_expected = await self._sightings.gpu_expected()

    def route(self, task_type: int) -> Route:
        takers = sorted(self.board.takers(task_type), key=lambda s: -s.credits)
        name = enum_name(types_pb2.TaskType, task_type)
        if task_type != OCR:
            if takers:
                return Route(takers, Action.WAIT)
            return Route([], Action.DEFER, f"no live worker takes {name}")
        gpus = [s for s in takers if s.gpu]
        if gpus:
            self._gpu_routed = self.gpu_expected = True
            return Route(gpus, Action.WAIT)
        if self.gpu_alive_elsewhere:
            return Route(gpus, Action.WAIT)
        cpus = [s for s in takers if not s.gpu]
        if cpus and not self.gpu_expected:  # a fleet without GPUs: CPU workers run OCR, nothing to note
            return Route(cpus, Action.WAIT)
        if self.strategy == "cpu":
            if cpus:
                return Route(cpus, Action.WAIT, "no GPU worker alive: routed to a CPU worker (strategy cpu)")
            return Route([], Action.DEFER, "no GPU worker alive and no CPU worker takes OCR_IMAGE")
        if self.strategy == "dead_letter":
            return Route([], Action.DEAD_LETTER, "no GPU worker alive (strategy dead_letter)")
        return Route([], Action.DEFER, "no GPU worker alive (strategy defer)")

    def allowed_types(self) -> list[int]:
        """Types some eligible worker has a credit for now (popping stops before any other type)."""
        return [t for t in ALL_TYPES if any(s.credits > 0 for s in self.route(t).sessions)]

    def budgets(self) -> dict[int, int]:
        """For each type some eligible worker has a credit for, the credits of its eligible workers: the most
        tasks of that type a claim should take (the types are those of `allowed_types`)."""
        out: dict[int, int] = {}
        for t in ALL_TYPES:
            credits = sum(max(0, s.credits) for s in self.route(t).sessions if not s.closed)
            if credits > 0:
                out[t] = credits
        return out

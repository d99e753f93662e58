"""Which workers may run a task type (seed 4.3 and 5.2 ③): OCR goes to GPU workers first; when no GPU
worker is alive, the `no_gpu_strategy` setting decides: `defer` (the device backs off and resumes later),
`cpu` (CPU workers that take OCR run it) or `dead_letter`. Other types go to any worker that takes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from scheduler_svc.board import Board, Session
from sieve.settings import Settings
from sieve.v1 import types_pb2

OCR = types_pb2.TASK_TYPE_OCR_IMAGE
ALL_TYPES = (types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE)


class Action(Enum):
    """What happens to a task no eligible worker has room for."""

    WAIT = "wait"  # eligible workers exist but are full: back to the queue, no penalty
    DEFER = "defer"  # nobody can run it: the device backs off exponentially
    DEAD_LETTER = "dead_letter"  # given up on at once (strategy dead_letter)


@dataclass(frozen=True, slots=True)
class Route:
    #: sessions that may run the task, best first
    sessions: list[Session]
    #: what to do when none of them has a credit
    otherwise: Action
    #: why, for the task's history ("" when routing is the ordinary one)
    reason: str = ""


class Router:
    def __init__(self, board: Board, settings: Settings) -> None:
        self.board = board
        self.strategy = settings.no_gpu_strategy
        #: a GPU worker that takes OCR is alive somewhere (registry), maybe connected to another replica
        self.gpu_alive_elsewhere = False

    def route(self, task_type: int) -> Route:
        takers = sorted(self.board.takers(task_type), key=lambda s: -s.credits)
        name = types_pb2.TaskType.Name(task_type).removeprefix("TASK_TYPE_")
        if task_type != OCR:
            if takers:
                return Route(takers, Action.WAIT)
            return Route([], Action.DEFER, f"no live worker takes {name}")
        gpus = [s for s in takers if s.gpu]
        if gpus or self.gpu_alive_elsewhere:
            return Route(gpus, Action.WAIT)
        if self.strategy == "cpu":
            cpus = [s for s in takers if not s.gpu]
            if cpus:
                return Route(cpus, Action.WAIT, "no GPU worker alive: routed to a CPU worker (strategy cpu)")
            return Route([], Action.DEFER, "no GPU worker alive and no CPU worker takes OCR_IMAGE")
        if self.strategy == "dead_letter":
            return Route([], Action.DEAD_LETTER, "no GPU worker alive (strategy dead_letter)")
        return Route([], Action.DEFER, "no GPU worker alive (strategy defer)")

    def allowed_types(self) -> list[int]:
        """Types some eligible worker has a credit for now (popping stops before any other type)."""
        return [t for t in ALL_TYPES if any(s.credits > 0 for s in self.route(t).sessions)]

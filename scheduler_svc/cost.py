"""Fair by cost: what each device's tasks cost the worker pool, so that devices share worker time, not hand-outs.

The fair order counts hand-outs: each serve restarts a device's wait. For the task types of `fair_by_cost_types`
(OCR by default) that is not enough: a device sending 4 000 x 3 000 px images would get as many hand-outs as one
sending thumbnails, and ten times the worker time. Each ack says how long its task took the worker
(`Ack.worker_time_ms`); `CostMeter` keeps, per such type, how many of its tasks run at once (the workers' busy
time per unit of real time) and turns each ack into the device's wall-clock cost per task,

    wall = worker time / tasks running at once      (ms)

— how long the worker pool is kept busy by one of its tasks — times how many devices share the pool,

    charge = wall x sharing       sharing = (sum of the devices' busy time)^2 / sum of its squares

(the effective number of devices using the pool over the last few seconds, older windows counting less: k for
k devices with equal shares, about 1 when one device has it nearly to itself). The charges are compared with
real time (a device's wait starts at its last serve, or at its oldest task's enqueue), so they must advance at
real time's pace: the charges of all tasks sum to real time (wall is worker time over tasks at once), a device
with a fair share 1/k of the pool sees 1/k of that, and k x its share makes its own charges keep pace with real
time. Without the factor every backlogged device fell behind real time by (1 - 1/k) per second, reached the lag
floor within seconds, and from then on each serve restarted its wait like a count: the expensive device got
two thirds of the pool.

The device's meta keeps the charge, smoothed (noteCost), and from then on the device is served by start-time
fair queueing (chargeServe): a serve that takes n tasks moves the start of its next wait from where the last one
put it by n x charge, instead of restarting it, so backlogged devices get equal worker time (over their weights)
whatever their tasks cost. This is the virtual-time accounting of start-time fair queueing, with the cost learnt
from the device's own acked tasks (like the virtual token counter of LLM serving). Three things keep it close:

- what a device took before its cost was known (its first serves went out by count) is charged once its acks
  bring the cost (a debt added at its next serve), so a first batch of dear tasks is not a head start kept;
- a serve takes about one second of charges at most (costQuantum, at least one task): a batch of ten dear
  tasks would keep the pool for ten of them at a time;
- the worker time an ack reports is the work stages of the task only (worker_svc.runner.worker_time_ms): not its
  wait for an engine, which behind a dear task is the dear task's time.

The lag is bounded: a device that fell behind keeps at most 10 s of credit, a serve moves it at most 30 s ahead,
one task counts at most `MAX_WALL_MS` of wall time, and its wait never starts before its oldest task's enqueue
(a device back from a quiet time has no credit for it).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from sieve.settings import Settings

#: weight of a new window's tasks running at once
PARALLEL_SMOOTHING = 0.3
#: the busy time of acked tasks is turned into tasks running at once over windows at least this long (s)
PARALLEL_WINDOW_S = 1.0
#: each window, the devices' busy time so far counts this much less in how many share the pool (a horizon of a few
#: windows: one window holds too few of the dearest tasks to tell how the pool is shared)
SHARING_DECAY = 0.8
#: a device whose share of that busy time fell under this is forgotten
FORGET_BELOW = 0.001
#: tasks running at once are taken as at least this many (a quiet time says little)
MIN_PARALLEL = 0.5
#: most one task counts (ms): a single huge task does not lock its device out for long
MAX_WALL_MS = 10_000.0


class CostMeter:
    """Owns how many tasks of each cost-fair type run at once (this replica's view) and turns acked tasks' worker
    times into each device's wall-clock cost per task (see the module)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.types = settings.cost_fair_types
        self._clock = clock
        #: task type -> how many of its tasks run at once, about (busy ms per ms)
        self.parallel: dict[int, float] = {}
        #: task type -> the effective number of devices sharing its pool (see the module)
        self.sharing: dict[int, float] = {}
        self._busy_ms: dict[int, float] = defaultdict(float)
        self._device_busy_ms: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._window_start = clock()

    def charges(self, costs: Iterable[tuple[str, int, float]]) -> dict[str, float]:
        """The wall-clock cost per task (device -> ms, the mean over its tasks here) of acked tasks given as
        (device, task type, worker time ms); tasks of other types, or without a worker time, say nothing."""
        costs = [(d, t, ms) for d, t, ms in costs if t in self.types and ms > 0]
        if not costs:
            return {}
        for device, task_type, worker_ms in costs:
            self._busy_ms[task_type] += worker_ms
            self._device_busy_ms[task_type][device] += worker_ms
        self._measure_parallel()
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for device, task_type, worker_ms in costs:
            running = max(MIN_PARALLEL, self.parallel.get(task_type, 1.0))
            total[device] += min(MAX_WALL_MS, worker_ms / running) * self.sharing.get(task_type, 1.0)
            count[device] += 1
        return {device: total[device] / count[device] for device in total}

    def _measure_parallel(self) -> None:
        now = self._clock()
        elapsed_ms = (now - self._window_start) * 1000
        if elapsed_ms < PARALLEL_WINDOW_S * 1000:
            return
        for task_type, busy in self._busy_ms.items():
            self.parallel[task_type] = _smoothed(self.parallel.get(task_type), busy / elapsed_ms)
        for task_type, by_device in self._device_busy_ms.items():
            total = sum(by_device.values())
            squares = sum(ms * ms for ms in by_device.values())
            if squares > 0:
                self.sharing[task_type] = max(1.0, total * total / squares)
            for device, ms in list(by_device.items()):  # older windows count less, and end by being forgotten
                by_device[device] = ms * SHARING_DECAY
                if by_device[device] < total * FORGET_BELOW:
                    del by_device[device]
        self._busy_ms.clear()
        self._window_start = now


def _smoothed(before: float | None, sample: float) -> float:
    return sample if before is None else before + PARALLEL_SMOOTHING * (sample - before)

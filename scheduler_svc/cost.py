"""Fair by cost: what each device is charged, beyond its share of hand-outs, for what its tasks cost.

The fair order counts hand-outs: a claim round's clock runs on by about the workers' time per task for each
task taken (`Dispatcher`), so a device that takes a task waits about that much longer for its next turn. For the
task types of `fair_by_cost_types` (OCR by default) that is not enough: a device sending 4 000 x 3 000 px images
would get as many hand-outs as one sending thumbnails, and ten times the worker time. Each ack says how long its
task took the worker (`Ack.worker_time_ms`); `CostMeter` keeps the average of each such type and charges the
device

    ms_per_task x (worker_time / average - 1)

— as if its last service had ended that much later (or earlier, for a cheaper task): the round's clock charged
it one average task, the ack corrects that to what the task really cost, in the same unit. This is start-time
fair queueing with the cost measured after the fact, like the virtual token counter of LLM serving. The lag is
bounded: one task is charged at most `MAX_CHARGE_MS`, a credit never makes a task worth less than nothing, and
a device's wait never starts before its oldest task's enqueue (chargeDevice), so no device can bank credit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sieve.settings import Settings

#: weight of a new sample in a type's average cost
SMOOTHING = 0.05
#: most one task is charged beyond its hand-out (ms): a single huge task does not lock its device out for long
MAX_CHARGE_MS = 2000.0


class CostMeter:
    """Owns the average cost of each cost-fair task type (this replica's view) and turns acked tasks' worker
    times into per-device charges (see the module)."""

    def __init__(self, settings: Settings) -> None:
        self.types = settings.cost_fair_types
        #: task type -> average worker time of its tasks (ms)
        self.average_ms: dict[int, float] = {}

    def charges(self, costs: Iterable[tuple[str, int, float]], ms_per_task: float) -> dict[str, float]:
        """Charges (device -> ms) for acked tasks given as (device, task type, worker time ms); tasks of other
        types, or without a worker time, are charged nothing beyond their hand-out."""
        out: dict[str, float] = defaultdict(float)
        for device, task_type, worker_ms in costs:
            if task_type not in self.types or worker_ms <= 0:
                continue
            average = self.average_ms.get(task_type, worker_ms)  # the average before this task (a first is one)
            self.average_ms[task_type] = average + SMOOTHING * (worker_ms - average)
            charge = ms_per_task * (worker_ms / average - 1)
            out[device] += min(MAX_CHARGE_MS, max(-ms_per_task, charge))
        return dict(out)

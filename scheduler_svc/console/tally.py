"""What the dispatch loop claimed since the console's last sample: tasks per device and their queue waits.

`DispatchObserver.claimed` (scheduler_svc/tracing.py) calls `Tally.claimed` when a console runs; `History`
takes the counts once a second (`take`). Without a console no tally is attached and nothing is counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: queue waits kept per sample at most (a busy second keeps its first ones: enough for percentiles)
MAX_WAITS = 20_000


@dataclass(slots=True)
class Taken:
    """One sample's counts: tasks claimed per device, and their queue waits (ms)."""

    per_device: Counter[str] = field(default_factory=Counter)
    waits_ms: list[float] = field(default_factory=list)


class Tally:
    """Counts claims until `take` hands them over (one event loop: no lock)."""

    def __init__(self) -> None:
        self._now = Taken()

    def claimed(self, device: str, waits_ms: list[float]) -> None:
        self._now.per_device[device] += len(waits_ms)
        room = MAX_WAITS - len(self._now.waits_ms)
        if room > 0:
            self._now.waits_ms.extend(waits_ms[:room])

    def take(self) -> Taken:
        taken, self._now = self._now, Taken()
        return taken


__all__ = ["MAX_WAITS", "Taken", "Tally"]

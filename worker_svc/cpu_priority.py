"""A worker's CPU priority. Detection is batch work that can use every core it is given, while a task's way in
and out (the intake's record, the scheduler's hand-out and group commit, Redis and PostgreSQL) is short work on
which every waiting device depends. Where they share a host, a worker therefore runs below them
(SIEVE_WORKER_NICE, default 10): it still gets every cycle they leave idle, but does not make a small device's
submit wait behind a busy engine. On separate hosts (one pod per service) the value changes nothing.
"""

from __future__ import annotations

import os


def lower_cpu_priority(nice: int) -> int:
    """Raises the nice value of every thread of this process (Linux keeps it per thread; threads started later
    inherit it) to at least `nice`, never lowering one; returns the main thread's value afterwards. 0 leaves them
    as they are."""
    if nice <= 0:
        return os.getpriority(os.PRIO_PROCESS, 0)
    for tid in _threads():
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return os.getpriority(os.PRIO_PROCESS, 0)


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc (not Linux): the process's priority is the one value there is
        return [0]

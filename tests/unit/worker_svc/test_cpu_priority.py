"""A worker's CPU priority (worker_svc/cpu_priority.py): every thread of the process, those started before and
after, runs at the nice value asked for, and a value is never lowered. Each case runs in a child process of its
own, since a process cannot take a raised nice value back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sieve.settings import Settings, SettingsError

CHILD = """
import json, os, sys, threading
from worker_svc.cpu_priority import lower_cpu_priority

def nice_of_every_thread():
    return sorted(os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task"))

if int(sys.argv[2]) > os.getpriority(os.PRIO_PROCESS, 0):  # as started
    os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[2]))
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()  # a thread that is already running
main = lower_cpu_priority(int(sys.argv[1]))
after = threading.Thread(target=stop.wait); after.start()    # one started afterwards
print(json.dumps({"main": main, "threads": nice_of_every_thread()}))
stop.set()
"""


def _run(nice: int, started_at: int = 0) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(nice), str(started_at)], capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout))


def test_every_thread_before_and_after_runs_at_the_nice_value_asked_for() -> None:
    assert _run(10) == {"main": 10, "threads": [10, 10, 10]}


def test_a_process_started_nicer_than_asked_is_left_as_it_is() -> None:
    assert _run(5, started_at=15) == {"main": 15, "threads": [15, 15, 15]}


def test_zero_leaves_the_priority_alone() -> None:
    assert _run(0) == {"main": 0, "threads": [0, 0, 0]}


def test_a_worker_runs_below_the_platform_by_default() -> None:
    assert Settings.from_env({}).worker_nice == 10


@pytest.mark.parametrize("raw", ["-1", "20"])
def test_a_nice_value_outside_0_to_19_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match="SIEVE_WORKER_NICE"):
        Settings.from_env({"SIEVE_WORKER_NICE": raw})

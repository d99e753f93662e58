"""A process that burns one core for a bounded time, started so that it is *not* a descendant of the caller
(a launcher starts it in a new session and exits; the burner is re-parented away): to a worker running in
the calling process it is someone else's load, not its own process tree."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

_BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
_LAUNCH = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-c', {burn!r}], start_new_session=True,\n"
    "                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(p.pid)\n"
)


def launcher_code(seconds: float) -> str:
    """Python code that starts a detached burner of `seconds` and prints its pid."""
    return _LAUNCH.format(burn=_BURN.format(seconds=seconds))


def start_detached_burner(seconds: float = 30.0) -> int:
    """Starts a detached process that burns one core for at most `seconds`; returns its pid."""
    done = subprocess.run(
        [sys.executable, "-c", launcher_code(seconds)], capture_output=True, text=True, check=True, timeout=30
    )
    return int(done.stdout.strip())


def stop_burner(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)

"""Celery side by side: the throughput workload of `bench_throughput` (the same number of text tasks over the
same number of devices) through Celery 5 with the local Redis as broker.

    .venv/bin/python -m tests.benchmarks.bench_celery [--tasks 20000] [--devices 200] [--chunk 200]

Celery is not a dependency of Sieve: the benchmark makes its own virtualenv (`python -m venv`, default
~/.cache/sieve-bench/celery-venv, SIEVE_BENCH_CELERY_VENV moves it; reused when it already imports celery) and
pip installs `celery[redis]==5.*` into it. It writes a tiny Celery app into a temporary folder: one no-op task
(its only work is one INCR of a counter, so that the clock can stop at the last task), no result backend (Celery
keeps nothing durable: a task lives in a Redis list until a worker's prefork child has taken it), every key under
a fresh prefix (kombu's `global_keyprefix`) and a queue of its own, so nothing meets Sieve's keys or another run.
It starts the worker itself (`celery worker --pool=prefork --concurrency=2`, as many processes as Sieve's two
workers), waits for it to be ready, enqueues one untimed warm-up round of 200 tasks, then the tasks with group
enqueue in chunks (`group(...).apply_async()`, as SubmitBatch takes chunks), and stops the clock when the counter
reaches the count; then it stops the worker (SIGTERM, SIGKILL after 20 s) and deletes its keys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from tests.support.redis import delete_matching
from tests.support.stores import REDIS_URL

REQUIREMENT = "celery[redis]==5.*"
VENV = Path(os.environ.get("SIEVE_BENCH_CELERY_VENV", Path.home() / ".cache" / "sieve-bench" / "celery-venv"))
PROCESSES = 2

APP = '''
"""The Celery side of Sieve's throughput benchmark (written by tests/benchmarks/bench_celery.py)."""
import os

import redis
from celery import Celery
from celery.signals import worker_ready

BROKER = os.environ["BENCH_BROKER_URL"]
PREFIX = os.environ["BENCH_PREFIX"]
QUEUE = PREFIX + "queue"
app = Celery("sieve_bench", broker=BROKER)
app.conf.update(broker_transport_options={"global_keyprefix": PREFIX}, task_default_queue=QUEUE,
                task_ignore_result=True, worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
_counter = None


def counter():
    global _counter
    if _counter is None:
        _counter = redis.Redis.from_url(BROKER)
    return _counter


@app.task(name="sieve_bench.noop", ignore_result=True)
def noop(device, text):
    counter().incr(PREFIX + "done")


@worker_ready.connect
def ready(**_):
    redis.Redis.from_url(BROKER).set(PREFIX + "ready", 1)
'''

DRIVER = '''
"""Enqueues the benchmark's tasks and times them (written by tests/benchmarks/bench_celery.py)."""
import json
import random
import sys
import time

import celery
import redis
from celery import group

from sieve_bench_app import BROKER, PREFIX, noop

tasks, devices, chunk, timeout_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
r = redis.Redis.from_url(BROKER)
deadline = time.time() + 120
while not r.get(PREFIX + "ready"):
    if time.time() > deadline:
        sys.exit("the Celery worker was not ready in 120 s")
    time.sleep(0.05)


def run(n):
    r.delete(PREFIX + "done")
    rng = random.Random(1)
    sigs = [noop.s(f"30:00:00:00:{d // 256:02x}:{d % 256:02x}", f"task {i}")
            for i, d in enumerate(rng.randrange(devices) for _ in range(n))]
    t0 = time.perf_counter()
    for i in range(0, n, chunk):
        group(sigs[i : i + chunk]).apply_async()
    enqueued = time.perf_counter() - t0
    end = time.perf_counter() + timeout_s
    while int(r.get(PREFIX + "done") or 0) < n:
        if time.perf_counter() > end:
            sys.exit(f"{int(r.get(PREFIX + 'done') or 0)} of {n} Celery tasks done after {timeout_s:.0f} s")
        time.sleep(0.002)
    return enqueued, time.perf_counter() - t0


run(min(200, tasks))  # warm-up: connections, prefork children
enqueued, total = run(tasks)
print(json.dumps({"tasks": tasks, "enqueue_s": enqueued, "seconds": total, "celery": celery.__version__}))
'''


@dataclass
class CeleryRun:
    """Celery's side: `rate` from the first enqueue to the last task done; `error` when it could not run."""

    tasks: int
    devices: int
    rate: float = 0.0
    enqueue_rate: float = 0.0
    seconds: float = 0.0
    version: str = ""
    error: str = ""


def ensure_venv(venv: Path = VENV) -> Path:
    """The virtualenv's python, with celery[redis] installed (made on first use). Raises RuntimeError saying
    what failed (no network for pip, no venv module)."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import celery, redis"], capture_output=True).returncode == 0:
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True)
    if made.returncode:
        raise RuntimeError(f"python -m venv {venv} failed: {made.stderr.strip()[-300:]}")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", REQUIREMENT], capture_output=True, text=True, timeout=900
    )
    if pip.returncode:
        raise RuntimeError(f"pip install {REQUIREMENT} failed: {(pip.stderr or pip.stdout).strip()[-300:]}")
    return python


def run_celery(tasks: int, devices: int, chunk: int, timeout_s: float) -> CeleryRun:
    """Installs (if needed), starts the worker, runs the driver, stops the worker (blocking: run in a thread)."""
    out = CeleryRun(tasks, devices)
    try:
        python = ensure_venv()
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        out.error = f"Celery not installed: {exc}"
        return out
    prefix = f"sieve-bench-celery-{uuid.uuid4().hex[:8]}:"
    with tempfile.TemporaryDirectory(prefix="sieve-bench-celery-") as folder:
        app_dir = Path(folder)
        (app_dir / "sieve_bench_app.py").write_text(textwrap.dedent(APP))
        (app_dir / "sieve_bench_driver.py").write_text(textwrap.dedent(DRIVER))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIEVE_", "PYTHON"))}
        env.update(BENCH_BROKER_URL=REDIS_URL, BENCH_PREFIX=prefix)
        log = (app_dir / "worker.log").open("wb")
        worker = subprocess.Popen(
            [
                str(python),
                "-m",
                "celery",
                "-A",
                "sieve_bench_app",
                "worker",
                "--pool=prefork",
                f"--concurrency={PROCESSES}",
                "--loglevel=WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-Q",
                prefix + "queue",
            ],
            cwd=app_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            driver = subprocess.run(
                [str(python), "sieve_bench_driver.py", str(tasks), str(devices), str(chunk), str(timeout_s)],
                cwd=app_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s + 180,
            )
            if driver.returncode:
                tail = (app_dir / "worker.log").read_text(errors="replace")[-500:]
                out.error = f"Celery run failed: {(driver.stderr or driver.stdout).strip()[-400:]} {tail}"
            else:
                result = json.loads(driver.stdout.strip().splitlines()[-1])
                out.seconds, out.version = result["seconds"], result["celery"]
                out.rate, out.enqueue_rate = tasks / result["seconds"], tasks / result["enqueue_s"]
        except subprocess.TimeoutExpired:
            out.error = "Celery run timed out"
        finally:
            stop(worker)
            log.close()
    asyncio.run(delete_keys(prefix))
    return out


def stop(worker: subprocess.Popen[bytes]) -> None:
    """Warm shutdown, then its whole session (the prefork children) killed if it has not exited in 20 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


async def delete_keys(prefix: str) -> None:
    redis = Redis.from_url(REDIS_URL)
    try:
        await delete_matching(redis, prefix + "*")  # Celery's own keys (its broker prefix), not Sieve's
    finally:
        await redis.aclose()


async def measure(tasks: int = 20000, devices: int = 200, chunk: int = 200, timeout_s: float = 600) -> CeleryRun:
    began = time.perf_counter()
    run = await asyncio.to_thread(run_celery, tasks, devices, chunk, timeout_s)
    if run.error:
        run.error += f" (after {time.perf_counter() - began:.0f}s)"
    return run


def describe(run: CeleryRun) -> str:
    if run.error:
        return f"Celery: {run.error}"
    return (
        f"Celery {run.version} + Redis, prefork x{PROCESSES}, no-op task, no result backend: {run.tasks} tasks "
        f"over {run.devices} devices enqueued at {run.enqueue_rate:.0f}/s, all done in {run.seconds:.2f}s -> "
        f"{run.rate:.0f} tasks/s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=200, help="tasks per group enqueue")
    args = parser.parse_args()
    result = asyncio.run(measure(args.tasks, args.devices, args.chunk))
    print(describe(result))
    sys.exit(1 if result.error else 0)

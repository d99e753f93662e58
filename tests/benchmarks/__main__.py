"""Benchmarks that decide: runs the selected benchmarks, prints one row per target (what was measured, both
sides of each ratio, the target, pass or MISSED), writes the same as JSON, and exits 1 when a target is missed.

    .venv/bin/python -m tests.benchmarks [--only throughput,celery,...] [--smoke] [--json bench-report.json]
                                         [--skip-celery]

Benchmarks (in this order; each starts every service it needs as a process, with credentials, and removes its
Redis keys and schema afterwards):

    throughput  text tasks end to end, every task durable (20 000 tasks over 200 devices, 2 workers): context
    celery      the same workload through Celery 5 + Redis (prefork x2, own virtualenv, worker started and
                stopped by the benchmark), in 3 rounds alternating with Sieve runs: the median of the rounds'
                Sieve / Celery >= 5 x (implies throughput: both in the same run)
    scale       50 000 devices x 1 task vs 100 devices x 500 tasks, end to end, same work, 3 alternating pairs:
                the median of the pairs' ratios >= 0.8
    noisy       small devices' queued->first hand-out p99 behind one device's 20 000 tasks, real workers: <= 0.1 s
    equal       Jain's index per 1 s window, 50 backlogged devices: >= 0.99
    weights     shares of devices of weights 3:2:1: each within +-5 % of its own target
    callers     a caller with 1 000 devices vs a caller with 1, both backlogged: 50 % +- 5 points each
    cost        worker-time shares of two devices whose OCR tasks differ ~10x in cost: within +-10 %
    ocr         OCR through Sieve vs the raw engine: >= 0.9
    ocr_quality CER per condition per engine on the hard OCR set (200 generated images), images/s on CPU: turned and
                vertical text within 3 points of upright; the default engine is the one the table picks
    obedient    a client honouring every retry_after, default limits vs raised: >= 0.8
    notify      WatchTask change -> client p50 <= 50 ms, and callback final -> receiver (p50 / p99, context)
    external    slot utilisation of external jobs with a backlog (busy / available slot-seconds) and polls per
                job, the default 10 s tick (context) and a 1 s one: >= 0.9 (intake, scheduler, engine in-process,
                a provider on loopback)
    detection   text matching on the evaluation corpus (tests/data/detection/), in this process, no services:
                recall on disguised words >= 0.95, false positives on ordinary text <= 0.5 %, per-kind table;
                matching speed within 2 x of the matcher before the disguise rules
    claims      (only when asked for) the queue store's claim rate, 10 vs 100 000 devices: context

--smoke runs every benchmark at small sizes: it shows the whole path works, not the numbers (the CI smoke test,
tests/benchmarks/test_smoke.py, asserts only what does not depend on timing). A benchmark that fails to run
(an exception, a timeout) gets a row saying why, counted as missed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.benchmarks import (
    bench_celery,
    bench_cost,
    bench_detection,
    bench_external,
    bench_fairness,
    bench_notify,
    bench_obedient,
    bench_ocr,
    bench_ocr_quality,
    bench_scale,
    bench_throughput,
)
from tests.benchmarks.report import Report, Row, failed_row, num
from tests.benchmarks.sizes import FULL, SMOKE, Sizes

CELERY_TARGET = 5.0
DEFAULT = (
    "throughput",
    "celery",
    "scale",
    "noisy",
    "equal",
    "weights",
    "callers",
    "cost",
    "ocr",
    "ocr_quality",
    "obedient",
    "notify",
    "external",
    "detection",
)
ALL = (*DEFAULT, "claims")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Runner:
    """Runs the selected benchmarks in order and collects their rows; a benchmark that raises gets a row saying
    so (missed) and the others still run."""

    def __init__(self, sizes: Sizes, skip_celery: bool) -> None:
        self.sizes = sizes
        self.skip_celery = skip_celery
        self.throughput: bench_throughput.Throughput | None = None

    async def run(self, name: str) -> list[Row]:
        bench: Callable[[], Awaitable[list[Row]]] = getattr(self, f"_{name}")
        try:
            return await bench()
        except Exception as exc:  # one benchmark failing must not hide the others' numbers
            log(traceback.format_exc())
            return [failed_row(name, "benchmark ran", TARGETS.get(name, "runs"), f"{type(exc).__name__}: {exc}"[:300])]

    async def _throughput(self) -> list[Row]:
        s = self.sizes
        t = await bench_throughput.measure(s.throughput_tasks, s.throughput_devices)
        log(bench_throughput.describe(t))
        self.throughput = t
        return [
            Row(
                "throughput",
                f"Sieve end to end, {num(t.tasks)} tasks over {t.devices} devices, "
                f"{t.workers} workers, every task durable",
                f"{num(t.rate)} tasks/s (submit {num(t.submit_rate)}/s; idle Submit->result p50 "
                f"{t.idle_p50_ms:.0f} ms)",
                "context (Celery row decides)",
                None,
                {
                    "tasks_per_s": round(t.rate),
                    "submit_per_s": round(t.submit_rate),
                    "idle_p50_ms": round(t.idle_p50_ms, 1),
                    "succeeded": t.succeeded,
                    "group_commit_rows": str({k: round(v, 1) for k, v in t.group_commits.items()}),
                },
            )
        ]

    async def _celery(self) -> list[Row]:
        s = self.sizes
        name = f"Sieve / Celery, {num(s.throughput_tasks)} tasks over {s.throughput_devices} devices"
        target = f">= {CELERY_TARGET:g} x"
        if self.skip_celery:
            return [Row("celery", name, "not run", target, None, note="skipped (--skip-celery)")]
        if self.throughput is None or not self.throughput.rate:
            return [failed_row("celery", name, target, "no Sieve throughput in this run")]
        # rounds alternate Sieve and Celery (the first Sieve run is the throughput row's), each round's ratio
        # from its own two runs; the median round decides
        sieves, celeries = [self.throughput.rate], []
        for i in range(s.celery_rounds):
            if i > 0:
                t = await bench_throughput.measure(s.throughput_tasks, s.throughput_devices)
                log(bench_throughput.describe(t))
                sieves.append(t.rate)
            c = await bench_celery.measure(s.throughput_tasks, s.throughput_devices)
            log(bench_celery.describe(c))
            if c.error:
                return [failed_row("celery", name, target, c.error)]
            celeries.append(c.rate)
        ratios = [a / b for a, b in zip(sieves, celeries, strict=True)]
        ratio = statistics.median(ratios)
        rounds = ", ".join(f"{num(a)} / {num(b)} = {x:.2f}" for a, b, x in zip(sieves, celeries, ratios, strict=True))
        return [
            Row(
                "celery",
                name,
                f"rounds {rounds}: median {ratio:.2f} x" if len(ratios) > 1 else f"{rounds} x",
                target,
                ratio >= CELERY_TARGET,
                {
                    "sieve_tasks_per_s": [round(x) for x in sieves],
                    "celery_tasks_per_s": [round(x) for x in celeries],
                    "round_ratios": [round(x, 3) for x in ratios],
                    "ratio": round(ratio, 3),
                    "celery_enqueue_per_s": round(c.enqueue_rate),
                    "celery_version": c.version,
                },
                note=f"Celery {c.version}: prefork x{bench_celery.PROCESSES}, no-op task, no result backend "
                "(nothing durable), group enqueue",
            )
        ]

    async def _scale(self) -> list[Row]:
        r = await bench_scale.measure(self.sizes.scale_tasks, self.sizes.scale_few, pairs=self.sizes.scale_pairs)
        for few, many in zip(r.few, r.many, strict=True):
            log(f"scale few:  {bench_scale.describe(few)}\nscale many: {bench_scale.describe(many)}")
        return bench_scale.rows(r)

    async def _noisy(self) -> list[Row]:
        return bench_fairness.noisy_rows(await bench_fairness.noisy_neighbour(*self.sizes.noisy))

    async def _equal(self) -> list[Row]:
        return bench_fairness.equal_rows(await bench_fairness.equal_share(*self.sizes.equal))

    async def _weights(self) -> list[Row]:
        return bench_fairness.weights_rows(await bench_fairness.weights(*self.sizes.weights))

    async def _callers(self) -> list[Row]:
        return bench_fairness.callers_rows(await bench_fairness.callers(*self.sizes.callers))

    async def _cost(self) -> list[Row]:
        r = await bench_cost.measure(*self.sizes.cost)
        log(bench_cost.describe(r))
        return bench_cost.rows(r)

    async def _ocr(self) -> list[Row]:
        return bench_ocr.rows(await bench_ocr.measure(*self.sizes.ocr, log=log))

    async def _ocr_quality(self) -> list[Row]:
        result = await asyncio.to_thread(bench_ocr_quality.measure, self.sizes.ocr_quality, log=log)
        log(bench_ocr_quality.table(result.scores))
        return bench_ocr_quality.rows(result)

    async def _obedient(self) -> list[Row]:
        load = bench_obedient.Load(tasks=self.sizes.obedient_tasks)
        return bench_obedient.rows(await bench_obedient.measure(load, log=log))

    async def _notify(self) -> list[Row]:
        n = await bench_notify.measure(*self.sizes.notify)
        log(bench_notify.describe(n))
        return bench_notify.rows(n)

    async def _external(self) -> list[Row]:
        default, short = await bench_external.measure_both(*self.sizes.external)
        log(f"{bench_external.describe(default)}\n{bench_external.describe(short)}")
        return bench_external.rows(default, short)

    async def _detection(self) -> list[Row]:
        r = await asyncio.to_thread(bench_detection.measure, self.sizes.detection_repeats)
        log(bench_detection.describe(r))
        return bench_detection.rows(r)

    async def _claims(self) -> list[Row]:
        s = self.sizes
        small, large = await bench_fairness.claims(large=s.claims_large, rounds=s.claims_rounds)
        return bench_fairness.claims_rows(small, large, s.claims_large)


TARGETS = {
    "throughput": "runs",
    "celery": f">= {CELERY_TARGET:g} x",
    "scale": f">= {bench_scale.TARGET}",
    "noisy": f"p99 <= {bench_fairness.NOISY_P99_S} s",
    "equal": f">= {bench_fairness.JAIN_MIN}",
    "weights": "+-5 %",
    "callers": "50 % +- 5",
    "cost": "+-10 %",
    "ocr": f">= {bench_ocr.TARGET}",
    "ocr_quality": f"<= upright + {bench_ocr_quality.ORIENTED_MARGIN:.0%}",
    "obedient": f">= {bench_obedient.TARGET}",
    "notify": f"p50 <= {bench_notify.WATCH_P50_TARGET_S * 1000:.0f} ms",
    "external": f">= {bench_external.TARGET}",
    "claims": "context",
    "detection": f"recall >= {bench_detection.RECALL_TARGET}, FPR <= {bench_detection.FPR_TARGET:.1%}, "
    f"speed <= {bench_detection.SPEED_TARGET:g} x",
}


def selection(only: str | None) -> list[str]:
    names = [n.strip() for n in only.split(",") if n.strip()] if only else list(DEFAULT)
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)} (choose from {', '.join(ALL)})")
    if "celery" in names and "throughput" not in names:
        names.insert(names.index("celery"), "throughput")  # the ratio needs both sides from the same run
    return sorted(set(names), key=ALL.index)


async def main(args: argparse.Namespace) -> int:
    names = selection(args.only)
    report = Report(args.smoke, names)
    runner = Runner(SMOKE if args.smoke else FULL, args.skip_celery)
    for name in names:
        log(f"== {name}{' (smoke)' if args.smoke else ''}")
        began = time.perf_counter()
        rows = await runner.run(name)
        report.seconds[name] = time.perf_counter() - began
        report.add(rows)
        for row in rows:
            log(
                f"   {row.name}: {row.measured} (target {row.target}) "
                f"{'-' if row.passed is None else 'pass' if row.passed else 'MISSED'}"
            )
        report.write_json(Path(args.json))  # after each benchmark: a long run that stops keeps what it measured
    print(report.table())
    missed = report.missed
    print(
        f"\n{len(report.rows) - len(missed)} of {len(report.rows)} rows pass or are context; "
        f"{len(missed)} missed{': ' + ', '.join(f'{r.benchmark}' for r in missed) if missed else ''}. "
        f"Report: {args.json}"
    )
    return 1 if missed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated, from: {', '.join(ALL)} (default: all but claims)")
    parser.add_argument("--smoke", action="store_true", help="small sizes: the path works, not the numbers")
    parser.add_argument("--json", default="bench-report.json", help="where the JSON report goes")
    parser.add_argument(
        "--skip-celery", action="store_true", help="no Celery side by side (its row is then context, not missed)"
    )
    sys.exit(asyncio.run(main(parser.parse_args())))

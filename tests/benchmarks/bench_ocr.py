"""OCR throughput: the engine alone in a loop vs. the same images through Sieve end to end (one CPU worker).

    .venv/bin/python -m tests.benchmarks.bench_ocr [--rounds 3] [--repeats 3] [--workers 1]

The image set is the 20 rendered Chinese/English images of the OCR tests (tests/ocr_samples.py).
(a) raw engine: in this process, decode (OpenCV) + detection + recognition of each image in turn, the same
    engine build a CPU worker uses (`worker_svc.ocr`);
(b) Sieve: registry, scheduler, intake and one OCR worker as separate processes (the worker in CPU mode,
    default concurrency); every image of `rounds` rounds is submitted with SubmitBatch and the clock stops
    when PostgreSQL holds the last result.
Both run on the same cores (the services idle while (a) runs), after one untimed warm-up round each, and
alternate `repeats` times so that load from elsewhere hits both alike. Every setting of the cluster is its
default (watermarks 75 %, OCR on CPU workers since no GPU worker is ever seen): (a) is another process burning
the cores, so the worker holds back while it runs, and each (b) starts once the worker takes work again (the
wait is printed). Prints each pair, the median
images/s of both, the median ratio (b)/(a) (target >= 0.9) and the median per-stage times the worker recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg

from sieve import rpc
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.cluster import running_cluster
from tests.benchmarks.common import metric_samples, submit_all
from tests.benchmarks.report import Row
from tests.ocr_samples import SAMPLES, character_errors, find_cjk_font, render_all
from tests.support.cluster import Cluster

TARGET = 0.9


def raw_engine(images: list[bytes]) -> Callable[[int], tuple[float, list[str]]]:
    """Loads the engine (one warm-up round) and returns run(rounds) -> (images/s, texts of the last round)."""
    from worker_svc.ocr.config import cache_dir, prepare_environment

    settings = Settings.from_env({})
    prepare_environment(settings, cache_dir(settings))
    from worker_svc.ocr.engine import EngineOptions, load_engine
    from worker_svc.ocr.images import decode_image
    from worker_svc.ocr.mode import cpu_mode
    from worker_svc.ocr.models import prepare_models

    models = prepare_models(settings, cache_dir(settings))
    loaded = load_engine(models, cpu_mode(settings), EngineOptions.from_settings(settings))

    def loop(n: int) -> list[str]:
        texts: list[str] = []
        for _ in range(n):
            texts = []
            for data in images:
                pixels = decode_image(data, settings.ocr_max_image_pixels).pixels
                texts.append("\n".join(line.text for line in loaded.engine.recognise(pixels).lines))
        return texts

    loaded.executor.submit(loop, 1).result()  # warm-up

    def run(rounds: int) -> tuple[float, list[str]]:
        began = time.perf_counter()
        texts = loaded.executor.submit(loop, rounds).result()
        return len(images) * rounds / (time.perf_counter() - began), texts

    return run


async def taking_work(cluster: Cluster, timeout_s: float = 30) -> float:
    """Seconds until no worker of the cluster holds back (its /metrics: sieve_worker_over_watermark 0)."""
    began = time.perf_counter()
    while True:
        held = 0.0
        for name, address in cluster.metrics.items():
            if name.startswith("worker"):
                samples = await asyncio.to_thread(metric_samples, address, 5)
                held += sum(s.value for s in samples if s.name == "sieve_worker_over_watermark")
        waited = time.perf_counter() - began
        if not held or waited > timeout_s:
            return waited
        await asyncio.sleep(0.1)


@dataclass
class OcrResult:
    """(raw engine, Sieve) images/s of each pair, the character errors of the raw engine's last round, and the
    median per-stage times the worker recorded."""

    rounds: int
    workers: int
    pairs: list[tuple[float, float]] = field(default_factory=list)
    resumed_s: list[float] = field(default_factory=list)
    errors: int = 0
    chars: int = 0
    stages_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Median of the pairs' Sieve / raw ratios."""
        return statistics.median(b / r for r, b in self.pairs) if self.pairs else 0.0


async def measure(rounds: int = 3, repeats: int = 3, workers: int = 1, log: Callable[[str], None] = print) -> OcrResult:
    font = find_cjk_font()
    if font is None:
        raise RuntimeError("no CJK font: install fonts-wqy-microhei or fonts-noto-cjk")
    out = OcrResult(rounds, workers)
    images = render_all(font)
    per_run = len(images) * rounds
    log(f"{len(images)} images x {rounds} rounds per measurement, {repeats} pairs, {os.cpu_count()} cores")
    raw = await asyncio.to_thread(raw_engine, images)
    total = per_run * repeats + len(images)
    worker_env = {"SIEVE_WORKER_TASK_TYPES": "OCR_IMAGE", "SIEVE_OCR_DEVICE": "cpu"}
    assert total < Settings().max_total_pending  # every setting of the cluster is its default
    async with running_cluster(workers=workers, worker_env=worker_env) as cluster:
        s = cluster.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        async with rpc.channel(s.intake_addr, s) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)
            device = 0

            async def through_sieve(round_count: int) -> float:
                nonlocal device
                specs = []
                for data in images * round_count:
                    specs.append(
                        intake_pb2.TaskSpec(
                            device_id=f"40:00:00:00:{device // 256:02x}:{device % 256:02x}",
                            type=types_pb2.TASK_TYPE_OCR_IMAGE,
                            image=data,
                        )
                    )
                    device += 1
                target = len(specs) + await pg.fetchval("SELECT count(*) FROM results")
                began = time.perf_counter()
                await submit_all(stub, specs, chunk=20)
                while (  # noqa: ASYNC110 - results are counted in PostgreSQL
                    await pg.fetchval("SELECT count(*) FROM tasks WHERE status IN ('SUCCEEDED', 'FAILED')") < target
                ):
                    await asyncio.sleep(0.05)
                return len(specs) / (time.perf_counter() - began)

            await through_sieve(1)  # warm-up
            texts: list[str] = []
            for i in range(repeats):
                raw_rate, texts = await asyncio.to_thread(raw, rounds)
                # the raw engine was another process burning the cores: the worker held back meanwhile, as it
                # should; Sieve's measurement starts once it takes work again (it is alone on the machine then)
                resumed_s = await taking_work(cluster)
                sieve_rate = await through_sieve(rounds)
                out.pairs.append((raw_rate, sieve_rate))
                out.resumed_s.append(resumed_s)
                log(
                    f"  pair {i + 1}: raw {raw_rate:.2f} images/s, Sieve {sieve_rate:.2f} images/s, "
                    f"ratio {sieve_rate / raw_rate:.2f} (worker took work again {resumed_s:.1f}s after the raw run)"
                )
            failed = await pg.fetchval("SELECT count(*) FROM tasks WHERE status <> 'SUCCEEDED'")
            assert failed == 0, f"{failed} tasks did not succeed"
            stages: dict[str, list[float]] = {}
            for row in await pg.fetch("SELECT details::text AS details FROM results"):
                for name, value in json.loads(row["details"])["timings_ms"].items():
                    stages.setdefault(name, []).append(value)
        await pg.close()

    out.errors = sum(character_errors(s.text, t)[0] for s, t in zip(SAMPLES, texts, strict=True))
    out.chars = sum(character_errors(s.text, s.text)[1] for s in SAMPLES)
    out.stages_ms = {k: statistics.median(v) for k, v in sorted(stages.items())}
    return out


def rows(r: OcrResult) -> list[Row]:
    raw_median = statistics.median(a for a, _ in r.pairs) if r.pairs else 0.0
    sieve_median = statistics.median(b for _, b in r.pairs) if r.pairs else 0.0
    return [
        Row(
            "ocr",
            f"OCR through Sieve ({r.workers} CPU worker) vs the raw engine, median of {len(r.pairs)} pairs",
            f"{sieve_median:.2f} / {raw_median:.2f} images/s = {r.ratio:.2f}; CER {r.errors}/{r.chars}",
            f">= {TARGET}",
            r.ratio >= TARGET,
            {
                "sieve_images_per_s": round(sieve_median, 3),
                "raw_images_per_s": round(raw_median, 3),
                "ratio": round(r.ratio, 3),
                "pairs": [[round(a, 3), round(b, 3)] for a, b in r.pairs],
                "cer_errors": r.errors,
                "cer_chars": r.chars,
                "stages_ms": str({k: round(v, 1) for k, v in r.stages_ms.items()}),
            },
        )
    ]


async def main(args: argparse.Namespace) -> None:
    r = await measure(args.rounds, args.repeats, args.workers)
    raw_median = statistics.median(a for a, _ in r.pairs)
    sieve_median = statistics.median(b for _, b in r.pairs)
    print(
        f"(a) raw engine, one process:    {raw_median:.2f} images/s (median)   CER {r.errors}/{r.chars} = "
        f"{r.errors / r.chars:.2%}"
    )
    print(f"(b) through Sieve, {args.workers} CPU worker: {sieve_median:.2f} images/s (median)")
    print(f"ratio (b)/(a): {r.ratio:.2f} (median of pairs; target >= 0.90)")
    print("worker stage medians (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in r.stages_ms.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the 20 images per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="raw/Sieve measurement pairs")
    parser.add_argument("--workers", type=int, default=1)
    asyncio.run(main(parser.parse_args()))

"""OCR throughput: the engine alone in a loop vs. the same images through Sieve end to end (one CPU worker).

    .venv/bin/python -m tests.benchmarks.bench_ocr [--rounds 5] [--workers 1]

The image set is the 20 rendered Chinese/English images of the OCR tests (tests/ocr_samples.py).
(a) raw engine: in this process, decode (OpenCV) + detection + recognition of each image in turn, the same
    engine build a CPU worker uses (`worker_svc.ocr`), after one untimed warm-up round;
(b) Sieve: registry, scheduler, intake and one OCR worker as separate processes (the worker in CPU mode,
    default concurrency); after one untimed warm-up round, every image of `rounds` rounds is submitted with
    SubmitBatch and the clock stops when PostgreSQL holds the last result.
Prints images/s of both, the ratio (b)/(a) (target >= 0.9: everything shares the same cores) and the median
per-stage times the worker recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import asyncpg

from sieve import rpc
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.benchmarks.cluster import running_cluster
from tests.ocr_samples import SAMPLES, character_errors, find_cjk_font, render_all


def raw_engine(images: list[bytes], rounds: int) -> tuple[float, list[str]]:
    """Images/s of decode + OCR in a loop on this process's engine, and the texts of the last round."""
    from worker_svc.ocr.config import cache_dir, prepare_environment

    settings = Settings.from_env({})
    prepare_environment(settings, cache_dir(settings))
    from worker_svc.ocr.engine import load_engine
    from worker_svc.ocr.images import decode_image
    from worker_svc.ocr.mode import cpu_mode
    from worker_svc.ocr.models import prepare_models

    models = prepare_models(settings, cache_dir(settings))
    loaded = load_engine(models, cpu_mode(settings), settings.ocr_min_line_confidence)

    def loop(n: int) -> list[str]:
        texts = []
        for _ in range(n):
            texts = []
            for data in images:
                pixels = decode_image(data, settings.ocr_max_image_pixels).pixels
                texts.append("\n".join(line.text for line in loaded.engine.recognise(pixels).lines))
        return texts

    loaded.executor.submit(loop, 1).result()  # warm-up
    began = time.perf_counter()
    texts = loaded.executor.submit(loop, rounds).result()
    return len(images) * rounds / (time.perf_counter() - began), texts


async def through_sieve(images: list[bytes], rounds: int, workers: int) -> tuple[float, dict[str, float]]:
    total = len(images) * rounds
    worker_env = {"SIEVE_WORKER_TASK_TYPES": "OCR_IMAGE", "SIEVE_OCR_DEVICE": "cpu"}
    async with running_cluster(workers=workers, worker_env=worker_env,
                               SIEVE_MAX_TOTAL_PENDING=str(total + 1000),
                               SIEVE_MAX_PER_DEVICE_PENDING=str(total + 1000),
                               SIEVE_NO_GPU_STRATEGY="cpu",
                               # every process shares these cores: host CPU is not a worker's own load
                               SIEVE_CPU_WATERMARK_PCT="101") as cluster:
        s = cluster.settings
        pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
        async with rpc.insecure_channel(s.intake_addr, s) as channel:
            stub = intake_pb2_grpc.IntakeServiceStub(channel)

            async def run(round_count: int, first_device: int) -> float:
                specs = [intake_pb2.TaskSpec(device_id=f"40:00:00:00:{(first_device + i) // 256:02x}:"
                                                       f"{(first_device + i) % 256:02x}",
                                             type=types_pb2.TASK_TYPE_OCR_IMAGE, image=data)
                         for i, data in enumerate(images * round_count)]
                target = len(specs) + await pg.fetchval("SELECT count(*) FROM results")
                began = time.perf_counter()
                for i in range(0, len(specs), 20):
                    reply = await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[i : i + 20]))
                    assert all(item.code == 0 for item in reply.items), reply
                while await pg.fetchval(  # noqa: ASYNC110 - results are counted in PostgreSQL
                        "SELECT count(*) FROM tasks WHERE status IN ('SUCCEEDED', 'FAILED')") < target:
                    await asyncio.sleep(0.02)
                return time.perf_counter() - began

            await run(1, 0)  # warm-up
            elapsed = await run(rounds, len(images))
            failed = await pg.fetchval("SELECT count(*) FROM tasks WHERE status <> 'SUCCEEDED'")
            assert failed == 0, f"{failed} tasks did not succeed"
            stages: dict[str, list[float]] = {}
            for row in await pg.fetch("SELECT details::text AS details FROM results"):
                for name, value in json.loads(row["details"])["timings_ms"].items():
                    stages.setdefault(name, []).append(value)
        await pg.close()
    return total / elapsed, {name: statistics.median(values) for name, values in stages.items()}


async def main(args: argparse.Namespace) -> None:
    font = find_cjk_font()
    if font is None:
        raise SystemExit("no CJK font: install fonts-wqy-microhei or fonts-noto-cjk")
    images = render_all(font)
    print(f"{len(images)} images x {args.rounds} rounds on {os.cpu_count()} cores")
    raw, texts = await asyncio.to_thread(raw_engine, images, args.rounds)
    errors = sum(character_errors(s.text, t)[0] for s, t in zip(SAMPLES, texts, strict=True))
    chars = sum(character_errors(s.text, s.text)[1] for s in SAMPLES)
    print(f"(a) raw engine, one process:   {raw:.2f} images/s   (CER {errors}/{chars} = {errors / chars:.2%})")
    sieve, stages = await through_sieve(images, args.rounds, args.workers)
    print(f"(b) through Sieve, {args.workers} CPU worker: {sieve:.2f} images/s")
    print(f"ratio (b)/(a): {sieve / raw:.2f}   (target >= 0.90)")
    print("worker stage medians (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(stages.items())))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    asyncio.run(main(parser.parse_args()))

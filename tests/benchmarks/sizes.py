"""The workload of every benchmark of `python -m tests.benchmarks`, full (the targets' sizes) and smoke (small:
the path works, not the numbers; the CI smoke test uses these too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """The workload of every benchmark at one scale (each tuple is the arguments of its function, in order)."""

    throughput_tasks: int
    throughput_devices: int
    scale_tasks: int
    scale_few: int
    noisy: tuple[int, int, int]
    equal: tuple[int, int, float, int]
    weights: tuple[int, int]
    callers: tuple[int, int, int]
    cost: tuple[float, int, int]
    ocr: tuple[int, int]
    #: images per condition of the OCR quality set (20 conditions)
    ocr_quality: int
    obedient_tasks: int
    notify: tuple[int, float]
    claims_large: int
    claims_rounds: int
    #: default tick, shorter tick, jobs, devices, cap, (shortest, longest) job duration
    external: tuple[float, float, int, int, int, tuple[float, float]]
    detection_repeats: int
    #: alternating few/many pairs of the scale benchmark (its ratio: the median of the pairs' ratios)
    scale_pairs: int = 1
    #: alternating Sieve/Celery rounds of the side by side (its ratio: the median of the rounds' ratios)
    celery_rounds: int = 1


FULL = Sizes(
    20000,
    200,
    50000,
    100,
    (20000, 200, 5),
    (50, 600, 1.0, 0),
    (3000, 3000),
    (1000, 10, 8000),
    (60.0, 200, 1500),
    (3, 3),
    10,
    20000,
    (3000, 500.0),
    100_000,
    3000,
    (10.0, 1.0, 20, 5, 5, (15.0, 35.0)),
    15,
    # on a shared two-core machine one pair swings from 0.66 to 0.93 and one Celery round from 850 to 1 280
    # tasks/s: three of each, alternating, and the median of their ratios
    scale_pairs=3,
    celery_rounds=3,
)
SMOKE = Sizes(
    2000,
    50,
    2000,
    20,
    (2000, 50, 2),
    (20, 300, 1.0, 2000),
    (2000, 3000),
    (1000, 2, 1500),
    (10.0, 40, 300),
    (1, 1),
    1,
    2000,
    (300, 200.0),
    10_000,
    500,
    (1.0, 0.2, 20, 4, 5, (0.5, 1.5)),
    2,
)

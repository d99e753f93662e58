"""The worker's hold-back state (worker_svc.pressure): watermarks with hysteresis, one log line per change, time
held back by resource, and a put-back delay that follows how long the pressure has lasted. The readings are
fixed through a file (SIEVE_FIXED_RESOURCES=file:...) and the clock is the test's, so every step is exact."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from sieve.settings import Settings
from worker_svc.pressure import CPU_ENTER_AFTER_S, MIN_RETRY_S, SAMPLE_EVERY_S, Pressure
from worker_svc.resources import ResourceSampler


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def readings(tmp_path: Path) -> Path:
    path = tmp_path / "readings"
    path.write_text("cpu=10,memory=10")
    return path


def pressure_of(readings: Path, clock: Clock, **settings: object) -> Pressure:
    s = Settings(fixed_resources=f"file:{readings}", **settings)  # type: ignore[arg-type]
    return Pressure(ResourceSampler(s), s, clock=clock, rng=random.Random(4))


def step(p: Pressure, clock: Clock, readings: Path, text: str, seconds: float = SAMPLE_EVERY_S) -> list[str]:
    readings.write_text(text)
    clock.now += seconds
    return p.reasons()


def test_a_worker_holds_back_at_the_watermark_and_takes_work_again_only_under_the_hysteresis(
    readings: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sieve.worker.pressure")
    clock = Clock()
    p = pressure_of(readings, clock)
    assert p.reasons() == [] and not p.held
    # others' CPU reaches the 75 % watermark: CPU_ENTER_AFTER_S of it holds the worker back (a burst does not)
    for _ in range(round(CPU_ENTER_AFTER_S / SAMPLE_EVERY_S)):
        assert step(p, clock, readings, "cpu=80,cpu_own=5,memory=10") == []
    assert step(p, clock, readings, "cpu=80,cpu_own=5,memory=10") == ["cpu 75.0% besides this worker's 5.0% >= 75.0%"]
    assert p.held and p.held_resources() == ["cpu"]
    # down to 70 %: still within the 10-point hysteresis, still held (and says what it waits for)
    assert step(p, clock, readings, "cpu=70,memory=10") == ["cpu 70.0% >= 65.0%"]
    # ... and held for as long as it stays there, however often it is asked
    for _ in range(5):
        assert step(p, clock, readings, "cpu=66,memory=10")
    # under 65 %: it takes work again
    assert step(p, clock, readings, "cpu=64,memory=10") == []
    assert not p.held
    # one line when it started holding back, one when it stopped: not one per check
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("holding back (no new work): cpu 75.0%")
    assert lines[1].startswith("taking work again after 1.8s held back (cpu)"), lines


def test_the_worker_s_own_cpu_never_holds_it_back(readings: Path) -> None:
    clock = Clock()
    p = pressure_of(readings, clock)
    # 100 % CPU, 95 points of it this worker's own process tree
    assert step(p, clock, readings, "cpu=100,cpu_own=95,memory=10") == []
    assert not p.held


def test_time_held_back_is_kept_per_resource_including_the_episode_going_on(readings: Path) -> None:
    clock = Clock()
    p = pressure_of(readings, clock)
    step(p, clock, readings, "cpu=10,memory=90")  # memory from t0, at once
    step(p, clock, readings, "cpu=90,memory=90", 1.0)  # cpu over from t0 + 1 s ...
    step(p, clock, readings, "cpu=90,memory=90", CPU_ENTER_AFTER_S)  # ... holds from t0 + 1 s + CPU_ENTER_AFTER_S
    step(p, clock, readings, "cpu=10,memory=90", 3.0)  # and lets go 3 s after that
    held = p.held_back_seconds()
    memory_s = 1.0 + CPU_ENTER_AFTER_S + 3.0
    assert held["cpu"] == pytest.approx(3.0)
    assert held["memory"] == pytest.approx(memory_s)
    clock.now += 4.0  # still held by memory: the running episode counts
    assert p.held_back_seconds()["memory"] == pytest.approx(memory_s + 4.0)
    step(p, clock, readings, "cpu=10,memory=10", 0.0)
    clock.now += 100
    assert p.held_back_seconds() == {
        "cpu": pytest.approx(3.0),
        "memory": pytest.approx(memory_s + 4.0),
        "gpu_memory": 0.0,
    }
    assert p.episodes == 1


def test_a_put_back_waits_about_as_long_again_as_the_pressure_has_lasted_within_bounds(readings: Path) -> None:
    clock = Clock()
    p = pressure_of(readings, clock, pressure_retry_s=20.0)
    step(p, clock, readings, "memory=90")
    # pressure that just began: about a second (never less)
    assert MIN_RETRY_S <= p.retry_after_s() <= MIN_RETRY_S * 1.2
    clock.now += 5
    assert 5 * 0.8 <= p.retry_after_s() <= 5 * 1.2
    delays = {round(p.retry_after_s(), 3) for _ in range(20)}
    assert len(delays) > 10  # jittered: put-backs do not come back together
    clock.now += 100
    assert p.retry_after_s() == 20.0  # never past the configured maximum


def test_readings_are_sampled_at_most_every_quarter_second(readings: Path) -> None:
    clock = Clock()
    p = pressure_of(readings, clock)
    p.reasons()
    readings.write_text("memory=99")
    clock.now += SAMPLE_EVERY_S / 2
    assert p.reasons() == []  # the last sample stands
    clock.now += SAMPLE_EVERY_S / 2
    assert p.reasons() == ["memory 99.0% >= 75.0%"]

"""The console's one-second samples: throughput, queue-wait percentiles, shares over the window and Jain's index."""

from __future__ import annotations

import pytest

from scheduler_svc.console.history import (
    FAIRNESS_WINDOW_S,
    MAX_DEVICES_PER_SECOND,
    SHARE_WINDOW_S,
    History,
    Totals,
    jain_index,
    quantile,
)
from scheduler_svc.console.tally import MAX_WAITS, Tally


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_takes_everything() -> None:
    assert jain_index([5, 5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([8, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([3, 1]) == pytest.approx(16 / 20)
    assert jain_index([7]) is None and jain_index([]) is None and jain_index([0, 0]) is None


def test_quantile_is_the_nearest_rank() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert quantile(values, 0.5) == 50 and quantile(values, 0.95) == 95 and quantile(values, 1.0) == 100
    assert quantile([], 0.5) is None


def test_the_tally_keeps_at_most_max_waits_a_sample() -> None:
    tally = Tally()
    tally.claimed("a", [1.0] * (MAX_WAITS - 1))
    tally.claimed("a", [2.0, 3.0])
    taken = tally.take()
    assert taken.per_device["a"] == MAX_WAITS + 1 and len(taken.waits_ms) == MAX_WAITS
    assert tally.take().per_device == {}


async def _history(acked: list[int], weights: dict[str, int]) -> tuple[History, Tally]:
    tally = Tally()

    async def totals() -> Totals:
        return Totals(pending=7, leased=2)

    return History(tally, acked=lambda: acked[0], weight_of=lambda m: weights.get(m, 1), totals=totals), tally


async def test_a_sample_counts_claims_acks_and_waits_of_its_second() -> None:
    acked = [10]
    history, tally = await _history(acked, {})
    tally.claimed("a", [10.0, 20.0, 30.0, 40.0])
    tally.claimed("b", [100.0])
    acked[0] = 14
    sample = await history.sample()
    assert sample.wait_p50_ms == 30.0 and sample.wait_max_ms == 100.0 and sample.wait_p95_ms == 100.0
    assert sample.claimed_per_s > 0 and sample.acked_per_s > 0
    assert (sample.pending, sample.leased, sample.devices_served) == (7, 2, 2)
    assert sample.jain == pytest.approx(jain_index([4, 1]), abs=1e-4)
    # a second with nothing claimed has no waits, and Jain's index still covers the fairness window
    quiet = await history.sample()
    assert quiet.wait_p50_ms is None and quiet.claimed_per_s == 0 and quiet.jain == sample.jain


async def test_jain_index_weighs_each_device_by_its_weight() -> None:
    history, tally = await _history([0], {"heavy": 3})
    tally.claimed("heavy", [1.0] * 30)
    tally.claimed("light", [1.0] * 10)
    assert (await history.sample()).jain == pytest.approx(1.0)


async def test_shares_and_fairness_forget_what_fell_out_of_their_windows() -> None:
    history, tally = await _history([0], {})
    tally.claimed("old", [1.0] * 5)
    await history.sample()
    for _ in range(FAIRNESS_WINDOW_S):
        tally.claimed("new", [1.0])
        await history.sample()
    assert history.fairness() == (None, 1)  # only "new" in the last FAIRNESS_WINDOW_S seconds
    served, total = history.shares()
    assert served["old"] == 5 and total == 5 + FAIRNESS_WINDOW_S
    for _ in range(SHARE_WINDOW_S):
        await history.sample()
    served, total = history.shares()
    assert "old" not in served and total == 0


async def test_a_second_keeps_the_busiest_devices_by_name_and_counts_the_others_in_the_total() -> None:
    history, tally = await _history([0], {})
    tally.claimed("busy", [1.0] * 50)
    for i in range(MAX_DEVICES_PER_SECOND + 500):
        tally.claimed(f"one-{i}", [1.0])
    sample = await history.sample()
    served, total = history.shares()
    assert len(served) == MAX_DEVICES_PER_SECOND and served["busy"] == 50
    assert total == 50 + MAX_DEVICES_PER_SECOND + 500
    assert sample.claimed_per_s > 0 and sample.devices_served == MAX_DEVICES_PER_SECOND
    for _ in range(SHARE_WINDOW_S):
        await history.sample()
    assert history.shares() == ({}, 0)

"""The processing-time histogram of GetStats (sieve/db/stats.py): buckets, percentiles, and adding histograms."""

from __future__ import annotations

import random

import pytest

from sieve.db.stats import BUCKETS, Counts, add_histograms, bucket_ms, bucket_of, percentile_ms


def test_a_bucket_reads_within_nine_percent_of_every_time_in_it() -> None:
    for ms in [0.0125, 0.05, 0.3, 1.0, 7.5, 80.0, 1234.5, 60_000.0, 3_600_000.0]:
        assert abs(bucket_ms(bucket_of(ms)) / ms - 1) < 0.095, ms


def test_times_below_the_first_bucket_and_above_the_last_are_clamped() -> None:
    assert bucket_of(0.0) == 0 and bucket_of(-3.0) == 0
    assert bucket_of(1e12) == BUCKETS - 1


def test_percentiles_are_the_nearest_rank_of_the_merged_buckets() -> None:
    # Given 100 times, 1..100 ms
    times = [float(n) for n in range(1, 101)]
    random.Random(7).shuffle(times)
    histogram = [0] * BUCKETS
    for ms in times:
        histogram[bucket_of(ms)] += 1
    # Then the median reads about 50 ms and the 95th percentile about 95 ms (within a bucket)
    p50, p95 = percentile_ms(histogram, 0.5), percentile_ms(histogram, 0.95)
    assert p50 == pytest.approx(50, rel=0.1) and p95 == pytest.approx(95, rel=0.1)
    assert percentile_ms([], 0.5) is None and percentile_ms([0, 0], 0.95) is None


def test_histograms_of_different_lengths_add_bucket_by_bucket() -> None:
    assert add_histograms((1, 2), (0, 1, 5)) == (1, 3, 5)
    total = Counts(succeeded=2, histogram=(0, 2)) + Counts(failed=1, reported=3)
    assert (total.succeeded, total.failed, total.reported, total.finished, total.histogram) == (2, 1, 3, 3, (0, 2))

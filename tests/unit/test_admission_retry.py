"""The delay a refused device is told to wait comes from its own backlog and service rate."""

from __future__ import annotations

from intake_svc.admission import device_retry_after_s, retry_after_s
from sieve.errors import AdmissionRefused, ScriptCode
from sieve.settings import Settings

SETTINGS = Settings(max_per_device_pending=200, retry_after_s=30, aging_max_wait_s=600)
NOW = 1_000_000


def test_a_device_served_at_ten_tasks_a_second_waits_for_its_excess_to_drain() -> None:
    # 200 queued, 10 more asked for: 10 must drain first, at 10/s
    meta = {"backlog": "200", "rate_per_s": "10"}
    assert device_retry_after_s(meta, 10, SETTINGS, NOW) == 1.0
    meta = {"backlog": "200", "rate_per_s": "2"}
    assert device_retry_after_s(meta, 20, SETTINGS, NOW) == 10.0


def test_the_current_window_counts_when_it_is_faster_than_the_last_one() -> None:
    meta = {"backlog": "200", "rate_per_s": "1", "win_start_ms": str(NOW - 2000), "win_count": "40"}
    assert device_retry_after_s(meta, 40, SETTINGS, NOW) == 2.0  # 20/s now


def test_the_delay_is_never_below_one_second_nor_above_max_wait() -> None:
    assert device_retry_after_s({"backlog": "200", "rate_per_s": "1000"}, 1, SETTINGS, NOW) == 1.0
    assert device_retry_after_s({"backlog": "200", "rate_per_s": "0.01"}, 50, SETTINGS, NOW) == 600.0


def test_a_device_never_served_gets_the_seed_delay_and_the_global_limit_always_does() -> None:
    assert device_retry_after_s({"backlog": "200"}, 1, SETTINGS, NOW) == 30.0
    refusal = AdmissionRefused(ScriptCode.GLOBAL_LIMIT, 0, 5000)
    assert retry_after_s(refusal, {"backlog": "200", "rate_per_s": "100"}, 1, SETTINGS) == 30.0

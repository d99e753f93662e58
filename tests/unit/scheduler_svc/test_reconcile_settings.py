"""Reconciliation's settings: derived defaults (half the lease TTL, the lease TTL) and refused values."""

from __future__ import annotations

import pytest

from scheduler_svc.reconcile import Reconciler
from sieve.settings import Settings, SettingsError


class _Queues:
    """Only what Reconciler reads at construction (its settings); no Redis is reached."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings


def test_interval_and_grace_follow_the_lease_ttl_unless_set() -> None:
    derived = Reconciler(_Queues(Settings.from_env({}, lease_ttl_s=8.0)), None)  # type: ignore[arg-type]
    assert (derived.interval_s, derived.grace_s) == (4.0, 8.0)
    # the bound of the issue: grace + interval stays within 2 x the lease TTL, leaving half a TTL for the pass
    assert derived.grace_s + derived.interval_s <= 2 * 8.0 - 4.0
    chosen = Reconciler(
        _Queues(Settings.from_env({"SIEVE_RECONCILE_INTERVAL_S": "2", "SIEVE_RECONCILE_GRACE_S": "5"})), None
    )  # type: ignore[arg-type]
    assert (chosen.interval_s, chosen.grace_s) == (2.0, 5.0)


@pytest.mark.parametrize(
    "variable, value",
    [
        ("SIEVE_RECONCILE_INTERVAL_S", "-1"),
        ("SIEVE_RECONCILE_GRACE_S", "-0.5"),
        ("SIEVE_RECONCILE_PAGE_ROWS", "0"),
        ("SIEVE_RECONCILE_FENCE_STEP", "0"),
    ],
)
def test_impossible_values_are_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env({variable: value})

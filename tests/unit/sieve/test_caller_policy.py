"""Unit tests of the per-caller policies (sieve/caller_policy.py): the SIEVE_CALLER_POLICIES format, what each
caller gets (defaults, overrides, operators), and Settings.validate naming the variable of a bad value."""

from __future__ import annotations

import pytest

from sieve.caller_policy import ENTITLED, CallerPolicies, default_max_pending
from sieve.settings import Settings, SettingsError
from sieve.v1 import types_pb2

HIGH, CRITICAL = types_pb2.PRIORITY_HIGH, types_pb2.PRIORITY_CRITICAL


def test_every_client_gets_the_defaults_and_no_entitlement() -> None:
    s = Settings.from_env({})
    policy = CallerPolicies(s).policy("anyone", operator=False)
    assert (policy.max_pending, policy.rate_per_s, policy.burst) == (4000, 10000.0, 20000)
    assert policy.priorities == frozenset()
    assert policy.may_use(types_pb2.PRIORITY_NORMAL) and policy.may_use(types_pb2.PRIORITY_BACKGROUND)
    assert not policy.may_use(HIGH) and not policy.may_use(CRITICAL)


def test_the_default_quota_is_a_fraction_of_the_global_limit_unless_given() -> None:
    assert default_max_pending(Settings.from_env({}, max_total_pending=10)) == 8
    assert default_max_pending(Settings.from_env({}, max_total_pending=1)) == 1
    assert default_max_pending(Settings.from_env({}, max_total_pending=10, caller_max_pending_fraction=0.5)) == 5
    assert default_max_pending(Settings.from_env({}, caller_max_pending=7)) == 7


def test_an_entry_overrides_only_what_it_names() -> None:
    s = Settings.from_env(
        {
            "SIEVE_CALLER_POLICIES": "svc-a:max_pending=2000,rate_per_s=500,burst=1000,"
            "priorities=HIGH|CRITICAL\n# a comment\nsvc-b:priorities=high;"
            "svc-c:rate_per_s=5 ; svc-d:max_pending=none,rate_per_s=none"
        }
    )
    policies = CallerPolicies(s)
    a, b, c, d = (policies.policy(n, operator=False) for n in ("svc-a", "svc-b", "svc-c", "svc-d"))
    assert (a.max_pending, a.rate_per_s, a.burst, a.priorities) == (2000, 500.0, 1000, ENTITLED)
    assert (b.max_pending, b.rate_per_s, b.burst, b.priorities) == (4000, 10000.0, 20000, frozenset({HIGH}))
    assert (c.rate_per_s, c.burst) == (5.0, 10)  # the burst follows a rate given without one
    assert (d.max_pending, d.rate_per_s) == (None, None)


def test_operators_use_every_priority_and_have_no_limits_unless_named() -> None:
    policies = CallerPolicies(Settings.from_env({}, caller_policies="ops-b:rate_per_s=100,priorities=none"))
    ops = policies.policy("ops", operator=True)
    assert (ops.max_pending, ops.rate_per_s, ops.priorities) == (None, None, ENTITLED)
    named = policies.policy("ops-b", operator=True)
    assert (named.max_pending, named.rate_per_s, named.priorities) == (None, 100.0, ENTITLED)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("svc", "is not name:key=value"),
        ("svc:speed=3", "unknown key 'speed'"),
        ("svc:max_pending=0", "max_pending must be a positive number"),
        ("svc:max_pending=-4", "max_pending must be a positive number"),
        ("svc:max_pending=1.5", "max_pending='1.5' is not a valid int"),
        ("svc:rate_per_s=inf", "rate_per_s must be a positive number"),
        ("svc:rate_per_s=nan", "rate_per_s must be a positive number"),
        ("svc:burst=none", "burst='none' is not a valid int"),
        ("svc:priorities=URGENT", "unknown priority 'URGENT'"),
        ("svc:priorities=HIGH|", "unknown priority ''"),
        ("svc:burst", "'burst' is not key=value"),
        ("svc:burst=1,burst=2", "burst given twice"),
        ("svc:burst=1;svc:burst=2", "caller 'svc' appears twice"),
        ("a/b:burst=1", "bad caller name"),
        (":burst=1", "bad caller name"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_variable(value: str, fragment: str) -> None:
    with pytest.raises(SettingsError, match="SIEVE_CALLER_POLICIES") as err:
        Settings.from_env({"SIEVE_CALLER_POLICIES": value})
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SIEVE_CALLER_MAX_PENDING", "-1"),
        ("SIEVE_CALLER_MAX_PENDING_FRACTION", "0"),
        ("SIEVE_CALLER_MAX_PENDING_FRACTION", "1.5"),
        ("SIEVE_CALLER_SUBMIT_RATE_PER_S", "-1"),
        ("SIEVE_CALLER_SUBMIT_RATE_PER_S", "inf"),
        ("SIEVE_CALLER_SUBMIT_BURST", "0"),
        ("SIEVE_DEVICE_OWNER_REFRESH_S", "0"),
    ],
)
def test_bad_tenant_limits_are_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        Settings.from_env({variable: value})

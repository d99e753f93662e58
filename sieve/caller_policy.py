"""What each caller may do at the intake: its pending quota, its submit rate, the priorities it may use.

Every caller gets the defaults of the settings (`caller_max_pending` — by default a fraction of the global
limit, so that no single caller can fill it alone —, `caller_submit_rate_per_s`, `caller_submit_burst`);
`SIEVE_CALLER_POLICIES` overrides them per caller and grants the HIGH and CRITICAL priorities, which no caller
has by default. Its format (`parse_policies`):

    name:key=value,key=value;name:key=value...      (";" or a new line between callers, "#" starts a comment)

    max_pending=N        tasks the caller may have open (accepted and not final); "none": no quota of its own
    rate_per_s=R         tasks per second its token bucket refills; "none": no rate limit
    burst=B              the bucket's size (tasks it may submit at once after a quiet time); default: twice
                         the rate when the entry gives one, else caller_submit_burst
    priorities=P|Q       the priorities it may use beyond NORMAL, LOW and BACKGROUND: HIGH, CRITICAL; "none"
    weight=W             its share of the scheduler when callers compete (1..100, default 1): backlogged callers
                         are served in proportion to their weights, whatever the number of their devices
                         (the first level of the fair order; within a caller its devices share by their own
                         weights)

e.g. `svc-a:max_pending=2000,rate_per_s=500,burst=1000,priorities=HIGH|CRITICAL;svc-b:priorities=HIGH`.

Operators (and the anonymous principal, which holds every role) use every priority and have no quota or rate
of their own unless the setting names them: then the fields it gives apply to them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

from sieve.v1 import types_pb2

SETTING = "SIEVE_CALLER_POLICIES"
#: priorities a caller needs an entitlement for
ENTITLED = frozenset({types_pb2.PRIORITY_HIGH, types_pb2.PRIORITY_CRITICAL})
ALL_PRIORITIES = frozenset(v for v in types_pb2.Priority.values() if v != types_pb2.PRIORITY_UNSPECIFIED)
_NAME_FORBIDDEN = set("/:,;#")


class PolicyError(ValueError):
    """SIEVE_CALLER_POLICIES could not be read; the message names it and the bad entry."""


@dataclass(frozen=True, slots=True)
class CallerPolicy:
    """The limits and entitlements of one caller (None: no limit of that kind)."""

    max_pending: int | None
    rate_per_s: float | None
    burst: int
    #: priorities beyond NORMAL this caller may use (a subset of ENTITLED)
    priorities: frozenset[int]
    #: its share when backlogged callers compete for the scheduler (1..100)
    weight: int = 1

    def may_use(self, priority: int) -> bool:
        return priority not in ENTITLED or priority in self.priorities


@dataclass(frozen=True, slots=True)
class _Override:
    """What one entry of SIEVE_CALLER_POLICIES sets (a field left out keeps the caller's base)."""

    fields: dict[str, object]


def _priority(name: str, caller: str) -> int:
    key = name.strip().upper()
    key = key if key.startswith("PRIORITY_") else "PRIORITY_" + key
    try:
        value = types_pb2.Priority.Value(key)
    except ValueError:
        raise PolicyError(f"{SETTING}: {caller}: unknown priority {name.strip()!r} (HIGH, CRITICAL)") from None
    if value == types_pb2.PRIORITY_UNSPECIFIED:
        raise PolicyError(f"{SETTING}: {caller}: unknown priority {name.strip()!r} (HIGH, CRITICAL)")
    return value


def _number(raw: str, caller: str, key: str, kind: type) -> object:
    text = raw.strip()
    if text.lower() == "none" and key in ("max_pending", "rate_per_s"):
        return None
    try:
        value = kind(text)
    except ValueError:
        raise PolicyError(f"{SETTING}: {caller}: {key}={text!r} is not a valid {kind.__name__}") from None
    if not ((isinstance(value, float) and math.isfinite(value)) or isinstance(value, int)) or value <= 0:
        raise PolicyError(f"{SETTING}: {caller}: {key} must be a positive number (or none)")
    return value


def parse_policies(text: str) -> dict[str, _Override]:
    """The per-caller entries of SIEVE_CALLER_POLICIES, by caller name; raises PolicyError naming the setting."""
    found: dict[str, _Override] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        for item in filter(None, (p.strip() for p in line.split(";"))):
            name, body = _entry_name(item)
            if name in found:
                raise PolicyError(f"{SETTING}: caller {name!r} appears twice")
            found[name] = _Override(_entry_fields(name, body))
    return found


def _entry_name(item: str) -> tuple[str, str]:
    """(caller name, the key=value,... rest) of one `name:key=value,...` entry."""
    name, sep, body = item.partition(":")
    name = name.strip()
    if not sep:
        raise PolicyError(f"{SETTING}: entry {item[:40]!r} is not name:key=value,...")
    if not name or len(name) > 128 or not name.isprintable() or _NAME_FORBIDDEN & set(name):
        raise PolicyError(f"{SETTING}: bad caller name {name[:40]!r} (1..128 printable characters, none of / : , ; #)")
    return name, body


def _entry_fields(name: str, body: str) -> dict[str, object]:
    """The fields one caller's entry sets, from its `key=value,...` part."""
    fields: dict[str, object] = {}
    for pair in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = (s.strip() for s in pair.partition("="))
        if not eq:
            raise PolicyError(f"{SETTING}: {name}: {pair[:40]!r} is not key=value")
        if key in fields:
            raise PolicyError(f"{SETTING}: {name}: {key} given twice")
        fields[key] = _field_value(name, key, value)
    return fields


def _field_value(name: str, key: str, value: str) -> object:
    """The value of one `key=value` of caller `name`'s entry."""
    if key in ("max_pending", "burst"):
        return _number(value, name, key, int)
    if key == "rate_per_s":
        return _number(value, name, key, float)
    if key == "weight":
        weight = _number(value, name, key, int)
        if not isinstance(weight, int) or not 1 <= weight <= 100:
            raise PolicyError(f"{SETTING}: {name}: weight must be 1..100")
        return weight
    if key == "priorities":
        chosen = set() if value.lower() in ("", "none") else {_priority(p, name) for p in value.split("|")}
        return frozenset(chosen & ENTITLED)
    raise PolicyError(f"{SETTING}: {name}: unknown key {key!r} (max_pending, rate_per_s, burst, priorities, weight)")


class CallerSettings(Protocol):
    """The settings a caller's policy is made of (`sieve.settings.Settings` has them). This module is below the
    settings: `Settings` checks SIEVE_CALLER_POLICIES with `parse_policies` when it loads."""

    @property
    def caller_policies(self) -> str: ...
    @property
    def caller_max_pending(self) -> int: ...
    @property
    def caller_max_pending_fraction(self) -> float: ...
    @property
    def max_total_pending(self) -> int: ...
    @property
    def caller_submit_rate_per_s(self) -> float: ...
    @property
    def caller_submit_burst(self) -> int: ...


def default_max_pending(settings: CallerSettings) -> int:
    """A caller's quota of open tasks when the settings give none: a fraction of the global limit (at least 1)."""
    if settings.caller_max_pending > 0:
        return settings.caller_max_pending
    return max(1, math.floor(settings.max_total_pending * settings.caller_max_pending_fraction))


class CallerPolicies:
    """Resolves the policy of each caller from the settings (parsed once)."""

    def __init__(self, settings: CallerSettings) -> None:
        self.overrides = parse_policies(settings.caller_policies)
        rate = settings.caller_submit_rate_per_s
        self.client_base = CallerPolicy(
            default_max_pending(settings), rate if rate > 0 else None, settings.caller_submit_burst, frozenset()
        )
        self.operator_base = CallerPolicy(None, None, settings.caller_submit_burst, ENTITLED)

    def policy(self, name: str, *, operator: bool) -> CallerPolicy:
        base = self.operator_base if operator else self.client_base
        override = self.overrides.get(name)
        if override is None:
            return base
        policy = replace(base, **override.fields)  # type: ignore[arg-type]
        if "rate_per_s" in override.fields and "burst" not in override.fields and policy.rate_per_s is not None:
            policy = replace(policy, burst=max(1, math.ceil(2 * policy.rate_per_s)))
        return replace(policy, priorities=ENTITLED) if operator else policy

    def weight(self, name: str) -> int:
        """The caller's weight in the fair order (1 unless its entry gives one)."""
        override = self.overrides.get(name)
        value = override.fields.get("weight", 1) if override is not None else 1
        return value if isinstance(value, int) else 1

    @property
    def all_weights(self) -> tuple[int, ...]:
        """Every caller weight in use (1 and each one an entry gives), ascending."""
        return tuple(sorted({1, *(self.weight(name) for name in self.overrides)}))


__all__ = [
    "ENTITLED",
    "CallerPolicies",
    "CallerPolicy",
    "CallerSettings",
    "PolicyError",
    "default_max_pending",
    "parse_policies",
]

"""External detection providers (design 004): SIEVE_EXTERNAL_PROVIDERS read into typed, checked objects.

The setting is a JSON object, provider name -> its settings::

    {"vmod": {"base_url": "https://vmod.example.com/v1", "max_slots": 18, "poll_interval_s": 10,
              "timeout_s": 1800, "cost_per_job": 0.02}}

Optional keys: `handler` (the plugin that speaks to it; "http-async", the only one shipped), `kind`
("moderation": the output is a JSON with `verdict` and `hits`, the task's result; "artifact": the output is kept
as the result's artifact), `stages` (the job's steps in order, default one stage named "job"). A stage is a name or
`{"name": ..., "pool": ..., "max_slots": N}`: each stage runs under a slot of its pool (default: a pool named after
the provider, of `max_slots`), and a pool named by several stages or providers must have one maximum. A bad value
is a `ExternalConfigError` naming the variable, the provider and the key: the service does not start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

VARIABLE = "SIEVE_EXTERNAL_PROVIDERS"
#: names of providers, stages and pools: they end up in metric labels, Redis key names and slot holders
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
NAME_RULE = "must be 1 to 63 of a-z 0-9 _ . - (starting with a letter or digit)"
HANDLERS = ("http-async",)
KINDS = ("moderation", "artifact")
DEFAULT_STAGE = "job"
_KEYS = frozenset(
    {"base_url", "max_slots", "poll_interval_s", "timeout_s", "cost_per_job", "handler", "kind", "stages"}
)
_STAGE_KEYS = frozenset({"name", "pool", "max_slots"})


class ExternalConfigError(ValueError):
    """SIEVE_EXTERNAL_PROVIDERS could not be read; the message names the provider and the key."""


@dataclass(frozen=True, slots=True)
class StageConfig:
    """One step of a provider's jobs, run under a slot of `pool` (at most `max_slots` at once)."""

    name: str
    pool: str
    max_slots: int


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """One provider: where it is, how many jobs it runs at once, how often its jobs are polled, how long a job may
    take in all (its deadline, s), what a job costs, and its stages in order."""

    name: str
    base_url: str
    max_slots: int
    poll_interval_s: float = 10.0
    timeout_s: float = 1800.0
    cost_per_job: float = 0.0
    handler: str = "http-async"
    kind: str = "moderation"
    stages: tuple[StageConfig, ...] = ()

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    def stage(self, index: int) -> StageConfig:
        return self.stages[index]


@dataclass(frozen=True, slots=True)
class ExternalConfig:
    """Every configured provider, by name, and the slot pools their stages use (pool -> max slots)."""

    providers: dict[str, ProviderConfig]

    @property
    def pools(self) -> dict[str, int]:
        return {s.pool: s.max_slots for p in self.providers.values() for s in p.stages}

    @property
    def first_pools(self) -> dict[str, int]:
        """The pools a new job needs a slot of first (each provider's first stage)."""
        return {p.stages[0].pool: p.stages[0].max_slots for p in self.providers.values()}

    @property
    def hosts(self) -> list[str]:
        """The providers' hosts: the outbound allow-list of the engine."""
        return sorted({p.host for p in self.providers.values()})

    @property
    def max_timeout_s(self) -> float:
        """The longest an external job may take at any provider: its timeout_s per stage and once more for the
        finish (the scheduler's execution timeout of EXTERNAL tasks)."""
        return max((p.timeout_s * (len(p.stages) + 1) for p in self.providers.values()), default=1800.0)

    def get(self, name: str) -> ProviderConfig | None:
        return self.providers.get(name)

    @classmethod
    def parse(cls, raw: str) -> ExternalConfig:
        """From the setting's text ("" or "{}": no provider); ExternalConfigError naming what is wrong."""
        if not raw.strip():
            return cls({})
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ExternalConfigError(f"{VARIABLE} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ExternalConfigError(f"{VARIABLE} must be a JSON object: provider name -> settings")
        providers = {name: _provider(name, value) for name, value in data.items()}
        config = cls(providers)
        _check_pools(config)
        return config


def _fail(provider: str, key: str, why: str) -> ExternalConfigError:
    return ExternalConfigError(f"{VARIABLE}: provider {provider!r}: {key} {why}")


def _number(provider: str, data: Mapping[str, Any], key: str, default: float, *, minimum: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not minimum <= value < float("inf"):
        raise _fail(provider, key, f"must be a number of at least {minimum:g}")
    return float(value)


def _count(provider: str, data: Mapping[str, Any], key: str, default: int | None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise _fail(provider, key, "must be a whole number from 1 to 100000")
    return value


def _provider(name: str, value: object) -> ProviderConfig:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ExternalConfigError(
            f"{VARIABLE}: provider name {name!r} must be 1 to 63 of a-z 0-9 _ . - (starting with a letter or digit)"
        )
    if not isinstance(value, dict):
        raise _fail(name, "its settings", "must be a JSON object")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise _fail(name, unknown[0], f"is not a setting (known: {', '.join(sorted(_KEYS))})")
    base_url = value.get("base_url")
    parts = urlsplit(base_url) if isinstance(base_url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise _fail(name, "base_url", "must be an http(s) URL without query or fragment")
    if parts.username is not None or parts.password is not None:
        raise _fail(name, "base_url", "must not carry a user name or password")
    max_slots = _count(name, value, "max_slots", None)
    handler = value.get("handler", "http-async")
    if handler not in HANDLERS:
        raise _fail(name, "handler", f"must be one of {', '.join(HANDLERS)}")
    kind = value.get("kind", "moderation")
    if kind not in KINDS:
        raise _fail(name, "kind", f"must be one of {', '.join(KINDS)}")
    return ProviderConfig(
        name=name,
        base_url=str(base_url).rstrip("/"),
        max_slots=max_slots,
        poll_interval_s=_number(name, value, "poll_interval_s", 10.0, minimum=0.01),
        timeout_s=_number(name, value, "timeout_s", 1800.0, minimum=0.1),
        cost_per_job=_number(name, value, "cost_per_job", 0.0, minimum=0.0),
        handler=str(handler),
        kind=str(kind),
        stages=_stages(name, value.get("stages"), max_slots),
    )


def _stages(provider: str, raw: object, max_slots: int) -> tuple[StageConfig, ...]:
    if raw is None:
        return (StageConfig(DEFAULT_STAGE, provider, max_slots),)
    if not isinstance(raw, list) or not raw or len(raw) > 16:
        raise _fail(provider, "stages", "must be a list of 1 to 16 stages")
    stages: list[StageConfig] = []
    for i, item in enumerate(raw):
        key = f"stages[{i}]"
        entry: dict[str, Any] = {"name": item} if isinstance(item, str) else item if isinstance(item, dict) else {}
        if not entry:
            raise _fail(provider, key, "must be a stage name or an object with a name")
        unknown = sorted(set(entry) - _STAGE_KEYS)
        if unknown:
            raise _fail(provider, f"{key}.{unknown[0]}", "is not a stage setting (name, pool, max_slots)")
        name, pool = entry.get("name"), entry.get("pool", provider)
        for what, text in (("name", name), ("pool", pool)):
            if not isinstance(text, str) or not NAME.fullmatch(text):
                raise _fail(provider, f"{key}.{what}", NAME_RULE)
        if any(s.name == name for s in stages):
            raise _fail(provider, f"{key}.name", f"{name!r} appears twice")
        stages.append(StageConfig(str(name), str(pool), _count(provider, entry, "max_slots", max_slots)))
    return tuple(stages)


def _check_pools(config: ExternalConfig) -> None:
    """A pool that several stages name has one maximum."""
    seen: dict[str, tuple[int, str]] = {}
    for provider in config.providers.values():
        for stage in provider.stages:
            first = seen.setdefault(stage.pool, (stage.max_slots, f"{provider.name}/{stage.name}"))
            if first[0] != stage.max_slots:
                raise ExternalConfigError(
                    f"{VARIABLE}: pool {stage.pool!r} has max_slots {first[0]} for {first[1]} and {stage.max_slots} "
                    f"for {provider.name}/{stage.name}: one pool, one maximum"
                )

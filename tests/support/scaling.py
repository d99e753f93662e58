"""The KEDA ScaledObjects of deploy/k8s and the metric selectors their Prometheus triggers query (for the tests of
tests/unit/deploy/test_scaling.py and tests/e2e/test_scaling_metrics.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
#: a metric name with its optional {label="value", ...} matchers, inside a PromQL query
_SELECTOR = re.compile(r"\b(sieve_[a-z0-9_]+)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


@dataclass(frozen=True)
class Selector:
    """One metric a query reads, and the label values it keeps (only `=` matchers are used here)."""

    metric: str
    labels: tuple[tuple[str, str], ...]


def manifests() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def scaled_objects() -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] == "ScaledObject"]


def selectors(query: str) -> list[Selector]:
    found = []
    for m in _SELECTOR.finditer(query):
        matchers = m.group(2) or ""
        assert "!=" not in matchers and "=~" not in matchers, f"only = matchers are checked: {query}"
        found.append(Selector(m.group(1), tuple(_MATCHER.findall(matchers))))
    return found


def prometheus_queries() -> list[tuple[str, str, str]]:
    """(ScaledObject, trigger name, query) of every Prometheus trigger."""
    return [
        (obj["metadata"]["name"], t.get("name", ""), t["metadata"]["query"])
        for obj in scaled_objects()
        for t in obj["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]


__all__ = ["K8S", "Selector", "manifests", "prometheus_queries", "scaled_objects", "selectors"]

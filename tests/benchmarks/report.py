"""The benchmark report: one row per target (what was measured, both sides of each ratio, the target, pass or
miss), printed as a table and written as JSON by `python -m tests.benchmarks`."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

Value = float | int | str | bool | None


@dataclass
class Row:
    """One target of one benchmark: `measured` says it for people ("4 128 / 1 277 tasks/s = 3.23 x"),
    `values` holds the raw numbers (both sides of a ratio) for the JSON report; `passed` is None for a row
    without a target (context, such as the raw throughput)."""

    benchmark: str
    name: str
    measured: str
    target: str
    passed: bool | None
    values: dict[str, Value] = field(default_factory=dict)
    note: str = ""

    @property
    def missed(self) -> bool:
        return self.passed is False


def failed_row(benchmark: str, name: str, target: str, error: str) -> Row:
    """A benchmark that could not measure: its target counts as missed."""
    return Row(benchmark, name, "not measured", target, False, {"error": error}, note=error)


def num(value: float, digits: int = 0) -> str:
    """1234.5 -> "1 234" (a thin space between thousands, as the README writes numbers)."""
    text = f"{value:,.{digits}f}"
    return text.replace(",", " ")


@dataclass
class Report:
    """Every row of one run, and where and how it ran."""

    smoke: bool
    selected: list[str]
    rows: list[Row] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, rows: Iterable[Row]) -> None:
        self.rows.extend(rows)

    @property
    def missed(self) -> list[Row]:
        return [row for row in self.rows if row.missed]

    def as_dict(self) -> dict[str, object]:
        load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
        return {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started_at)),
            "smoke": self.smoke,
            "selected": self.selected,
            "host": {
                "cpus": os.cpu_count(),
                "load_average_1m": round(load[0], 2),
                "python": platform.python_version(),
                "machine": platform.machine(),
            },
            "seconds_per_benchmark": {k: round(v, 1) for k, v in self.seconds.items()},
            "rows": [asdict(row) for row in self.rows],
            "missed": [f"{row.benchmark}: {row.name}" for row in self.missed],
            "passed": not self.missed,
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n")

    def table(self) -> str:
        """A Markdown table: benchmark, target name, measured (both sides), target, result."""
        header = ("benchmark", "what", "measured", "target", "result")
        lines = [header] + [(r.benchmark, r.name, r.measured, r.target, _verdict(r)) for r in self.rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

        def fmt(cells: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

        out = [fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += [fmt(line) for line in lines[1:]]
        notes = [f"- {r.benchmark} / {r.name}: {r.note}" for r in self.rows if r.note]
        return "\n".join(out + (["", *notes] if notes else []))


def _verdict(row: Row) -> str:
    return "-" if row.passed is None else ("pass" if row.passed else "MISSED")

"""What the CLI prints: tables for people (rich), JSON for scripts (`-o json`), and the small formats they share.

Tables and messages for people go to stdout, progress bars and errors to stderr, so `-o json` output on stdout
is always exactly one JSON document (or, for a stream, one JSON object per line).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.table import Table

from sieve.enums import enum_label, enum_value
from sieve.v1 import types_pb2

FORMATS = ("table", "json")


#: the width of tables written to a pipe or a file (a terminal's own width is used on a terminal): wide enough that
#: task ids and addresses stay on one line for grep and friends
PIPE_WIDTH = 250


def console() -> Console:
    """The console for people: stdout as it is now (click's test runner swaps it)."""
    return Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)


def err_console() -> Console:
    return Console(file=sys.stderr, highlight=False)


def to_dict(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data: field names as in the proto (snake_case), enums by name."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def print_json(data: object) -> None:
    """One JSON document on stdout (non-ASCII text as it is)."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2, sort_keys=False) + "\n")


def print_json_line(data: object) -> None:
    """One JSON object on one line (streams: one per event)."""
    sys.stdout.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """A rich table of `rows` (each cell shown as text; None as "")."""
    out = Table(title=title, title_justify="left", header_style="bold", expand=False)
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*("" if cell is None else str(cell) for cell in row))
    return out


def name(enum: EnumTypeWrapper, value: int) -> str:
    """An enum value without its prefix ("SUCCEEDED"); "" for the unspecified value."""
    return "" if value == 0 else enum_label(enum, value)


def status(value: int) -> str:
    return name(types_pb2.TaskStatus, value)


def verdict(value: int) -> str:
    return name(types_pb2.Verdict, value)


def task_type(value: int) -> str:
    return name(types_pb2.TaskType, value)


def task_type_of(label: str | None) -> types_pb2.TaskType:
    """ "ocr_image" -> TASK_TYPE_OCR_IMAGE; None -> unspecified."""
    return enum_value(types_pb2.TaskType, types_pb2.TaskType.Value(f"TASK_TYPE_{label.upper()}") if label else 0)


def status_of(label: str) -> types_pb2.TaskStatus:
    return enum_value(types_pb2.TaskStatus, types_pb2.TaskStatus.Value(f"TASK_STATUS_{label.upper()}"))


def verdict_of(label: str | None) -> types_pb2.Verdict:
    return enum_value(types_pb2.Verdict, types_pb2.Verdict.Value(f"VERDICT_{label.upper()}") if label else 0)


def priority_of(label: str) -> types_pb2.Priority:
    return enum_value(types_pb2.Priority, types_pb2.Priority.Value(f"PRIORITY_{label.upper()}"))


def when(ts: Timestamp) -> str:
    """A timestamp as UTC "2026-12-02 14:03:07.123" ("" when unset)."""
    if ts.seconds == 0 and ts.nanos == 0:
        return ""
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def age(ts: Timestamp, now: datetime | None = None) -> str:
    """How long ago `ts` was: "3.2s", "4m05s", "2h10m" ("" when unset)."""
    if ts.seconds == 0 and ts.nanos == 0:
        return ""
    now = now or datetime.now(UTC)
    return seconds((now - ts.ToDatetime(tzinfo=UTC)).total_seconds())


def seconds(value: float) -> str:
    """A duration for people: "850ms", "3.2s", "4m05s", "2h10m"."""
    value = max(value, 0.0)
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def duration(d: Duration) -> str:
    return seconds(d.seconds + d.nanos / 1e9)


def labels(values: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items()))


def percent(value: float) -> str:
    return f"{value:.0f}%"


def size(n: int) -> str:
    """Bytes as "512B", "3.4KiB", "1.2GiB"."""
    amount = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f}{unit}" if unit == "B" else f"{amount:.1f}{unit}"
        amount /= 1024
    return f"{amount:.1f}TiB"


__all__ = [
    "FORMATS",
    "age",
    "console",
    "duration",
    "err_console",
    "labels",
    "name",
    "percent",
    "print_json",
    "print_json_line",
    "priority_of",
    "seconds",
    "size",
    "status",
    "status_of",
    "table",
    "task_type",
    "task_type_of",
    "to_dict",
    "verdict",
    "verdict_of",
    "when",
]

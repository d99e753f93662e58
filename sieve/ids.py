"""Time-ordered task ids: UUIDv7 (RFC 9562), generated where the intake records a task.

A UUIDv7 starts with its 48-bit Unix time in milliseconds, then the version (7), 12 random bits, the
variant (10) and 62 random bits. Ids made later sort later (to the millisecond), so PostgreSQL can
range-partition the tasks table by id: a day's partition is `[floor(day), floor(next day))`, where
`floor(ms)` is the smallest UUID carrying that millisecond (every other bit zero). A lookup by id prunes
to one partition and the primary key stays the plain id (sieve/db/retention.py).

Python 3.11's `uuid` module has no uuid7; this is the one generator the services share.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime

_MAX_MS = (1 << 48) - 1


def uuid7(ms: int | None = None) -> uuid.UUID:
    """A new UUIDv7 for the Unix time `ms` (milliseconds; default: now)."""
    return _uuid7s(time.time_ns() // 1_000_000 if ms is None else ms, 1)[0]


def uuid7_many(moment: datetime, n: int) -> list[uuid.UUID]:
    """`n` new UUIDv7s for one aware datetime (a batch's tasks, created together): one read of the random source."""
    return _uuid7s(datetime_ms(moment), n)


def _uuid7s(ms: int, n: int) -> list[uuid.UUID]:
    if not 0 <= ms <= _MAX_MS:
        raise ValueError(f"{ms} ms is outside the 48-bit UUIDv7 clock")
    head = (ms << 80) | (0x7 << 76) | (0b10 << 62)
    randomness = os.urandom(10 * n)  # 80 bits each, of which 74 are used: 12 after the version, 62 after the variant
    out = []
    for i in range(0, 10 * n, 10):
        rand = int.from_bytes(randomness[i : i + 10], "big")
        out.append(uuid.UUID(int=head | ((rand >> 68) << 64) | (rand & ((1 << 62) - 1))))
    return out


def uuid7_at(moment: datetime) -> uuid.UUID:
    """A new UUIDv7 for an aware datetime."""
    return uuid7(datetime_ms(moment))


def uuid7_floor(ms: int) -> uuid.UUID:
    """The smallest UUID whose first 48 bits are `ms`: below every UUIDv7 made at or after that
    millisecond, above every one made before it (a partition bound)."""
    if not 0 <= ms <= _MAX_MS:
        raise ValueError(f"{ms} ms is outside the 48-bit UUIDv7 clock")
    return uuid.UUID(int=ms << 80)


def uuid7_ms(value: uuid.UUID) -> int | None:
    """The Unix time (ms) a UUIDv7 was made at; None for other versions (the random v4 ids of tasks
    recorded before ids were time-ordered)."""
    if value.version != 7:
        return None
    return value.int >> 80


def datetime_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no defined instant")
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000

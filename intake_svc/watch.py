"""WatchTask for the intake: a `WatchTaskRequest` checked and scoped to its caller, its stream fed from the change
feed (sieve/db/task_changes.py), the cursors, and the bounds on open streams.

A stream reads the feed whenever a change is recorded (NOTIFY, sieve/db/listener.py) and at least every
SIEVE_WATCH_POLL_INTERVAL_S, and sends what it read (`ROWS_PER_READ` feed rows) in responses of at most
`CHANGES_PER_RESPONSE` changes. Every change carries a cursor: the reader's `Position` just after it, opaque to the
caller (base64 of a version, two snapshots, a feed row's id and the change's index in it). A stream resumed from a
change's cursor goes on with the change after it — none missed, none repeated; a cursor older than the feed's
history (SIEVE_WATCH_HISTORY_S) is OUT_OF_RANGE, a made-up one INVALID_ARGUMENT naming `cursor`. At shutdown every
stream ends with UNAVAILABLE: resume elsewhere from its cursor.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from intake_svc.listing import NotPermitted, caller_scope
from intake_svc.result_view import timestamp_of
from intake_svc.validation import checked_labels, parse_device, parse_task_id
from sieve.db.listener import ChangeSignal
from sieve.db.task_changes import BadPosition, Change, ChangeFilter, Position, TaskChangeStore, check_snapshot
from sieve.db.task_changes import snapshot_xmin as xmin_of
from sieve.db.tasks import status_value
from sieve.enums import enum_value
from sieve.errors import InvalidInput
from sieve.fields import shown
from sieve.rpc.auth import Principal
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2

#: feed rows one read takes (a row is one statement's changes: up to a batch of tasks)
ROWS_PER_READ = 20
#: the most changes one response carries (a read's are sent in as many responses as they need)
CHANGES_PER_RESPONSE = 500
MAX_TASK_IDS = 1000
MAX_CALLER = 200
_CURSOR_VERSION = "w3"


class TooManyStreams(Exception):
    """The caller (or this replica) has as many streams open as it may."""


class CursorExpired(Exception):
    """The cursor is older than the changes kept."""


class UnknownTasks(Exception):
    """initial_state was asked for tasks the caller has not got."""

    def __init__(self, task_ids: list[str]) -> None:
        super().__init__(f"no task {', '.join(task_ids[:5])}{' ...' if len(task_ids) > 5 else ''}")


class Revoked(Exception):
    """The credential the stream was opened with is no longer valid."""


class ShuttingDown(Exception):
    """The intake is stopping: the stream ends, to be resumed from its cursor."""


def encode_cursor(position: Position) -> str:
    upto = "" if position.upto is None else str(position.upto)
    text = f"{_CURSOR_VERSION};{position.seen};{position.reading};{position.last_id};{upto}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(raw: str) -> Position:
    """The position a cursor names, or InvalidInput naming `cursor`."""
    try:
        if len(raw) > 200_000:
            raise ValueError
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("ascii")
        version, seen, reading, last_id, upto = text.split(";")
        if version != _CURSOR_VERSION or not last_id.isdigit() or len(last_id) > 18:
            raise ValueError
        if upto and (not upto.isdigit() or len(upto) > 15):
            raise ValueError
        position = Position(check_snapshot(seen), check_snapshot(reading), int(last_id), int(upto) if upto else None)
    except (ValueError, binascii.Error, UnicodeDecodeError, BadPosition):
        raise InvalidInput("cursor", "is not a cursor WatchTask gave") from None
    if xmin_of(position.reading) < xmin_of(position.seen):
        raise InvalidInput("cursor", "is not a cursor WatchTask gave")
    return position


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """A checked WatchTaskRequest."""

    scope: ChangeFilter
    position: Position | None
    initial_state: bool


def parse_request(request: intake_pb2.WatchTaskRequest, principal: Principal) -> WatchRequest:
    """InvalidInput naming a bad field, NotPermitted for a client naming another caller."""
    if len(request.task_ids) > MAX_TASK_IDS:
        raise InvalidInput("task_ids", f"at most {MAX_TASK_IDS} tasks per stream")
    task_ids = list(dict.fromkeys(parse_task_id(t, f"task_ids[{i}]") for i, t in enumerate(request.task_ids)))
    scope = ChangeFilter(
        caller=caller_scope(request.caller, principal, "watch the tasks of"),
        task_ids=task_ids,
        device=parse_device(request.device_id) if request.device_id else None,
        labels=checked_labels(request.labels, "labels"),
    )
    position = decode_cursor(request.cursor) if request.cursor else None
    if request.initial_state and not task_ids:
        raise InvalidInput("initial_state", "needs task_ids")
    if request.initial_state and position is not None:
        raise InvalidInput("initial_state", "goes without a cursor (a cursor resumes where the stream was)")
    return WatchRequest(scope, position, request.initial_state)


def change_message(change: Change, cursor: str) -> intake_pb2.TaskChange:
    message = intake_pb2.TaskChange(
        task_id=str(change.task_id),
        device_id=change.device,
        caller=change.caller,
        status=enum_value(types_pb2.TaskStatus, status_value(change.status)),
        at=timestamp_of(change.at),
        attempt=max(0, change.attempt),
        detail=change.detail,
        sequence=change.seq,
        cursor=cursor,
    )
    if change.verdict is not None:
        message.verdict = enum_value(types_pb2.Verdict, types_pb2.Verdict.Value("VERDICT_" + change.verdict))
    return message


class WatchHub:
    """The WatchTask streams of one intake replica: the change signal that wakes them (one LISTEN connection for
    all), how many each caller has open (at most SIEVE_WATCH_MAX_STREAMS_PER_CALLER, SIEVE_WATCH_MAX_STREAMS in
    all), and their end at shutdown (`close`)."""

    def __init__(self, store: TaskChangeStore, settings: Settings, signal: ChangeSignal | None = None) -> None:
        self.store = store
        self.settings = settings
        self.signal = signal or ChangeSignal(settings.database_url, settings.database_schema)
        self.open_streams: Counter[str] = Counter()
        self.closing = False

    async def run(self) -> None:
        """The change signal's LISTEN (a background loop of the intake)."""
        await self.signal.run()

    def close(self) -> None:
        """Ends every stream (they answer UNAVAILABLE) and refuses new ones."""
        self.closing = True
        self.signal.wake_all()

    @contextlib.contextmanager
    def slot(self, caller: str) -> Iterator[None]:
        """Holds one of the caller's streams while the stream runs; TooManyStreams when none is free."""
        if self.closing:
            raise ShuttingDown
        if self.open_streams[caller] >= self.settings.watch_max_streams_per_caller:
            raise TooManyStreams(
                f"caller {shown(caller)} has {self.open_streams[caller]} WatchTask streams open, "
                f"the most it may (SIEVE_WATCH_MAX_STREAMS_PER_CALLER)"
            )
        if self.open_streams.total() >= self.settings.watch_max_streams:
            raise TooManyStreams("this intake has as many WatchTask streams open as it may (SIEVE_WATCH_MAX_STREAMS)")
        self.open_streams[caller] += 1
        try:
            yield
        finally:
            self.open_streams[caller] -= 1
            if self.open_streams[caller] <= 0:
                del self.open_streams[caller]

    async def stream(
        self, watch: WatchRequest, still_valid: Callable[[], bool] = lambda: True
    ) -> AsyncIterator[intake_pb2.WatchTaskResponse]:
        """The responses of one stream, until the client goes, the intake stops (ShuttingDown) or the caller's
        credential stops being valid (Revoked: looked at on every read, idle or not)."""
        generation = self.signal.generation
        if watch.position is None and watch.initial_state:
            current, position = await self.store.current(watch.scope.task_ids, watch.scope.caller)
            missing = {str(t) for t in watch.scope.task_ids} - {str(c.task_id) for c in current}
            if missing:
                raise UnknownTasks(sorted(missing))
            cursor = encode_cursor(position)
            yield intake_pb2.WatchTaskResponse(changes=[change_message(c, cursor) for c in current])
        elif watch.position is None:
            position = await self.store.now()
        else:
            position = watch.position
            if xmin_of(position.seen) <= await self.store.purged_up_to():
                raise CursorExpired
        while not self.closing:
            if not still_valid():
                raise Revoked
            page = await self.store.read(watch.scope, position, ROWS_PER_READ)
            for start in range(0, len(page.changes), CHANGES_PER_RESPONSE):
                yield intake_pb2.WatchTaskResponse(
                    changes=[
                        change_message(c, encode_cursor(Position(position.seen, page.reading, c.id, c.index)))
                        for c in page.changes[start : start + CHANGES_PER_RESPONSE]
                    ]
                )
            position = page.position
            if page.cut:
                continue
            generation = await self.signal.wait(generation, self.settings.watch_poll_interval_s)
        raise ShuttingDown


__all__ = [
    "CursorExpired",
    "NotPermitted",
    "Revoked",
    "ShuttingDown",
    "TooManyStreams",
    "UnknownTasks",
    "WatchHub",
    "WatchRequest",
    "decode_cursor",
    "encode_cursor",
    "parse_request",
]

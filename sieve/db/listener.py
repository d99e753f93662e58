"""A LISTEN on its own PostgreSQL connection that survives restarts: `ChangeSignal` wakes its waiters on each
NOTIFY of its channel for this schema — sieve_task_changes (a task change was recorded: WatchTask) or
sieve_callbacks (a callback delivery was added: the notifier), migration 0014 — and reconnects by itself when the
connection drops.

The pooled connections never LISTEN (sieve/db/__init__.py releases them without asyncpg's reset query), so the
signal keeps one connection of its own. A waiter never relies on it alone: `wait` has a timeout, and a watcher
polls when it passes, so a notification lost to a reconnect only delays a change by that timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

log = logging.getLogger("sieve.db.listener")

CHANGES = "sieve_task_changes"
CALLBACKS = "sieve_callbacks"
#: how long to wait before connecting again after the connection failed
RECONNECT_S = 1.0


class ChangeSignal:
    """Wakes everyone waiting when its channel is notified for this schema (or a notification may have been
    missed: after a reconnect everyone is woken, to poll)."""

    def __init__(self, database_url: str, schema: str, channel: str = CHANGES) -> None:
        self.database_url = database_url
        self.schema = schema
        self.channel = channel
        self._generation = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        """Runs `run` as a task of its own (until `close`)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="sieve-change-signal")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def generation(self) -> int:
        """Grows by one at each wake-up: a waiter that saw generation g waits for a later one."""
        return self._generation

    async def wait(self, after: int, timeout_s: float) -> int:
        """Waits until a wake-up later than `after` or for `timeout_s`; returns the generation then."""
        if self._generation <= after:
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancel that comes as the event is set
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait()
        return self._generation

    def wake_all(self) -> None:
        """Wakes every waiter now (a stop: they look at why themselves)."""
        self._wake()

    def _wake(self) -> None:
        # every waiter holds the event of its generation: set it, and give later waiters a fresh one
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == self.schema:
            self._wake()

    async def run(self) -> None:
        """LISTENs until cancelled, connecting again whenever the connection is lost."""
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self.database_url)
                await conn.add_listener(self.channel, self._on_notify)
                self.connected.set()
                self._wake()  # what changed while no one listened: poll once
                closed = asyncio.Event()
                conn.add_termination_listener(_setter(closed))
                await closed.wait()
                log.warning("change signal: connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("change signal: %s; retrying in %.0f s", exc, RECONNECT_S)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 2.0)
            await asyncio.sleep(RECONNECT_S)


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    return lambda _conn: event.set()

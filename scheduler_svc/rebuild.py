"""Redis is not the record: when it comes back empty, its queues are rebuilt from PostgreSQL.

Redis holds a generation key while its queues match PostgreSQL. Intake refuses to enqueue without it
(UNAVAILABLE: clients retry), so a Redis that lost its memory takes no half-state. One scheduler replica
takes the rebuild lock and re-queues every unfinished task in the order it entered its queue, with its
attempt counts and lease numbers (so fencing still tells old hand-outs from new ones) and their callers (so
that each caller's count of open tasks, which its pending quota is checked against, is rebuilt by the same
enqueue), refills the dead-letter list, and writes a new generation. Tasks that were running are queued again:
their workers' late results or acks are refused if the new hand-out overtook them.

Shards (`redis_shards` > 1): each shard has its own generation key, and a shard without one is rebuilt alone — a
Redis Cluster master restarted empty loses only the shards it held: their devices' unfinished tasks and dead
letters are queued again, the other shards' are left as they are (they still hold theirs).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict

from sieve.db.tasks import TaskStore, type_value
from sieve.redis.dead_letter_store import DeadLetterStore
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.redis.scheduler_state import SchedulerState

log = logging.getLogger("sieve.scheduler.rebuild")


class ShardCountChanged(RuntimeError):
    """Redis holds shards made with another number of shards than the settings say."""


#: the rebuild lock expires if its holder dies mid-way, so another replica can take over
REBUILD_LOCK_S = 120


def _ms(moment: object) -> int:
    return int(moment.timestamp() * 1000)  # type: ignore[attr-defined]


class Rebuilder:
    """Owns the rebuild of an empty Redis from PostgreSQL (see the module): the check that Redis still holds its
    generation, the rebuild lock, and the re-queueing of every unfinished task and the recent dead letters."""

    def __init__(self, queues: QueueStore, tasks: TaskStore) -> None:
        self.queues = queues
        self.state = SchedulerState(queues)
        self.letters = DeadLetterStore(queues)
        self.tasks = tasks
        self.rebuilds = 0

    async def ensure(self) -> bool:
        """Rebuilds Redis from PostgreSQL if it lost its memory; True when this call rebuilt it."""
        if await self.queues.generation() is not None:
            return False
        token = uuid.uuid4().hex
        if not await self.state.take_rebuild_lock(token, REBUILD_LOCK_S):
            return False  # another replica is rebuilding
        try:
            lost = await self.queues.lost_shards()
            if not lost:
                return False
            await self._check_shard_count(lost)
            shards = None if len(lost) == self.queues.shards else lost
            queued, dead = await self.rebuild(shards)
            generation = uuid.uuid4().hex
            await self.queues.mark_rebuilt(generation, shards=lost)
            self.rebuilds += 1
            log.warning(
                "Redis rebuilt from PostgreSQL%s: %d unfinished tasks queued, %d dead letters, generation %s",
                "" if shards is None else f" (shards {', '.join(map(str, lost))} of {self.queues.shards})",
                queued,
                dead,
                generation,
            )
            return True
        finally:
            await self.state.drop_rebuild_lock(token)

    async def _check_shard_count(self, lost: list[int]) -> None:
        """A shard that kept its memory must have been made with this number of shards: after a change of
        redis_shards its devices' tasks are still in the shards of the old mapping, and rebuilding the others beside
        it would queue them twice. Raises ShardCountChanged (the scheduler stays NOT_SERVING, saying why)."""
        n = self.queues.shards
        kept = [s for s in range(n) if s not in lost]
        if n == 1 or not kept:
            return
        wrong = {s: c for s, c in (await self.queues.shard_counts(kept)).items() if c != n}
        if wrong:
            raise ShardCountChanged(
                f"Redis holds shards made with another SIEVE_REDIS_SHARDS (shard {min(wrong)}: "
                f"{wrong[min(wrong)] or 1} shards, the settings say {n}): devices would be in two shards. Set "
                "SIEVE_REDIS_SHARDS back, or empty Redis (the scheduler rebuilds it from PostgreSQL)"
            )

    async def rebuild(self, shards: list[int] | None = None) -> tuple[int, int]:
        """Queues every unfinished task again (of the devices of the given shards; None: all) and refills the
        dead-letter lists; returns (tasks queued, dead letters)."""
        only = None if shards is None else set(shards)
        queued = 0
        async for rows in self.tasks.open_tasks():
            groups: dict[str, list[Entry]] = defaultdict(list)
            for r in rows:
                if only is not None and self.queues.shard_of(r["device"]) not in only:
                    continue
                groups[r["device"]].append(
                    Entry(
                        str(r["id"]),
                        type_value(r["type"]),
                        r["priority"],
                        _ms(r["enqueued_at"]),
                        _ms(r["expires_at"]),
                        attempt=r["lease"],
                        failures=max(0, r["attempts"] - 1),
                        trace=r["trace_context"] or "",
                        caller=r["caller"],
                    )
                )
            if groups:
                await self.queues.enqueue_many(dict(groups), admit=False, rebuilding=True)
            queued += sum(len(entries) for entries in groups.values())
        dead = await self.tasks.recent_dead_letters(self.queues.settings.dead_letter_keep)
        if only is not None:
            dead = [r for r in dead if self.queues.shard_of(r["device"]) in only]
        if dead:
            now = now_ms()
            await self.letters.append(
                [
                    {
                        "task_id": str(r["id"]),
                        "device": r["device"],
                        "task_type": type_value(r["type"]),
                        "priority": r["priority"],
                        "error": r["error"] or "",
                        "attempts": r["attempts"],
                        "requeue_count": 0,
                        "enqueued_ms": _ms(r["enqueued_at"]),
                        "dead_ms": _ms(r["updated_at"]) or int(now),
                    }
                    for r in dead
                ]
            )
        return queued, len(dead)

"""The dead-letter list in Redis (`Keys.dead_letters`): the operators' view of tasks given up on.

The scripts that dead-letter a task push its record (a JSON object, newest first) and cap the list; this store
reads it, removes records by their exact text, empties it, and refills it when Redis is rebuilt from PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

from sieve.redis.queue_store import QueueStore
from sieve.redis.reply import reply

#: one dead letter: its exact text in the list (what removing it names) and its record
DeadLetter = tuple[str, dict[str, Any]]


class DeadLetterStore:
    """Reads and edits the dead-letter list (see the module), on the queue store's client and key schema."""

    def __init__(self, queues: QueueStore) -> None:
        self.redis = queues.redis
        self.key = queues.keys.dead_letters

    async def all(self) -> list[DeadLetter]:
        """Every dead letter, newest first."""
        return [(raw, json.loads(raw)) for raw in await reply(self.redis.lrange(self.key, 0, -1))]

    async def count(self) -> int:
        return int(await reply(self.redis.llen(self.key)))

    async def remove(self, raws: list[str]) -> int:
        """Removes one record of each given text (one pipelined round trip); returns how many were removed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for raw in raws:
                pipe.lrem(self.key, 1, raw)
            removed = await pipe.execute()
        return int(sum(removed))

    async def clear(self) -> int:
        """Empties the list; returns how many records it held."""
        count = await self.count()
        await reply(self.redis.delete(self.key))
        return count

    async def append(self, records: list[dict[str, Any]]) -> None:
        """Adds records at the end of the list (oldest last: a rebuild appends them newest first)."""
        await reply(self.redis.rpush(self.key, *(json.dumps(r) for r in records)))


__all__ = ["DeadLetter", "DeadLetterStore"]

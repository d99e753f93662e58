"""The dead-letter list in Redis (`Keys.dead_letters`): the operators' view of tasks given up on.

The scripts that dead-letter a task push its record (a JSON object, newest first) and cap the list; this store
reads it, removes records by their exact text, empties it, and refills it when Redis is rebuilt from PostgreSQL.
With several shards each shard has its own list (a device's dead letters are in its shard, each capped at
dead_letter_keep): this store reads them all, newest first.
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
        self.queues = queues
        #: the list of each shard (shard 0's is the only one with one shard)
        self.keys = [k.dead_letters for k in queues.shard_keys]
        self.key = self.keys[0]

    async def all(self) -> list[DeadLetter]:
        """Every dead letter, newest first."""
        if len(self.keys) == 1:
            return [(raw, json.loads(raw)) for raw in await reply(self.redis.lrange(self.key, 0, -1))]
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys:
                pipe.lrange(key, 0, -1)
            lists = await pipe.execute()
        letters = [(raw, json.loads(raw)) for raws in lists for raw in raws]
        return sorted(letters, key=lambda d: -float(d[1].get("dead_ms", 0) if isinstance(d[1], dict) else 0))

    async def count(self) -> int:
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys:
                pipe.llen(key)
            return int(sum(await pipe.execute()))

    async def remove(self, raws: list[str]) -> int:
        """Removes one record of each given text (one pipelined round trip); returns how many were removed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for raw in raws:
                pipe.lrem(self._key_of(raw), 1, raw)
            removed = await pipe.execute()
        return int(sum(removed))

    async def clear(self) -> int:
        """Empties the lists; returns how many records they held."""
        count = await self.count()
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in self.keys:
                pipe.delete(key)
            await pipe.execute()
        return count

    async def append(self, records: list[dict[str, Any]]) -> None:
        """Adds records at the end of their shard's list (oldest last: a rebuild appends them newest first)."""
        by_key: dict[str, list[str]] = {}
        for r in records:
            by_key.setdefault(self._key_of_device(str(r.get("device", ""))), []).append(json.dumps(r))
        for key, raws in by_key.items():
            await reply(self.redis.rpush(key, *raws))

    def _key_of_device(self, mac: str) -> str:
        return self.queues.keys_of(mac).dead_letters

    def _key_of(self, raw: str) -> str:
        """The list a record is in: its device's shard's."""
        if len(self.keys) == 1:
            return self.key
        try:
            return self._key_of_device(str(json.loads(raw).get("device", "")))
        except (ValueError, AttributeError):
            return self.key


__all__ = ["DeadLetter", "DeadLetterStore"]

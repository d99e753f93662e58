"""One snapshot of the queue counters a Redis prefix keeps: GET pending, the length of every device queue and the
backlog of every device's meta, found by SCAN through the key schema. The counter invariant is
pending == sum of queue lengths == sum of backlogs."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from tests.support.redis import keys_matching


@dataclass(frozen=True, slots=True)
class Counters:
    """The counters of one prefix at one moment."""

    pending: int
    #: queue list key -> LLEN
    queue_lengths: dict[str, int]
    #: meta hash key -> its backlog field (0 when the field is missing)
    backlogs: dict[str, int]

    @property
    def queued(self) -> int:
        return sum(self.queue_lengths.values())

    @property
    def backlog(self) -> int:
        return sum(self.backlogs.values())

    @property
    def consistent(self) -> bool:
        """pending == sum of queue lengths == sum of backlogs."""
        return self.pending == self.queued == self.backlog


async def counters(redis: Redis, keys: Keys) -> Counters:
    """The counters of `keys`' prefix (every shard's, `keys.shards`: pending summed), read in one pipeline after
    the SCANs."""
    queue_keys = await keys_matching(redis, keys.queue_pattern)
    meta_keys = await keys_matching(redis, keys.meta_pattern)
    shards = [Keys(keys.prefix, s, keys.shards) for s in range(keys.shards)]
    async with redis.pipeline(transaction=False) as pipe:
        for shard in shards:
            pipe.get(shard.pending)
        for key in queue_keys:
            pipe.llen(key)
        for key in meta_keys:
            pipe.hget(key, "backlog")
        values = await pipe.execute()
    n = len(shards)
    pending, lengths, backlogs = values[:n], values[n : n + len(queue_keys)], values[n + len(queue_keys) :]
    return Counters(
        sum(int(v or 0) for v in pending),
        dict(zip(queue_keys, map(int, lengths), strict=True)),
        {key: int(value or 0) for key, value in zip(meta_keys, backlogs, strict=True)},
    )

"""Scheduler replicas divide the shards of the keyspace between them by renewable leases.

Each shard has a lease key under the global tag (`Keys.shard_lease`, SET NX PX the replica's id). Twice a second
every replica takes one step (`balanceShards.lua`, one atomic call): it renews what it holds, gives back what it
holds beyond its target, and takes free shards up to it. The target is ceil(shards / live replicas), the live ones
being those whose sign of life (`Keys.schedulers`) is younger than the lease TTL: a replica that joins makes the
others give back their extras at their next step, and takes them at its own; a replica that stops gives its
leases back; one that dies stops renewing, and once its leases and its sign of life are older than the TTL the
others take its shards. What a replica holds decides the housekeeping it does for a shard (lease reclaim, delayed
tasks, backoff, devices whose dispatcher died); claims are safe from any replica (device locks and fencing are per
device, inside each shard's scripts), so dispatch does not wait for a lease. With one shard there is nothing to
divide: every replica sweeps it, as before shards existed, and no lease is taken.
"""

from __future__ import annotations

import math
import zlib

from redis.asyncio import Redis

from sieve.redis import lua
from sieve.redis.keys import Keys


class ShardLeases:
    """One replica's leases of shards (see the module): `balance` takes its step, `owned` is what it holds."""

    def __init__(self, redis: Redis, keys: Keys, shards: int, replica: str, ttl_ms: int) -> None:
        self.redis = redis
        self.shards = shards
        self.replica = replica
        self.ttl_ms = max(1, int(ttl_ms))
        self._keys = [keys.shard_lease(s) for s in range(shards)]
        self._script = redis.register_script(lua.load("balanceShards"))
        #: where this replica starts looking for free shards: spread, so that replicas that start together do
        #: not race for the same ones
        self._first = zlib.crc32(replica.encode()) % max(1, shards)
        #: the shards this replica holds, as of its last step (every shard with one shard)
        self.owned: list[int] = list(range(shards)) if shards == 1 else []

    def target(self, live_replicas: int) -> int:
        """How many shards one of `live_replicas` replicas should hold: ceil(shards / live)."""
        return math.ceil(self.shards / max(1, live_replicas))

    def live(self, replicas: dict[str, str], now_ms: float) -> int:
        """How many replicas count when dividing the shards: this one, and those whose sign of life (`replicas`:
        id -> ms, as `SchedulerState.replicas` reads them) is younger than the lease TTL."""
        live = 1
        for replica, raw in replicas.items():
            try:
                if replica != self.replica and now_ms - float(raw) < self.ttl_ms:
                    live += 1
            except ValueError:
                continue
        return live

    async def balance(self, live_replicas: int) -> list[int]:
        """Renews, gives back and takes leases toward this replica's target (one atomic call); the shards held."""
        if self.shards == 1:
            return self.owned
        held = await self._script(
            keys=self._keys, args=[self.replica, self.ttl_ms, self.target(live_replicas), self._first]
        )
        self.owned = sorted(int(s) for s in held)
        return self.owned

    async def release(self) -> None:
        """Gives back every lease this replica holds (an orderly stop): the others take them at their next step."""
        if self.shards == 1:
            return
        await self._script(keys=self._keys, args=[self.replica, self.ttl_ms, 0, self._first])
        self.owned = []

    async def holders(self) -> dict[int, str]:
        """Which replica holds each leased shard (for operators and tests)."""
        values = await self.redis.mget(self._keys)
        return {s: v for s, v in enumerate(values) if v is not None}


__all__ = ["ShardLeases"]

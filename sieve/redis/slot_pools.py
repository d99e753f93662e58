"""Slot pools: a hard, installation-wide concurrency cap per named resource (design 004's Slot Manager).

A pool (`video` 18, `avatar` 2, one per external provider stage) is a sorted set in Redis of holder -> lease
deadline (`Keys.slot_pool`). `acquireSlot-1.lua` reclaims expired leases and takes a slot in one atomic call, so
any number of engine replicas share a pool and can never over-commit it; `releaseSlot-1.lua` gives a slot back;
`renewSlots-1.lua` extends the leases a live holder still uses. A holder that dies without releasing stops
renewing and its slot comes back by itself once its lease runs out. A holder's name is its job's
"task_id:stage:attempt", so a restarted engine that finds its job still holding a slot re-acquires the same one
(an acquire by a current holder renews its lease) instead of taking a second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from redis.asyncio import Redis

from sieve.observe import metrics
from sieve.redis import lua
from sieve.redis.keys import Keys


@dataclass(frozen=True, slots=True)
class PoolState:
    """What an operator sees of one pool: its maximum, and each holder with its lease deadline (ms, epoch)."""

    name: str
    max_slots: int
    holders: dict[str, int]

    @property
    def in_use(self) -> int:
        return len(self.holders)


class SlotPools:
    """Named pools with a maximum each (`maxima`: pool -> max slots); slots are leases of `lease_ms`."""

    def __init__(self, redis: Redis, keys: Keys, maxima: Mapping[str, int], lease_ms: int = 60_000) -> None:
        self.redis = redis
        self.keys = keys
        self.maxima = dict(maxima)
        self.lease_ms = max(1, int(lease_ms))
        self._acquire = redis.register_script(lua.load("acquireSlot"))
        self._release = redis.register_script(lua.load("releaseSlot"))
        self._renew = redis.register_script(lua.load("renewSlots"))

    def _max(self, pool: str) -> int:
        try:
            return self.maxima[pool]
        except KeyError:
            raise KeyError(f"no slot pool named {pool!r} (configured: {sorted(self.maxima)})") from None

    async def acquire(self, pool: str, holder: str, *, now_ms: int | None = None) -> bool:
        """Takes a slot of `pool` for `holder` (or renews the one it holds); False when the pool is full."""
        granted, held, _reclaimed = await self._acquire(
            keys=[self.keys.slot_pool(pool)],
            args=["" if now_ms is None else now_ms, self._max(pool), holder, self.lease_ms],
        )
        metrics.SLOTS_IN_USE.labels(pool=pool).set(int(held))
        if not int(granted):
            metrics.SLOT_WAITS.labels(pool=pool).inc()
        return bool(int(granted))

    async def release(self, pool: str, holder: str) -> bool:
        """Gives back `holder`'s slot of `pool`; False when it held none (released already, or reclaimed)."""
        released = await self._release(keys=[self.keys.slot_pool(pool)], args=[holder])
        return bool(int(released))

    async def renew(self, pool: str, holders: Iterable[str], *, now_ms: int | None = None) -> list[str]:
        """Renews the leases of `holders` in `pool`; the ones that had lost their slot (lease expired)."""
        names = list(holders)
        if not names:
            return []
        lost = await self._renew(
            keys=[self.keys.slot_pool(pool)], args=["" if now_ms is None else now_ms, self.lease_ms, *names]
        )
        return [str(h) for h in lost]

    async def state(self, pool: str) -> PoolState:
        """The pool's live holders (expired leases not counted, by Redis's clock) and maximum."""
        return (await self._states([pool]))[0]

    async def states(self) -> list[PoolState]:
        """Every configured pool's state, by name: one round trip (a pipeline of TIME and each pool's holders)."""
        return await self._states(sorted(self.maxima))

    async def _states(self, pools: list[str]) -> list[PoolState]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        for pool in pools:
            pipe.zrange(self.keys.slot_pool(pool), 0, -1, withscores=True)
        seconds_us, *holders_of = await pipe.execute()
        now_ms = int(seconds_us[0]) * 1000 + int(seconds_us[1]) // 1000
        out: list[PoolState] = []
        for pool, rows in zip(pools, holders_of, strict=True):
            holders = {str(h): int(score) for h, score in rows if score > now_ms}
            metrics.SLOTS_IN_USE.labels(pool=pool).set(len(holders))
            out.append(PoolState(pool, self._max(pool), holders))
        return out

    async def free(self, pool: str) -> int:
        """How many slots of `pool` are free now."""
        return max(0, self._max(pool) - (await self.state(pool)).in_use)

"""What the scheduler replicas share in Redis besides the device queues' scripted state changes.

`SchedulerState` owns these keys and the commands sent to them:

- the gauges (`gauges`): one pipeline of counts — tasks queued, leased and delayed; active, overloaded and
  backed-off devices; dead letters — read by GetWatermark and by the metrics scrape, and the watermark record
  autoscalers read (`publish_watermark`: `Keys.watermark`, JSON with a TTL);
- the replicas' signs of life (`Keys.schedulers`: replica id -> when it last said it was alive, ms);
- the wake-up channel (`Keys.wake_channel`, published by enqueueMany when a device becomes schedulable; on a
  Redis Cluster subscribed to on the master of its slot, the cluster client having no pub/sub of its own);
- whether GPU workers are expected (`Keys.gpu_expected`: exists, with a TTL, while one was seen recently);
- the rebuild lock (`Keys.rebuild_lock`) and the reconciliation turn (`Keys.reconcile_lock`);
- the key lease tokens are signed with (`lease_signer`: `Keys.lease_key`, read and made by `LeaseSigner`);
- what housekeeping sweeps: lease deadlines up to a bound (leases of a replica that is gone), devices whose serving
  deadline passed (their dispatcher died holding the lock) and whether a device's lock still exists.

With several shards (sieve/redis/keys.py) the gauges are the shards' counts summed, and the sweeps read the shards
they are given; the rest is global (the `{prefix}` tag).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from enum import Enum

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from sieve.redis.connection import node_client
from sieve.redis.keys import Keys
from sieve.redis.leases import LeaseSigner
from sieve.redis.queue_store import QueueStore, now_ms
from sieve.redis.reply import reply


class Turn(Enum):
    """A lock that one scheduler replica at a time holds, under a token of its own, for a while."""

    #: the replica rebuilding Redis from PostgreSQL, or re-queueing what reconciliation found missing
    REBUILD = "rebuild"
    #: the replica whose reconciliation pass starts next (passes start at least an interval apart)
    RECONCILE = "reconcile"


@dataclass(frozen=True, slots=True)
class Gauges:
    """Counts of one moment, read in one round trip (pipelined, not atomic)."""

    #: tasks waiting in the device queues (the global pending counter)
    pending: int
    leased: int
    delayed: int
    #: devices with queued work or being served
    devices: int
    overloaded: int
    backoff: int
    dead_letters: int
    #: up to `listed` overloaded devices (any of them) and the first `listed` backed-off ones, when asked for
    overloaded_devices: list[str] = field(default_factory=list)
    backoff_devices: list[str] = field(default_factory=list)


class SchedulerState:
    """The scheduler replicas' shared Redis state outside the device queues (see the module), on the queue store's
    client and key schema."""

    def __init__(self, queues: QueueStore) -> None:
        self.queues = queues

    @property
    def redis(self) -> Redis:
        return self.queues.redis

    @property
    def keys(self) -> Keys:
        return self.queues.keys

    def lease_signer(self) -> LeaseSigner:
        """A signer of lease tokens under the installation's shared lease key."""
        return LeaseSigner(self.redis, self.keys.lease_key)

    # --- gauges and the watermark record -------------------------------------------------------------
    async def gauges(self, *, listed: int = 0) -> Gauges:
        """The counts, and with `listed` that many overloaded and backed-off devices too."""
        width = 9 if listed else 7
        async with self.redis.pipeline(transaction=False) as pipe:
            for k in self.queues.shard_keys:
                pipe.get(k.pending)
                pipe.zcard(k.leases)
                pipe.zcard(k.delayed)
                pipe.scard(k.devices)
                pipe.scard(k.overloaded)
                pipe.zcard(k.backoff)
                pipe.llen(k.dead_letters)
                if listed:
                    pipe.srandmember(k.overloaded, listed)
                    pipe.zrange(k.backoff, 0, listed - 1)
            replies = await pipe.execute()
        counts = [0] * 7
        some_overloaded: list[str] = []
        some_backoff: list[str] = []
        for at in range(0, len(replies), width):
            shard = replies[at : at + width]
            for i in range(7):
                counts[i] += int(shard[i] or 0)
            if listed:
                some_overloaded += list(shard[7] or [])
                some_backoff += list(shard[8])
        pending, leased, delayed, devices, overloaded, backoff, dead = counts
        return Gauges(
            pending,
            leased,
            delayed,
            devices,
            overloaded,
            backoff,
            dead,
            some_overloaded[:listed],
            some_backoff[:listed],
        )

    async def publish_watermark(self, record: dict[str, object], ttl_ms: int) -> None:
        """Writes the watermark record (JSON), to expire after `ttl_ms`."""
        await reply(self.redis.set(self.keys.watermark, json.dumps(record), px=ttl_ms))

    # --- replicas alive ------------------------------------------------------------------------------
    async def say_alive(self, replica: str, at_ms: int) -> None:
        await reply(self.redis.hset(self.keys.schedulers, replica, str(at_ms)))

    async def forget_replica(self, replica: str) -> bool:
        """Removes a replica's entry; False when it was not there (another replica removed it first)."""
        return bool(await reply(self.redis.hdel(self.keys.schedulers, replica)))

    async def replicas(self) -> dict[str, str]:
        """Every replica's entry: replica id -> when it last said it was alive (ms, as written)."""
        return dict(await reply(self.redis.hgetall(self.keys.schedulers)))

    # --- wake-ups ------------------------------------------------------------------------------------
    async def wake_ups(self) -> AsyncGenerator[None, None]:
        """Yields once per wake-up published (a device became schedulable). Ends, or raises, when the subscription
        is lost; closing the iterator (`contextlib.aclosing`) unsubscribes."""
        channel = self.keys.wake_channel
        client: Redis | RedisCluster = self.redis
        # a cluster client has no pub/sub: subscribe on the master of the channel's slot (a PUBLISH reaches every
        # node; that master is the one the device scripts run on, so the subscription ends when they would fail)
        node = await node_client(client, channel) if isinstance(client, RedisCluster) else None
        pubsub = (node or self.redis).pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            async for _message in pubsub.listen():
                yield None
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # (redis-py leaves it unannotated)
            if node is not None:
                with contextlib.suppress(Exception):
                    await node.aclose()

    # --- GPU workers expected ------------------------------------------------------------------------
    async def mark_gpu_expected(self, window_ms: int) -> None:
        """A GPU worker that takes OCR was seen now: GPU workers are expected for the next `window_ms`."""
        await reply(self.redis.set(self.keys.gpu_expected, str(int(now_ms())), px=window_ms))

    async def gpu_expected(self) -> bool:
        """Whether any replica saw a GPU worker that takes OCR within its window."""
        return bool(await reply(self.redis.exists(self.keys.gpu_expected)))

    # --- locks and turns -----------------------------------------------------------------------------
    def _turn_key(self, turn: Turn) -> str:
        return self.keys.rebuild_lock if turn is Turn.REBUILD else self.keys.reconcile_lock

    async def take_rebuild_lock(self, token: str, ttl_s: int) -> bool:
        """SET NX EX: True when `token` now holds the rebuild lock for `ttl_s` (it expires if its holder dies)."""
        return bool(await reply(self.redis.set(self.keys.rebuild_lock, token, nx=True, ex=ttl_s)))

    async def drop_rebuild_lock(self, token: str) -> None:
        """Deletes the rebuild lock when `token` still holds it."""
        if await reply(self.redis.get(self.keys.rebuild_lock)) == token:
            await reply(self.redis.delete(self.keys.rebuild_lock))

    async def take_turn(self, turn: Turn, token: str, ttl_ms: int) -> bool:
        """SET NX PX: True when `token` now holds the turn for `ttl_ms`."""
        return await self.queues.take_turn(self._turn_key(turn), token, ttl_ms)

    async def keep_turn(self, turn: Turn, token: str, ttl_ms: int) -> bool:
        """Sets the remaining time of the turn to `ttl_ms` while `token` holds it (0 or less: gives it up); False
        when `token` does not hold it."""
        return await self.queues.keep_turn(self._turn_key(turn), token, ttl_ms)

    # --- what housekeeping sweeps --------------------------------------------------------------------
    async def lease_ids_until(self, bound_ms: float, *, offset: int, count: int, shard: int = 0) -> list[str]:
        """Ids of a shard's leases whose deadline is no later than `bound_ms`, earliest first: `count` from
        `offset`."""
        key = self.queues.shard_keys[shard].leases
        return list(await reply(self.redis.zrangebyscore(key, "-inf", bound_ms, start=offset, num=count)))

    async def lapsed_serving(self, now: float, *, count: int = 100, shards: list[int] | None = None) -> list[str]:
        """Devices whose serving deadline (their lock's) is past, at most `count` per shard (of the given shards;
        None: all)."""
        out: list[str] = []
        for i in range(self.queues.shards) if shards is None else shards:
            key = self.queues.shard_keys[i].serving
            out += await reply(self.redis.zrangebyscore(key, "-inf", now, start=0, num=count))
        return out

    async def device_locked(self, mac: str) -> bool:
        """Whether the device's dispatch lock exists (it expires when its holder dies)."""
        return bool(await reply(self.redis.exists(self.queues.keys_of(mac).lock(mac))))


__all__ = ["Gauges", "SchedulerState", "Turn"]

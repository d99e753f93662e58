"""ackMany (QueueStore.ack): only the lease's current attempt (its fencing token) finishes a task."""

from __future__ import annotations

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from tests.integration.sieve.redis.lua.helpers import T0, A, S, tasks


async def test_an_ack_with_the_leases_attempt_finishes_the_task(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    assert await store.ack([(e.task_id, e.attempt) for e in popped.taken]) == [True, True]
    assert await redis.zcard(keys.leases) == 0
    assert await redis.hlen(keys.lease_data) == 0


async def test_an_ack_with_a_stale_attempt_or_of_an_unknown_task_is_refused(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given a1 leased at attempt 2 (its first lease was requeued, counted)
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="lease expired", now=T0 + 60 * S)
    popped = await store.pop(A, "tok", 1, now=T0 + 61 * S)
    await store.release(A, "tok", now=T0 + 61 * S)
    assert [(e.task_id, e.attempt) for e in popped.taken] == [("a0", 2)]
    # When the stale worker, an unknown task and the current holder ack
    result = await store.ack([("a0", 1), ("nope", 1), ("a1", 7), ("a0", 2), ("a0", 2)])
    # Then only the current attempt is accepted, once
    assert result == [False, False, False, True, False]
    assert await redis.zrange(keys.leases, 0, -1) == ["a1"]


async def test_an_empty_ack_does_nothing(store: QueueStore) -> None:
    assert await store.ack([]) == []


async def test_a_stale_lease_cannot_ack_after_an_uncounted_requeue(store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given a0 leased to worker 1 (attempt 1), requeued without counting (e.g. scheduler shutdown)
    await store.enqueue(A, tasks("a", 1), now=T0)
    first = await store.pop(A, "tok", 1, now=T0)
    await store.release(A, "tok", now=T0)
    await store.requeue(A, [("a0", None)], count_attempt=False, reason="scheduler shutting down", now=T0)
    # and leased again to worker 2
    second = await store.pop(A, "tok", 1, now=T0 + S)
    await store.release(A, "tok", now=T0 + S)
    # Then the two leases carry different fencing tokens, and worker 1's ack is refused
    assert second.taken[0].attempt != first.taken[0].attempt
    assert await store.ack([("a0", first.taken[0].attempt)]) == [False]


async def test_a_device_with_a_known_cost_is_served_by_what_its_tasks_cost_not_by_count(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given A served at T0+10s (its wait restarts then: counted), with more work queued since T0
    await store.enqueue(A, tasks("a", 8, at=T0), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + 10 * S)
    await store.release(A, "tok", now=T0 + 10 * S)
    schedule = keys.schedule(3, 1)
    assert await redis.zscore(schedule, A) == T0 + 10 * S
    # When its task's ack says one of its tasks keeps the pool busy for 500 ms
    await store.ack([(popped.taken[0].task_id, 1)], charges={A: 500.0})
    # Then a serve of two tasks 0.5 s later moves its wait on from where the last serve put it by 2 x 500 ms, and
    # by 500 ms more for the task served by count before its cost was known
    popped = await store.pop(A, "tok", 2, now=T0 + 10_500)
    await store.release(A, "tok", now=T0 + 10_500)
    assert await redis.zscore(schedule, A) == T0 + 11_500
    # and that task is charged once only
    assert await redis.hget(keys.meta(A), "debt_ms") is None
    # And a device left unserved for long keeps at most 10 s of credit
    await store.pop(A, "tok", 1, now=T0 + 60 * S, release=True)
    assert await redis.zscore(schedule, A) == T0 + 50 * S + 500


async def test_acks_of_many_devices_in_one_call_each_settle_their_own_device(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    devices = [f"AA:BB:CC:00:00:{i:02X}" for i in range(30)]
    await store.enqueue_many({mac: tasks(f"d{i}-", 2) for i, mac in enumerate(devices)}, now=T0)
    claim = await store.claim("tok", 60, None, max_devices=60, now=T0 + S)
    leased = [(mac, e) for mac, p in claim.devices for e in p.taken]
    assert len(leased) == 60
    # one task of each device acked, plus a stale attempt: in one call
    first = [(e.task_id, e.attempt) for mac, e in leased if e.task_id.endswith("-0")]
    result = await store.ack([*first, (first[0][0], 99)], device_of={e.task_id: mac for mac, e in leased})
    assert result == [True] * 30 + [False]
    assert await redis.zcard(keys.leases) == 30
    # each device still has one task outstanding (its meta kept); the second acks leave nothing
    assert [(await store.device_meta(mac)).get("outstanding") for mac in devices] == ["1"] * 30
    rest = [(e.task_id, e.attempt) for mac, e in leased if e.task_id.endswith("-1")]
    assert await store.ack(rest) == [True] * 30
    assert await redis.zcard(keys.leases) == 0
    assert not any([await store.device_meta(mac) for mac in devices])

"""claimDevices (QueueStore.claim): one call claims the next devices of the fair order and takes their tasks — in
the order claims made one at a time would take them, within the budget of each type — and the fair order has
two levels: caller groups first (a caller with many devices and a caller with one are served alike), then the
devices of the caller.
"""

from __future__ import annotations

import uuid
from collections import Counter

from redis.asyncio import Redis

from sieve.redis.entry import Entry
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import HIGH, NORMAL, OCR, T0, TEXT, A, B, S, assert_counters, ids
from tests.support.redis import delete_prefix


def task(task_id: str, *, caller: str = "", at: int = T0, prio: int = NORMAL, task_type: int = TEXT) -> Entry:
    return Entry(task_id, task_type, prio, at, at + 3600 * S, caller=caller)


def mac(i: int) -> str:
    return f"AA:00:00:{i // 65536:02X}:{i // 256 % 256:02X}:{i % 256:02X}"


def taken(claim: object) -> list[tuple[str, list[str]]]:
    return [(m, [e.task_id for e in p.taken]) for m, p in claim.devices]  # type: ignore[attr-defined]


async def test_one_call_takes_one_task_each_from_many_devices_oldest_wait_first(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given 300 devices with one task each, queued one ms apart
    await store.enqueue_many({mac(i): [task(f"t{i}", at=T0 + i)] for i in range(300)}, now=T0 + 300)
    # When one call claims 250 tasks
    claim = await store.claim("tok", 250, None, max_devices=500, now=T0 + S)
    # Then it took one from each of the 250 oldest devices, in order, leased under attempt 1
    assert taken(claim) == [(mac(i), [f"t{i}"]) for i in range(250)]
    assert all(e.attempt == 1 for _, p in claim.devices for e in p.taken)
    assert await redis.zcard(keys.leases) == 250
    # and each device was released as it was served: nothing is locked or being served, the rest still waits
    assert await redis.zcard(keys.serving) == 0 and not await redis.exists(keys.lock(mac(0)))
    assert claim.next.mac == mac(250)
    assert await store.pending() == 50


async def test_the_order_is_the_order_of_claims_made_one_at_a_time(redis: Redis, settings: Settings) -> None:
    # Given the same queues under two prefixes: devices of three callers, with different waits and backlogs
    stores = []
    for _ in range(2):
        s = settings.replace(redis_prefix=f"t-claim-{uuid.uuid4().hex[:8]}", batch_size=2, max_per_device_pending=50)
        store = QueueStore(redis, s)
        await store.mark_rebuilt("test")
        for i in range(12):
            caller = ("alice", "bob", "carol")[i % 3]
            await store.enqueue(
                mac(i), [task(f"d{i}-{j}", caller=caller, at=T0 + 100 * i) for j in range(1 + i % 4)], now=T0 + 2000
            )
        stores.append(store)
    one, batched = stores
    try:
        # When one store is served one claim at a time and the other in one call, at the same moments
        # (the call's clock runs on by ms_per_task per task taken, at least 0.01 ms per claim)
        singles: list[tuple[str, list[str]]] = []
        at = T0 + 5 * S
        clock = float(at)
        for i in range(40):
            claim = await one.claim(f"tok{i}", 2, None, max_devices=1, ms_per_task=2.0, now=clock)
            singles += taken(claim)
            clock += max(0.01, 2.0 * claim.taken)
        # (calls of many claims, each starting where the last one's clock stopped, as the dispatcher does)
        batch: list[tuple[str, list[str]]] = []
        clock = float(at)
        calls = 0
        while len(batch) < len(singles):
            claim = await batched.claim(f"b{calls}", 80, None, max_devices=40, ms_per_task=2.0, now=clock)
            batch += taken(claim)
            clock += sum(max(0.01, 2.0 * len(p.taken)) for _, p in claim.devices)
            calls += 1
        # Then both took the same tasks of the same devices in the same order, the batched one in far fewer calls
        assert batch == singles and calls < len(singles) / 3
        assert sum(len(t) for _, t in singles) == sum(1 + i % 4 for i in range(12))
    finally:
        for store in stores:
            await delete_prefix(redis, store.settings.redis_prefix)


async def test_a_type_takes_no_more_than_its_budget_and_its_task_keeps_its_place(store: QueueStore) -> None:
    # Given A with OCR tasks and B with text tasks
    await store.enqueue(A, [task(f"o{i}", at=T0, task_type=OCR) for i in range(3)], now=T0)
    await store.enqueue(B, [task(f"t{i}", at=T0 + 1) for i in range(3)], now=T0 + 1)
    # When the OCR workers have room for one and the text workers for ten
    claim = await store.claim("tok", 11, {OCR: 1, TEXT: 10}, max_devices=10, now=T0 + S)
    # Then one OCR task and every text task were taken (each first served as a newcomer, one task, then for the
    # rest); A's next OCR task stopped it and is still at its head
    assert taken(claim) == [(A, ["o0"]), (B, ["t0"]), (A, []), (B, ["t1", "t2"])]
    assert dict(claim.devices)[A].blocked in (0, OCR)
    assert await ids(store, A) == ["o1", "o2"]
    # and with no room for OCR at all, A is named blocked by OCR and gives nothing
    again = await store.claim("tok2", 5, {TEXT: 5}, max_devices=5, now=T0 + 2 * S)
    assert [(m, len(p.taken), p.blocked) for m, p in again.devices] == [(A, 0, OCR)]
    assert await ids(store, A) == ["o1", "o2"]


async def test_a_newcomer_gets_one_task_at_once_and_the_rest_of_its_batch_after_the_others(store: QueueStore) -> None:
    # Given three devices that have just become active, five tasks each
    newcomers = [mac(i) for i in range(3)]
    await store.enqueue_many(
        {m: [task(f"n{i}-{j}", at=T0 + i) for j in range(5)] for i, m in enumerate(newcomers)}, now=T0 + 3
    )
    # When the workers have room for ten
    claim = await store.claim("tok", 10, None, max_devices=10, now=T0 + S)
    # Then each got one task before any got a batch, then their batches came in the fair order, in the same call
    assert taken(claim) == [
        (newcomers[0], ["n0-0"]),
        (newcomers[1], ["n1-0"]),
        (newcomers[2], ["n2-0"]),
        (newcomers[0], ["n0-1", "n0-2", "n0-3", "n0-4"]),
        (newcomers[1], ["n1-1", "n1-2", "n1-3"]),
    ]


async def test_a_caller_with_many_devices_and_a_caller_with_one_get_half_each(store: QueueStore, redis: Redis) -> None:
    # Given alice with 20 devices and bob with one, all backlogged
    await store.enqueue_many(
        {mac(i): [task(f"a{i}-{j}", caller="alice", at=T0 + i) for j in range(10)] for i in range(20)}, now=T0 + 20
    )
    await store.enqueue(B, [task(f"b{j}", caller="bob", at=T0 + 50) for j in range(100)], now=T0 + 50)
    # When the workers take one task at a time, 100 times
    served: Counter[str] = Counter()
    for i in range(100):
        claim = await store.claim(f"tok{i}", 1, None, max_devices=1, now=T0 + S + i * 10)
        served["bob" if claim.devices[0][0] == B else "alice"] += 1
    # Then each caller got half (counted by device, alice would have had 20 of every 21)
    assert served == {"alice": 50, "bob": 50}


async def test_one_call_alternates_between_callers(store: QueueStore) -> None:
    await store.enqueue_many({mac(i): [task(f"a{i}", caller="alice", at=T0 + i)] for i in range(10)}, now=T0 + 10)
    await store.enqueue(B, [task(f"b{j}", caller="bob", at=T0 + 20) for j in range(10)], now=T0 + 20)
    owners: list[str] = []
    for i in range(10):
        claim = await store.claim(f"tok{i}", 20, None, max_devices=20, per_device=1, now=T0 + S + i)
        owners += ["bob" if m == B else "alice" for m, _ in claim.devices]
    # each call ends when bob's one device comes up a second time: alice, bob, alice, then the next call
    assert owners[:20] == ["alice", "bob"] * 10


async def test_callers_share_by_their_weights(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(caller_policies="bob:weight=3", max_per_device_pending=1000))
    await store.enqueue(A, [task(f"a{j}", caller="alice") for j in range(400)], now=T0)
    await store.enqueue(B, [task(f"b{j}", caller="bob") for j in range(400)], now=T0)
    served: Counter[str] = Counter()
    for i in range(400):
        claim = await store.claim(f"tok{i}", 1, None, max_devices=1, now=T0 + S + i * 10)
        served[claim.devices[0][0]] += 1
    assert 0.70 <= served[B] / 400 <= 0.80, served  # 3 : 1


async def test_within_a_caller_its_devices_keep_the_priority_rule(store: QueueStore) -> None:
    await store.enqueue(A, [task("a-normal", caller="alice", at=T0)], now=T0)
    await store.enqueue(B, [task("b-high", caller="alice", at=T0 + S, prio=HIGH)], now=T0 + S)
    claim = await store.claim("tok", 2, None, max_devices=2, now=T0 + 2 * S)
    assert [t for _, t in taken(claim)] == [["b-high"], ["a-normal"]]


async def test_a_caller_whose_devices_all_left_is_dropped_from_the_callers(
    store: QueueStore, redis: Redis, keys: Keys, settings: Settings
) -> None:
    await store.enqueue(A, [task("a1", caller="alice")], now=T0)
    assert await redis.zscore(keys.callers(1), "alice") is not None
    assert await store.cancel(A, "a1", now=T0 + S)
    # the group is gone once nothing of it is ready (at the latest when the rank finds it empty)
    assert (await store.rank(now=T0 + 2 * S)).mac is None
    assert await redis.zscore(keys.callers(1), "alice") is None
    await assert_counters(redis, settings.redis_prefix)


async def test_a_device_found_in_another_groups_schedule_set_is_taken_out_of_it(
    store: QueueStore, redis: Redis, keys: Keys
) -> None:
    # Given A of alice, ready, and a stray copy of it in the schedule set of bob (who has a device of his own: the
    # reconciler looks at the sets of every group that had a ready device)
    await store.enqueue(A, [task("a1", caller="alice")], now=T0)
    await store.enqueue(B, [task("b1", caller="bob")], now=T0)
    await redis.zadd(keys.schedule(NORMAL, 1, "bob"), {A: T0})
    # When the reconciler's scan finds it and repairs it
    stray = await store.misscheduled_devices()
    assert stray == {A: "bob"}
    repaired = await store.repair_devices(list(stray), groups=stray, now=T0 + S)
    # Then it is only in alice's set, and still served
    assert repaired[A][0] == "stale schedule"
    assert await redis.zscore(keys.schedule(NORMAL, 1, "bob"), A) is None
    assert await redis.zscore(keys.schedule(NORMAL, 1, "alice"), A) is not None
    assert await store.misscheduled_devices() == {}

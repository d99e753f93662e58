"""Every Lua script of the device queues against the real Redis, through QueueStore.

Time is controlled by passing `now=` explicitly (milliseconds from T0). After every test the counter
invariant is checked: the global pending counter == the sum of all device queue lengths == the sum of
all device backlogs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis

from sieve.errors import AdmissionRefused, LockNotOwned, ScriptCode
from sieve.redis.entry import Entry
from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.support.counters import counters

T0 = 1_700_000_000_000
S = 1000  # one second in ms
A = "AA:BB:CC:DD:EE:01"
B = "AA:BB:CC:DD:EE:02"
C = "AA:BB:CC:DD:EE:03"
BACKGROUND, LOW, NORMAL, HIGH, CRITICAL = 1, 2, 3, 4, 5
TEXT, OCR = 1, 2


def entry(task_id: str, *, prio: int = NORMAL, at: int = T0, ttl_ms: int = 3600 * S,
          attempt: int = 0, defers: int = 0, task_type: int = TEXT) -> Entry:
    return Entry(task_id, task_type, prio, at, at + ttl_ms, attempt, defers)


def tasks(prefix: str, n: int, *, prio: int = NORMAL, at: int = T0) -> list[Entry]:
    return [entry(f"{prefix}{i}", prio=prio, at=at) for i in range(n)]


async def assert_counters(redis: Redis, prefix: str) -> None:
    """GET pending == sum of LLEN of every queue == sum of every device's meta backlog."""
    now = await counters(redis, Keys(prefix))
    assert now.consistent, f"pending {now.pending}, queued {now.queued}, backlog {now.backlog}"


async def snapshot(redis: Redis, prefix: str) -> dict[str, Any]:
    """Every key under the prefix with its type and full value (to prove a refusal changed nothing)."""
    out: dict[str, Any] = {}
    async for key in redis.scan_iter(match=Keys(prefix).all_pattern, count=1000):
        kind = await redis.type(key)
        if kind == "string":
            value: Any = await redis.get(key)
        elif kind == "list":
            value = await redis.lrange(key, 0, -1)
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "set":
            value = sorted(await redis.smembers(key))
        elif kind == "zset":
            value = await redis.zrange(key, 0, -1, withscores=True)
        else:
            value = kind
        out[key] = (kind, value)
    return out


@pytest.fixture(autouse=True)
async def _counter_invariant(redis: Redis, settings: Settings) -> AsyncIterator[None]:
    yield
    await assert_counters(redis, settings.redis_prefix)


@pytest.fixture
def store(redis: Redis, settings: Settings) -> QueueStore:
    return QueueStore(redis, settings)


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.redis_prefix)


async def ids(store: QueueStore, mac: str) -> list[str]:
    return [e.task_id for e in await store.queued(mac)]


async def schedule_score(redis: Redis, keys: Keys, mac: str, prio: int, weight: int = 1) -> float | None:
    return await redis.zscore(keys.schedule(prio, weight), mac)


async def serve(store: QueueStore, mac: str, n: int, at: int, token: str = "tok") -> list[Entry]:
    """One dispatch: pop up to n tasks and release the device at the same moment."""
    popped = await store.pop(mac, token, n, now=at)
    assert popped.ready
    await store.release(mac, token, now=at)
    return popped.taken


# --- enqueue -------------------------------------------------------------------------------------

async def test_enqueue_updates_queue_backlog_global_counter_and_schedule_set(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given an empty installation
    # When a device enqueues a NORMAL and a HIGH task
    backlog, pending = await store.enqueue(
        A, [entry("n1", prio=NORMAL, at=T0), entry("h1", prio=HIGH, at=T0 + 5 * S)], now=T0 + 5 * S)
    # Then counters, queues and the device's schedule set agree
    assert (backlog, pending) == (2, 2)
    assert await store.pending() == 2
    assert await redis.lrange(keys.queue(A, NORMAL), 0, -1) == [entry("n1").encode()]
    assert await redis.lrange(keys.queue(A, HIGH), 0, -1) == [entry("h1", prio=HIGH, at=T0 + 5 * S).encode()]
    meta = await store.device_meta(A)
    assert meta["backlog"] == "2"
    assert meta["state"] == "ready"
    assert meta["class"] == str(HIGH)
    assert meta["oldest_ms"] == str(T0)
    assert meta["weight"] == "1"
    assert meta["device"] == A
    # the device sits in the schedule set of its best priority only, scored by its oldest task
    assert await schedule_score(redis, keys, A, HIGH) == T0
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert await redis.sismember(keys.devices, A)


async def test_an_enqueued_device_becomes_schedulable(store: QueueStore) -> None:
    assert (await store.rank(now=T0)).mac is None
    await store.enqueue(A, [entry("t1")], now=T0)
    assert (await store.rank(now=T0 + S)).mac == A


async def test_enqueue_adds_to_the_back_of_the_queue(store: QueueStore) -> None:
    await store.enqueue(A, [entry("t1"), entry("t2")], now=T0)
    backlog, pending = await store.enqueue(A, [entry("t3", at=T0 + S)], now=T0 + S)
    assert (backlog, pending) == (3, 3)
    assert await ids(store, A) == ["t1", "t2", "t3"]


async def test_a_higher_priority_task_moves_a_ready_device_to_the_higher_class(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, [entry("n1")], now=T0)
    await store.enqueue(A, [entry("c1", prio=CRITICAL, at=T0 + S)], now=T0 + S)
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert await schedule_score(redis, keys, A, CRITICAL) == T0
    assert (await store.device_meta(A))["class"] == str(CRITICAL)


async def test_enqueue_publishes_on_the_wake_channel_only_when_the_device_becomes_schedulable(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.wake_channel)
    try:
        confirm = await pubsub.get_message(timeout=1.0)
        assert confirm is not None and confirm["type"] == "subscribe"
        # When an idle device enqueues
        await store.enqueue(A, [entry("t1")], now=T0)
        # Then its MAC is published
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        assert message is not None
        assert (message["channel"], message["data"]) == (keys.wake_channel, A)
        # When the device, already schedulable, enqueues again
        await store.enqueue(A, [entry("t2")], now=T0)
        # Then nothing more is published
        assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.3) is None
    finally:
        await pubsub.unsubscribe()
        await pubsub.aclose()


async def test_enqueue_to_a_device_being_served_does_not_reschedule_it(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, [entry("t1")], now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await store.enqueue(A, [entry("t2", at=T0 + 2 * S)], now=T0 + 2 * S)
    assert (await store.device_meta(A))["state"] == "serving"
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert (await store.rank(now=T0 + 3 * S)).mac is None
    await store.release(A, "tok", now=T0 + 3 * S)
    assert (await store.rank(now=T0 + 4 * S)).mac == A


async def test_a_global_limit_refusal_changes_nothing(redis: Redis, settings: Settings) -> None:
    # Given a global limit of 3 with 2 tasks pending
    store = QueueStore(redis, settings.replace(max_total_pending=3))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    # When another device asks for 2 more
    with pytest.raises(AdmissionRefused) as refused:
        await store.enqueue(B, [entry("b1"), entry("b2")], now=T0 + S)
    # Then it is refused globally, reporting the state it saw, and no key changed
    assert refused.value.code is ScriptCode.GLOBAL_LIMIT
    assert refused.value.is_global
    assert (refused.value.backlog, refused.value.pending) == (0, 2)
    assert await snapshot(redis, settings.redis_prefix) == before
    assert not await redis.sismember(store.keys.overloaded, B)
    # and exactly the limit is still accepted
    assert await store.enqueue(B, [entry("b1")], now=T0 + S) == (1, 3)


async def test_a_device_limit_refusal_changes_no_queue_or_counter_and_marks_the_device_overloaded(
        redis: Redis, settings: Settings) -> None:
    # Given a device at its limit of 2
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    # When it asks for one more
    with pytest.raises(AdmissionRefused) as refused:
        await store.enqueue(A, [entry("a3")], now=T0 + S)
    # Then only that device is refused, and only the overloaded marks changed
    assert refused.value.code is ScriptCode.DEVICE_LIMIT
    assert not refused.value.is_global
    assert (refused.value.backlog, refused.value.pending) == (2, 2)
    after = await snapshot(redis, settings.redis_prefix)
    meta_key, overloaded_key = store.keys.meta(A), store.keys.overloaded
    assert after[overloaded_key] == ("set", [A])
    del after[overloaded_key]
    after[meta_key][1].pop("overloaded", None)  # the meta hash may mirror the mark
    assert after == before
    # and another device is still accepted
    assert await store.enqueue(B, [entry("b1")], now=T0 + S) == (1, 3)


async def test_a_batch_larger_than_the_device_limit_is_refused_whole(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    with pytest.raises(AdmissionRefused):
        await store.enqueue(A, tasks("a", 3), now=T0)
    assert await store.queued(A) == []
    assert await store.pending() == 0


async def test_the_overloaded_mark_is_cleared_when_a_pop_brings_the_backlog_below_the_limit(
        redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    with pytest.raises(AdmissionRefused):
        await store.enqueue(A, [entry("a3")], now=T0)
    assert await redis.sismember(store.keys.overloaded, A)
    # When one task is taken
    await store.pop(A, "tok", 1, now=T0 + S)
    # Then the device is no longer overloaded and may enqueue again
    assert not await redis.sismember(store.keys.overloaded, A)
    assert "overloaded" not in await store.device_meta(A)
    assert await store.enqueue(A, [entry("a3")], now=T0 + S) == (2, 2)


async def test_the_overloaded_mark_is_cleared_when_a_cancel_brings_the_backlog_below_the_limit(
        redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    await store.enqueue(A, [entry("a1"), entry("a2")], now=T0)
    with pytest.raises(AdmissionRefused):
        await store.enqueue(A, [entry("a3")], now=T0)
    assert await store.cancel(A, "a2", now=T0 + S)
    assert not await redis.sismember(store.keys.overloaded, A)
    assert "overloaded" not in await store.device_meta(A)


async def test_enqueue_many_admits_each_device_on_its_own(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=2))
    out = await store.enqueue_many({A: tasks("a", 3), B: tasks("b", 2), C: tasks("c", 1)}, now=T0)
    assert isinstance(out[A], AdmissionRefused) and out[A].code is ScriptCode.DEVICE_LIMIT
    assert out[B] == (2, 2)
    assert out[C] == (1, 3)
    assert await store.admission_snapshot([A, B, C]) == (3, {A: 0, B: 2, C: 1})


# --- rank ----------------------------------------------------------------------------------------

async def test_rank_finds_nothing_when_no_device_has_work(store: QueueStore) -> None:
    rank = await store.rank(now=T0)
    assert (rank.mac, rank.starving, rank.next_backoff_ms, rank.longest_wait_ms) == (None, False, None, None)


async def test_the_device_waiting_longest_is_ranked_first(store: QueueStore) -> None:
    await store.enqueue(B, [entry("b1", at=T0 + 5 * S)], now=T0 + 5 * S)
    await store.enqueue(A, [entry("a1", at=T0)], now=T0 + 6 * S)
    rank = await store.rank(now=T0 + 10 * S)
    assert rank.mac == A
    assert rank.longest_wait_ms == 10 * S


async def test_a_device_just_served_ranks_after_a_device_that_arrived_later(store: QueueStore) -> None:
    # Given A queued at T0 and B at T0+10s
    await store.enqueue(A, tasks("a", 5, at=T0), now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + 10 * S)], now=T0 + 10 * S)
    assert (await store.rank(now=T0 + 15 * S)).mac == A
    # When A is served at T0+20s
    await serve(store, A, 1, T0 + 20 * S)
    # Then B, which arrived after A's tasks, comes next
    assert (await store.rank(now=T0 + 30 * S)).mac == B


async def test_a_backlog_of_a_thousand_tasks_does_not_beat_a_newcomer_after_one_serve(
        redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_per_device_pending=1000))
    # Given a device with 1 000 old tasks and a newcomer with one
    await store.enqueue(A, tasks("a", 1000, at=T0), now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + 30 * S)], now=T0 + 30 * S)
    # When the big device is served once
    taken = await serve(store, A, 10, T0 + 60 * S)
    assert len(taken) == 10
    # Then the newcomer ranks first, although the big device still holds 990 older tasks
    rank = await store.rank(now=T0 + 61 * S)
    assert rank.mac == B
    await serve(store, B, 10, T0 + 62 * S)
    assert (await store.rank(now=T0 + 63 * S)).mac == A


async def test_a_high_priority_device_ranks_before_a_normal_one_that_waited_longer(store: QueueStore) -> None:
    await store.enqueue(A, [entry("a1", prio=NORMAL, at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", prio=HIGH, at=T0 + 100 * S)], now=T0 + 100 * S)
    assert (await store.rank(now=T0 + 101 * S)).mac == B


async def test_priority_classes_rank_in_order(store: QueueStore) -> None:
    for i, prio in enumerate((BACKGROUND, LOW, NORMAL, HIGH, CRITICAL)):
        mac = f"AA:BB:CC:DD:EE:1{i}"
        await store.enqueue(mac, [entry(f"t{i}", prio=prio, at=T0 + i * S)], now=T0 + i * S)
    order = []
    for step in range(5):
        rank = await store.rank(now=T0 + (10 + step) * S)
        assert rank.mac is not None
        order.append(rank.mac)
        await serve(store, rank.mac, 1, T0 + (10 + step) * S)
    assert order == [f"AA:BB:CC:DD:EE:1{i}" for i in (4, 3, 2, 1, 0)]


async def test_a_normal_device_whose_wait_reached_max_wait_beats_a_high_priority_one(
        store: QueueStore) -> None:
    # Given A (NORMAL) queued at T0 and B (HIGH) queued later
    await store.enqueue(A, [entry("a1", prio=NORMAL, at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", prio=HIGH, at=T0 + 60 * S)], now=T0 + 60 * S)
    # Then just before max_wait the HIGH device wins, and from max_wait on the NORMAL one does
    assert (await store.rank(now=T0 + 600 * S - 1)).mac == B
    assert (await store.rank(now=T0 + 600 * S)).mac == A


async def test_two_devices_over_max_wait_are_ranked_by_the_oldest_wait_whatever_their_priority(
        store: QueueStore) -> None:
    await store.enqueue(A, [entry("a1", prio=CRITICAL, at=T0 + 10 * S)], now=T0 + 10 * S)
    await store.enqueue(B, [entry("b1", prio=BACKGROUND, at=T0)], now=T0 + 10 * S)
    assert (await store.rank(now=T0 + 900 * S)).mac == B


async def test_a_weight_multiplies_the_wait_within_a_priority_class(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(device_weights=f"{A}=3"))
    # Given A (weight 3) queued 10 s after B (weight 1)
    await store.enqueue(B, [entry("b1", at=T0)], now=T0)
    await store.enqueue(A, [entry("a1", at=T0 + 10 * S)], now=T0 + 10 * S)
    assert await redis.zscore(store.keys.schedule(NORMAL, 3), A) == T0 + 10 * S
    assert await redis.zscore(store.keys.schedule(NORMAL, 1), B) == T0
    # Then 10 s x 3 beats 20 s x 1
    assert (await store.rank(now=T0 + 20 * S)).mac == A
    # but 2 s x 3 does not beat 12 s x 1
    assert (await store.rank(now=T0 + 12 * S)).mac == B


async def test_a_weight_does_not_lift_a_device_over_a_higher_priority_class(
        redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(device_weights=f"{A}=100"))
    await store.enqueue(A, [entry("a1", prio=NORMAL, at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", prio=HIGH, at=T0 + 100 * S)], now=T0 + 100 * S)
    assert (await store.rank(now=T0 + 101 * S)).mac == B


async def test_a_weight_is_capped_by_max_wait_but_still_counts_in_the_top_tier(
        redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(device_weights=f"{A}=2"))
    await store.enqueue(B, [entry("b1", at=T0)], now=T0)
    await store.enqueue(A, [entry("a1", at=T0 + 100 * S)], now=T0 + 100 * S)
    # B waited 1000 s, A 900 s: both capped at 600 s; A's weight decides
    assert (await store.rank(now=T0 + 1000 * S)).mac == A


async def test_equal_scores_go_to_the_heavier_device(redis: Redis,
                                                                            settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(device_weights=f"{A}=2"))
    # A (weight 2) waits 10 s, B (weight 1) waits 20 s: equal scores, the heavier A goes first
    # (breaking ties towards weight keeps weighted shares exact when claims are discrete)
    await store.enqueue(B, [entry("b1", at=T0)], now=T0)
    await store.enqueue(A, [entry("a1", at=T0 + 10 * S)], now=T0 + 10 * S)
    assert (await store.rank(now=T0 + 20 * S)).mac == A


async def test_starvation_is_flagged_when_another_device_waited_the_hint(store: QueueStore) -> None:
    # Given A (HIGH) chosen while B (NORMAL) has waited 30 s
    await store.enqueue(B, [entry("b1", at=T0)], now=T0)
    await store.enqueue(A, [entry("a1", prio=HIGH, at=T0 + 29 * S)], now=T0 + 29 * S)
    # Then below the hint there is no starvation, and at the hint there is
    below = await store.rank(now=T0 + 30 * S - 1)
    assert (below.mac, below.starving) == (A, False)
    at_hint = await store.rank(now=T0 + 30 * S)
    assert (at_hint.mac, at_hint.starving) == (A, True)


async def test_the_chosen_devices_own_long_wait_is_not_starvation(store: QueueStore) -> None:
    await store.enqueue(A, [entry("a1", at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + 100 * S)], now=T0 + 100 * S)
    rank = await store.rank(now=T0 + 110 * S)
    assert (rank.mac, rank.starving, rank.longest_wait_ms) == (A, False, 110 * S)


async def test_a_second_device_in_the_same_class_counts_for_starvation(store: QueueStore) -> None:
    await store.enqueue(A, [entry("a1", at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + S)], now=T0 + S)
    rank = await store.rank(now=T0 + 31 * S)
    assert (rank.mac, rank.starving) == (A, True)


async def test_rank_skips_the_excluded_device(store: QueueStore) -> None:
    await store.enqueue(A, [entry("a1", at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + S)], now=T0 + S)
    rank = await store.rank(exclude=A, now=T0 + 40 * S)
    # the excluded device neither wins nor counts as starving
    assert (rank.mac, rank.starving, rank.longest_wait_ms) == (B, False, 39 * S)
    assert (await store.rank(exclude=B, now=T0 + 40 * S)).mac == A


async def test_rank_with_only_the_excluded_device_finds_nothing(store: QueueStore) -> None:
    await store.enqueue(A, [entry("a1")], now=T0)
    assert (await store.rank(exclude=A, now=T0 + S)).mac is None


async def test_rank_skips_an_excluded_device_even_behind_two_others_in_the_same_set(
        store: QueueStore) -> None:
    for i, mac in enumerate((A, B, C)):
        await store.enqueue(mac, [entry(f"t{i}", at=T0 + i * S)], now=T0 + i * S)
    assert (await store.rank(exclude=A, now=T0 + 10 * S)).mac == B


# --- pop -----------------------------------------------------------------------------------------

async def test_pop_takes_the_lock_and_a_second_pop_with_another_token_is_not_ready(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 4), now=T0)
    first = await store.pop(A, "tok-1", 2, now=T0 + S)
    assert first.ready and len(first.taken) == 2
    assert await redis.get(keys.lock(A)) == "tok-1"
    assert 0 < await redis.pttl(keys.lock(A)) <= 900 * S
    # When another replica tries the same device
    second = await store.pop(A, "tok-2", 2, now=T0 + S)
    # Then it gets nothing and the lock stays with the first
    assert not second.ready and second.taken == []
    assert await redis.get(keys.lock(A)) == "tok-1"
    assert await ids(store, A) == ["a2", "a3"]


async def test_pop_moves_the_device_from_its_schedule_set_to_serving(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert await redis.zscore(keys.serving, A) == T0 + S + 900 * S
    meta = await store.device_meta(A)
    assert (meta["state"], meta["class"], meta["token"], meta["last_served_ms"]) == (
        "serving", "0", "tok", str(T0 + S))
    assert (await store.rank(now=T0 + 2 * S)).mac is None


async def test_pop_of_a_device_whose_meta_was_lost_takes_it_out_of_the_schedule_sets(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given a device whose meta was deleted behind Sieve's back while it sat in a schedule set
    await store.enqueue(A, tasks("a", 2), now=T0)
    await redis.delete(keys.meta(A))
    assert (await store.rank(now=T0 + S)).mac == A
    # When it is popped, Then it is not ready and the rank no longer offers it (no dispatch spin on a ghost)
    assert not (await store.pop(A, "tok", 1, now=T0 + S)).ready
    assert await schedule_score(redis, keys, A, NORMAL) is None
    assert (await store.rank(now=T0 + 2 * S)).mac is None
    assert await redis.get(keys.lock(A)) is None
    # (the lost meta leaves the counters disagreeing: the reconciler's repair, not this test's subject)
    await redis.delete(*(keys.queue(A, prio) for prio in range(1, 6)), keys.caller_open)
    await redis.set(keys.pending, 0)


async def test_pop_of_a_device_without_work_is_not_ready_and_leaves_no_lock(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    popped = await store.pop(A, "tok", 5, now=T0)
    assert not popped.ready
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None


async def test_pop_takes_the_highest_priority_first_and_fifo_within_it(store: QueueStore) -> None:
    await store.enqueue(A, [entry("n1", prio=NORMAL, at=T0), entry("l1", prio=LOW, at=T0),
                            entry("c1", prio=CRITICAL, at=T0 + S), entry("n2", prio=NORMAL, at=T0 + S),
                            entry("c2", prio=CRITICAL, at=T0 + 2 * S)], now=T0 + 2 * S)
    popped = await store.pop(A, "tok", 4, now=T0 + 3 * S)
    assert [e.task_id for e in popped.taken] == ["c1", "c2", "n1", "n2"]
    assert await ids(store, A) == ["l1"]


async def test_pop_takes_an_aged_low_priority_head_before_younger_high_priority_tasks(
        store: QueueStore) -> None:
    # Given a BACKGROUND task queued at T0 and HIGH tasks queued 500 s later
    await store.enqueue(A, [entry("bg", prio=BACKGROUND, at=T0)], now=T0)
    await store.enqueue(A, [entry("h1", prio=HIGH, at=T0 + 500 * S), entry("h2", prio=HIGH, at=T0 + 500 * S)],
                        now=T0 + 500 * S)
    # When the device is popped after the BACKGROUND task waited max_wait
    popped = await store.pop(A, "tok", 3, now=T0 + 600 * S)
    # Then the aged head goes first, then the high priority ones
    assert [e.task_id for e in popped.taken] == ["bg", "h1", "h2"]


async def test_pop_before_max_wait_keeps_strict_priority(store: QueueStore) -> None:
    await store.enqueue(A, [entry("bg", prio=BACKGROUND, at=T0)], now=T0)
    await store.enqueue(A, [entry("h1", prio=HIGH, at=T0 + 500 * S)], now=T0 + 500 * S)
    popped = await store.pop(A, "tok", 2, now=T0 + 600 * S - 1)
    assert [e.task_id for e in popped.taken] == ["h1", "bg"]


async def test_among_several_aged_heads_pop_takes_the_oldest_first(store: QueueStore) -> None:
    await store.enqueue(A, [entry("low", prio=LOW, at=T0 + 10 * S), entry("bg", prio=BACKGROUND, at=T0),
                            entry("crit", prio=CRITICAL, at=T0 + 700 * S)], now=T0 + 700 * S)
    popped = await store.pop(A, "tok", 3, now=T0 + 800 * S)
    assert [e.task_id for e in popped.taken] == ["bg", "low", "crit"]


async def test_pop_drops_expired_entries_and_counts_them_out(store: QueueStore, redis: Redis,
                                                            keys: Keys) -> None:
    # Given two expired tasks among live ones
    await store.enqueue(A, [entry("x1", at=T0, ttl_ms=10 * S), entry("ok1", at=T0),
                            entry("x2", prio=HIGH, at=T0, ttl_ms=10 * S), entry("ok2", at=T0)], now=T0)
    # When 2 are popped after the short TTL
    popped = await store.pop(A, "tok", 2, now=T0 + 10 * S)
    # Then the expired ones are dropped and reported, and the 2 taken are live ones
    assert [e.task_id for e in popped.taken] == ["ok1", "ok2"]
    assert sorted(e.task_id for e in popped.expired) == ["x1", "x2"]
    assert all(e.attempt == 0 for e in popped.expired)
    assert await store.pending() == 0
    assert (await store.device_meta(A))["backlog"] == "0"
    assert await redis.hexists(keys.lease_data, "x1") is False
    assert await redis.zscore(keys.leases, "x2") is None


async def test_a_pop_that_finds_only_expired_entries_takes_nothing(store: QueueStore) -> None:
    await store.enqueue(A, [entry("x1", ttl_ms=S), entry("x2", ttl_ms=S)], now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + 2 * S)
    assert popped.ready
    assert popped.taken == []
    assert [e.task_id for e in popped.expired] == ["x1", "x2"]
    await store.release(A, "tok", now=T0 + 2 * S)
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten


async def test_pop_raises_the_attempt_and_records_the_leases(store: QueueStore, redis: Redis,
                                                            keys: Keys) -> None:
    await store.enqueue(A, [entry("a1"), entry("a2", attempt=2, defers=1)], now=T0)
    popped = await store.pop(A, "tok", 5, now=T0 + S)
    assert [(e.task_id, e.attempt, e.defers) for e in popped.taken] == [("a1", 1, 0), ("a2", 3, 1)]
    lease_until = T0 + S + int(store.settings.lease_ttl_s * 1000)
    assert await redis.zrange(keys.leases, 0, -1, withscores=True) == [("a1", lease_until),
                                                                       ("a2", lease_until)]
    assert await redis.hget(keys.lease_data, "a1") == f"{A}|{popped.taken[0].encode()}"
    assert await redis.hget(keys.lease_data, "a2") == f"{A}|{popped.taken[1].encode()}"
    meta = await store.device_meta(A)
    assert meta["served"] == "2"
    assert meta["backlog"] == "0"


async def test_pop_takes_at_most_the_count_asked_for(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 5), now=T0)
    popped = await store.pop(A, "tok", 3, now=T0 + S)
    assert [e.task_id for e in popped.taken] == ["a0", "a1", "a2"]
    assert await store.pending() == 2
    assert (await store.device_meta(A))["backlog"] == "2"


async def test_pop_of_allowed_types_stops_before_a_task_of_another_type(store: QueueStore, redis: Redis,
                                                                      keys: Keys) -> None:
    # Given TEXT, OCR, TEXT in one queue
    await store.enqueue(A, [entry("t1"), entry("o1", task_type=OCR), entry("t2")], now=T0)
    # When only TEXT can be served
    popped = await store.pop(A, "tok", 3, allowed_types=[TEXT], now=T0 + S)
    # Then popping stops at the OCR task, which stays at the front
    assert popped.ready and popped.blocked
    assert [e.task_id for e in popped.taken] == ["t1"]
    assert await ids(store, A) == ["o1", "t2"]
    assert await store.pending() == 2
    await store.release(A, "tok", now=T0 + S)


async def test_pop_of_allowed_types_takes_every_allowed_type_without_blocking(store: QueueStore) -> None:
    await store.enqueue(A, [entry("t1"), entry("o1", task_type=OCR)], now=T0)
    popped = await store.pop(A, "tok", 5, allowed_types=[OCR, TEXT], now=T0 + S)
    assert [e.task_id for e in popped.taken] == ["t1", "o1"]
    assert not popped.blocked
    await store.release(A, "tok", now=T0 + S)


async def test_pop_of_allowed_types_still_drops_an_expired_task_of_another_type(store: QueueStore) -> None:
    await store.enqueue(A, [entry("o1", task_type=OCR, ttl_ms=S), entry("t1")], now=T0)
    popped = await store.pop(A, "tok", 5, allowed_types=[TEXT], now=T0 + 2 * S)
    assert [e.task_id for e in popped.expired] == ["o1"]
    assert [e.task_id for e in popped.taken] == ["t1"]
    assert not popped.blocked
    await store.release(A, "tok", now=T0 + 2 * S)


async def test_pop_with_no_allowed_type_takes_nothing(store: QueueStore) -> None:
    await store.enqueue(A, [entry("t1")], now=T0)
    popped = await store.pop(A, "tok", 5, allowed_types=[], release=True, now=T0 + S)
    assert popped.taken == []
    assert await ids(store, A) == ["t1"]


async def test_pop_with_release_ends_the_dispatch_in_the_same_step(store: QueueStore, redis: Redis,
                                                                   keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    popped = await store.pop(A, "tok", 1, release=True, now=T0 + 50 * S)
    assert [e.task_id for e in popped.taken] == ["a0"]
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None
    meta = await store.device_meta(A)
    assert (meta["state"], meta["since_ms"]) == ("ready", str(T0 + 50 * S))
    assert "token" not in meta
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 50 * S
    # the token is gone with the lock: a later release by it is refused
    with pytest.raises(LockNotOwned):
        await store.release(A, "tok", now=T0 + 51 * S)


async def test_pop_with_release_of_the_last_tasks_leaves_the_device_idle(store: QueueStore, redis: Redis,
                                                                         keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 5, release=True, now=T0 + S)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)


async def test_pop_and_rank_serves_one_device_and_names_the_next_one(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + 5 * S)], now=T0 + 5 * S)
    popped, rank = await store.pop_and_rank(A, "tok", 1, [TEXT], now=T0 + 100 * S)
    assert [e.task_id for e in popped.taken] == ["a0"]
    # B is named next; A, just served, is skipped (and so is not counted as starving)
    assert (rank.mac, rank.starving, rank.longest_wait_ms) == (B, False, 95 * S)
    assert (await store.device_meta(A))["state"] == "ready"


# --- release and the lock --------------------------------------------------------------------------

async def test_release_with_a_wrong_token_raises_and_changes_nothing(
        store: QueueStore, redis: Redis, settings: Settings) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    before = await snapshot(redis, settings.redis_prefix)
    with pytest.raises(LockNotOwned):
        await store.release(A, "other", now=T0 + 2 * S)
    assert await snapshot(redis, settings.redis_prefix) == before


async def test_release_reschedules_the_device_with_its_wait_restarting_now(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    await store.pop(A, "tok", 1, now=T0 + 50 * S)
    await store.release(A, "tok", now=T0 + 50 * S)
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 50 * S
    meta = await store.device_meta(A)
    assert (meta["state"], meta["since_ms"], meta["oldest_ms"]) == ("ready", str(T0 + 50 * S), str(T0))
    assert "token" not in meta
    assert (await store.rank(now=T0 + 60 * S)).longest_wait_ms == 10 * S


async def test_a_release_later_than_the_claim_restarts_the_wait_at_the_release(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given A claimed at T0+50s whose dispatch ends at T0+80s, and B arriving at T0+60s
    await store.enqueue(A, tasks("a", 3, at=T0), now=T0)
    await store.pop(A, "tok", 1, now=T0 + 50 * S)
    await store.enqueue(B, [entry("b1", at=T0 + 60 * S)], now=T0 + 60 * S)
    await store.release(A, "tok", now=T0 + 80 * S)
    # Then A's wait restarts at the release, and B (waiting since T0+60s) comes first
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 80 * S
    assert (await store.rank(now=T0 + 90 * S)).mac == B


async def test_release_of_an_emptied_device_makes_it_idle_and_inactive(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 5, now=T0 + S)
    await store.release(A, "tok", now=T0 + S)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["class"], meta["backlog"]) == ("idle", "0", "0")
    assert "oldest_ms" not in meta
    assert not await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + 2 * S)).mac is None


async def test_the_owner_may_still_release_after_its_lock_expired(store: QueueStore, redis: Redis,
                                                                   keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await redis.delete(keys.lock(A))  # the lock's TTL ran out
    with pytest.raises(LockNotOwned):
        await store.release(A, "other", now=T0 + 2 * S)
    await store.release(A, "tok", now=T0 + 2 * S)
    assert (await store.device_meta(A))["state"] == "ready"


async def test_a_forced_release_frees_a_device_whose_holder_died(store: QueueStore, redis: Redis,
                                                                 keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "dead-holder", 1, now=T0 + S)
    await store.release(A, "*", now=T0 + 2 * S)
    assert await redis.get(keys.lock(A)) is None
    assert (await store.rank(now=T0 + 3 * S)).mac == A


async def test_a_release_that_is_repeated_is_refused(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await store.release(A, "tok", now=T0 + S)
    with pytest.raises(LockNotOwned):
        await store.release(A, "tok", now=T0 + 2 * S)


async def test_extend_lock_renews_only_for_the_holder(store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await redis.pexpire(keys.lock(A), 1000)
    assert await store.extend_lock(A, "other") is False
    assert await redis.pttl(keys.lock(A)) <= 1000
    assert await store.extend_lock(A, "tok") is True
    assert await redis.pttl(keys.lock(A)) > 800 * S
    await store.release(A, "tok", now=T0)


# --- defer and resume ------------------------------------------------------------------------------

async def test_defer_puts_the_tasks_back_at_the_front_in_the_order_they_were_taken(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, [entry("h1", prio=HIGH), entry("n1"), entry("n2"), entry("n3")], now=T0)
    popped = await store.pop(A, "tok", 3, now=T0 + S)
    taken = [e.task_id for e in popped.taken]
    assert taken == ["h1", "n1", "n2"]
    deferred = await store.defer(A, "tok", taken, "no worker for TEXT", now=T0 + S)
    assert deferred.unschedulable_until_ms == T0 + S + 30 * S
    assert deferred.dead_letters == []
    queued = await store.queued(A)
    assert [e.task_id for e in queued] == ["h1", "n1", "n2", "n3"]
    # the defer does not count as a failure, but as a defer; the attempt number (hand-outs) stays
    assert [(e.attempt, e.defers, e.failures) for e in queued] == [(1, 1, 0), (1, 1, 0), (1, 1, 0), (0, 0, 0)]
    assert await redis.zcard(keys.leases) == 0
    assert await redis.hlen(keys.lease_data) == 0
    assert await store.pending() == 4
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"], meta["defer_reason"]) == ("backoff", "4", "no worker for TEXT")
    assert meta["unschedulable_until_ms"] == str(T0 + 31 * S)
    assert await redis.zscore(keys.backoff, A) == T0 + 31 * S
    assert await redis.get(keys.lock(A)) is None
    assert await redis.zscore(keys.serving, A) is None


async def test_the_backoff_doubles_on_successive_defers_and_is_capped(
        redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_attempts=100))
    await store.enqueue(A, tasks("a", 3), now=T0)
    now = T0
    delays = []
    for _ in range(8):
        popped = await store.pop(A, "tok", 1, now=now)
        assert popped.ready
        deferred = await store.defer(A, "tok", [e.task_id for e in popped.taken], "no worker", now=now)
        delays.append((deferred.unschedulable_until_ms - now) // S)
        now = deferred.unschedulable_until_ms
        assert await store.resume_due(now=now) == [A]
    assert delays == [30, 60, 120, 240, 480, 600, 600, 600]


async def test_a_successful_release_resets_the_backoff_doubling(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 3), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    first = await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    await store.resume_due(now=first.unschedulable_until_ms)
    await serve(store, A, 1, first.unschedulable_until_ms)
    popped = await store.pop(A, "tok", 1, now=T0 + 100 * S)
    second = await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0 + 100 * S)
    assert second.unschedulable_until_ms == T0 + 100 * S + 30 * S


async def test_a_device_in_backoff_is_skipped_by_rank_and_pop(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2, at=T0), now=T0)
    await store.enqueue(B, [entry("b1", at=T0 + 5 * S)], now=T0 + 5 * S)
    popped = await store.pop(A, "tok", 1, now=T0 + 10 * S)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0 + 10 * S)
    # While A backs off only B is schedulable, and rank says when A's backoff ends
    rank = await store.rank(now=T0 + 20 * S)
    assert (rank.mac, rank.next_backoff_ms) == (B, T0 + 40 * S)
    assert not (await store.pop(A, "tok2", 1, now=T0 + 20 * S)).ready
    await serve(store, B, 1, T0 + 20 * S)
    assert (await store.rank(now=T0 + 45 * S)).mac is None


async def test_resume_due_before_the_deadline_does_nothing_and_after_it_schedules_the_device(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2, at=T0), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0 + 10 * S)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0 + 10 * S)
    # Before the deadline
    assert await store.resume_due(now=T0 + 40 * S - 1) == []
    assert (await store.device_meta(A))["state"] == "backoff"
    # At the deadline
    assert await store.resume_due(now=T0 + 40 * S) == [A]
    meta = await store.device_meta(A)
    assert meta["state"] == "ready"
    assert "unschedulable_until_ms" not in meta and "defer_reason" not in meta
    assert await redis.zscore(keys.backoff, A) is None
    # its wait counts from its last claim, so it is not pushed to the back by the backoff
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 10 * S
    assert (await store.rank(now=T0 + 41 * S)).mac == A
    # and a second resume finds nothing
    assert await store.resume_due(now=T0 + 50 * S) == []


async def test_enqueue_to_a_device_in_backoff_does_not_schedule_it(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    await store.enqueue(A, [entry("a9", at=T0 + S)], now=T0 + S)
    assert (await store.device_meta(A))["state"] == "backoff"
    assert (await store.rank(now=T0 + 2 * S)).mac is None
    assert await store.resume_due(now=T0 + 30 * S) == [A]
    assert await ids(store, A) == ["a0", "a9"]


async def test_defer_with_a_wrong_token_raises_and_changes_nothing(
        store: QueueStore, redis: Redis, settings: Settings) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    with pytest.raises(LockNotOwned):
        await store.defer(A, "other", [popped.taken[0].task_id], "no worker", now=T0)
    assert await snapshot(redis, settings.redis_prefix) == before


async def test_defer_of_a_device_with_nothing_left_leaves_it_idle(store: QueueStore, redis: Redis,
                                                                  keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    # the popped task is handed out; the dispatch defers nothing
    deferred = await store.defer(A, "tok", [], "no worker", now=T0)
    assert deferred.unschedulable_until_ms == 0
    assert (await store.device_meta(A))["state"] == "idle"
    assert await redis.zscore(keys.backoff, A) is None
    assert await store.ack([(popped.taken[0].task_id, 1)]) == [True]


async def test_a_device_that_a_defer_leaves_idle_is_no_longer_active(store: QueueStore, redis: Redis,
                                                                     keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [], "no worker", now=T0)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)


async def test_a_device_that_resumes_with_nothing_left_is_no_longer_active(store: QueueStore, redis: Redis,
                                                                           keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    await store.cancel(A, "a0", now=T0 + S)
    await store.cancel(A, "a1", now=T0 + S)
    assert await store.resume_due(now=T0 + 30 * S) == [A]
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten
    assert not await redis.sismember(keys.devices, A)


async def test_a_task_deferred_max_attempts_times_is_dead_lettered(store: QueueStore, redis: Redis,
                                                                   keys: Keys) -> None:
    # Given a task enqueued at T0 and the default max_attempts of 6
    await store.enqueue(A, [entry("a1", prio=HIGH, at=T0)], now=T0)
    now = T0
    # When it is deferred five times, it goes back each time
    for n in range(1, 6):
        popped = await store.pop(A, "tok", 1, now=now)
        deferred = await store.defer(A, "tok", ["a1"], "no worker for TEXT", now=now)
        assert deferred.dead_letters == []
        # the attempt number keeps counting hand-outs (it is the fencing token); defers count put-backs
        assert [(e.attempt, e.defers, e.failures) for e in await store.queued(A)] == [(n, n, 0)]
        now = deferred.unschedulable_until_ms
        await store.resume_due(now=now)
    # When it is deferred the sixth time
    popped = await store.pop(A, "tok", 1, now=now)
    assert popped.taken[0].defers == 5
    deferred = await store.defer(A, "tok", ["a1"], "no worker for TEXT", now=now)
    # Then it is dead-lettered with the seed 5.4 fields, and nothing is queued
    assert deferred.unschedulable_until_ms == 0
    assert deferred.dead_letters == [{
        "task_id": "a1", "device": A, "task_type": TEXT, "priority": HIGH, "error": "no worker for TEXT",
        "attempts": 0, "handouts": 6, "requeue_count": 6, "enqueued_ms": T0, "dead_ms": now,
    }]
    assert [json.loads(r) for r in await redis.lrange(keys.dead_letters, 0, -1)] == deferred.dead_letters
    assert await store.queued(A) == []
    assert await store.pending() == 0
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten


async def test_the_dead_letter_list_is_capped(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(max_attempts=1, dead_letter_keep=2))
    await store.enqueue(A, tasks("a", 3), now=T0)
    popped = await store.pop(A, "tok", 3, now=T0)
    deferred = await store.defer(A, "tok", [e.task_id for e in popped.taken], "no worker", now=T0)
    assert len(deferred.dead_letters) == 3
    kept = [json.loads(r)["task_id"] for r in await redis.lrange(store.keys.dead_letters, 0, -1)]
    assert kept == ["a0", "a1"]  # newest first: put back from the last taken to the first


# --- ack -----------------------------------------------------------------------------------------

async def test_an_ack_with_the_leases_attempt_finishes_the_task(store: QueueStore, redis: Redis,
                                                                keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    assert await store.ack([(e.task_id, e.attempt) for e in popped.taken]) == [True, True]
    assert await redis.zcard(keys.leases) == 0
    assert await redis.hlen(keys.lease_data) == 0


async def test_an_ack_with_a_stale_attempt_or_of_an_unknown_task_is_refused(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
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


async def test_a_stale_lease_cannot_ack_after_an_uncounted_requeue(store: QueueStore, redis: Redis,
                                                                   keys: Keys) -> None:
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


# --- requeue -------------------------------------------------------------------------------------

async def test_requeue_puts_tasks_at_the_front_in_their_original_order(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 5), now=T0)
    popped = await store.pop(A, "tok", 3, now=T0)
    await store.release(A, "tok", now=T0)
    result = await store.requeue(A, [(e.task_id, e.attempt) for e in popped.taken], count_attempt=True,
                                 reason="worker gone", now=T0 + S)
    assert (result.requeued, result.dead_letters) == (3, [])
    assert await ids(store, A) == ["a0", "a1", "a2", "a3", "a4"]


async def test_a_counted_requeue_counts_a_failure_and_an_uncounted_one_does_not(
        store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="nack", now=T0)
    await store.requeue(A, [("a1", 1)], count_attempt=False, reason="over watermark", now=T0)
    assert len(popped.taken) == 2
    assert [(e.task_id, e.attempt, e.failures) for e in await store.queued(A)] == [("a1", 1, 0), ("a0", 1, 1)]


async def test_requeue_ignores_a_stale_attempt_and_takes_any_attempt_for_a_wildcard(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    result = await store.requeue(A, [("a0", 5), ("unknown", None), ("a1", None)], count_attempt=True,
                                 reason="x", now=T0)
    assert result.requeued == 1
    assert await ids(store, A) == ["a1"]
    assert await redis.zrange(keys.leases, 0, -1) == ["a0"]


async def test_requeue_makes_an_idle_device_schedulable_again(store: QueueStore, redis: Redis,
                                                              keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1, at=T0), now=T0)
    await serve(store, A, 1, T0 + 10 * S)
    assert (await store.device_meta(A))["state"] == "idle"
    assert not await redis.sismember(keys.devices, A)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="lease expired", now=T0 + 70 * S)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("ready", "1")
    assert await redis.sismember(keys.devices, A)
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + 10 * S
    assert (await store.rank(now=T0 + 71 * S)).mac == A


async def test_a_task_whose_counted_attempts_reach_max_attempts_is_dead_lettered(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    await store.enqueue(A, [entry("a0", prio=LOW, at=T0)], now=T0)
    now = T0
    for attempt in range(1, 7):
        popped = await store.pop(A, "tok", 1, now=now)
        await store.release(A, "tok", now=now)
        assert popped.taken[0].attempt == attempt
        result = await store.requeue(A, [("a0", attempt)], count_attempt=True, reason="worker died",
                                     now=now + 60 * S)
        now += 61 * S
        if attempt < 6:
            assert (result.requeued, result.dead_letters) == (1, [])
    assert result.requeued == 0
    assert result.dead_letters == [{
        "task_id": "a0", "device": A, "task_type": TEXT, "priority": LOW, "error": "worker died",
        "attempts": 6, "handouts": 6, "requeue_count": 0, "enqueued_ms": T0, "dead_ms": now - S,
    }]
    assert await redis.llen(keys.dead_letters) == 1
    assert await store.queued(A) == []
    assert await redis.zcard(keys.leases) == 0


async def test_uncounted_requeues_never_dead_letter(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    for _ in range(10):
        popped = await store.pop(A, "tok", 1, now=T0)
        await store.release(A, "tok", now=T0)
        result = await store.requeue(A, [("a0", popped.taken[0].attempt)], count_attempt=False,
                                     reason="over watermark", now=T0)
        assert (result.requeued, result.dead_letters) == (1, [])
    assert [(e.attempt, e.failures) for e in await store.queued(A)] == [(10, 0)]


async def test_requeue_to_a_device_being_served_waits_for_its_release(store: QueueStore, redis: Redis,
                                                                      keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await store.release(A, "tok", now=T0)
    await store.pop(A, "tok", 1, now=T0 + S)
    await store.requeue(A, [("a0", 1)], count_attempt=True, reason="nack", now=T0 + S)
    assert (await store.device_meta(A))["state"] == "serving"
    assert await schedule_score(redis, keys, A, NORMAL) is None
    await store.release(A, "tok", now=T0 + 2 * S)
    assert (await store.rank(now=T0 + 3 * S)).mac == A


async def test_a_requeue_with_a_retry_time_delays_the_tasks_until_promoted(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    # Given two leased tasks and one still queued
    await store.enqueue(A, tasks("a", 3), now=T0)
    popped = await store.pop(A, "tok", 2, now=T0)
    await store.release(A, "tok", now=T0)
    # When they are requeued to retry 30 s later
    result = await store.requeue(A, [(e.task_id, e.attempt) for e in popped.taken], count_attempt=True,
                                 reason="retry later", retry_at_ms=T0 + 30 * S, now=T0 + S)
    # Then they wait in the delayed set, neither queued nor leased nor pending
    assert (result.requeued, result.dead_letters) == (0, [])
    assert await ids(store, A) == ["a2"]
    assert await store.pending() == 1
    assert await redis.zcard(keys.leases) == 0
    failed = [replace(e, failures=1) for e in popped.taken]
    assert await redis.zrange(keys.delayed, 0, -1, withscores=True) == [
        (f"{A}|{failed[0].encode()}", T0 + 30 * S), (f"{A}|{failed[1].encode()}", T0 + 30 * S)]
    # and promote_due brings them back at the front, in order, only when due
    assert await store.promote_due(now=T0 + 30 * S - 1) == 0
    assert await store.promote_due(now=T0 + 30 * S) == 2
    assert await ids(store, A) == ["a0", "a1", "a2"]
    assert [e.attempt for e in await store.queued(A)] == [1, 1, 0]
    assert await redis.zcard(keys.delayed) == 0
    assert await store.pending() == 3


async def test_promoting_delayed_tasks_makes_an_idle_device_schedulable(store: QueueStore, redis: Redis,
                                                                        keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1, at=T0), now=T0)
    await serve(store, A, 1, T0 + S)
    await store.requeue(A, [("a0", 1)], count_attempt=False, reason="later", retry_at_ms=T0 + 10 * S,
                        now=T0 + 2 * S)
    assert (await store.device_meta(A))["state"] == "idle"
    assert (await store.rank(now=T0 + 5 * S)).mac is None
    assert await store.promote_due(now=T0 + 10 * S) == 1
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("ready", "1")
    assert await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + 11 * S)).mac == A


async def test_a_requeue_with_a_retry_time_still_dead_letters_at_max_attempts(store: QueueStore,
                                                                               redis: Redis,
                                                                               keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await serve(store, A, 1, T0)
    result = await store.requeue(A, [("a0", 1)], count_attempt=True, reason="bad input", max_attempts=1,
                                 retry_at_ms=T0 + 60 * S, now=T0)
    assert [d["task_id"] for d in result.dead_letters] == ["a0"]
    assert await redis.zcard(keys.delayed) == 0


async def test_a_requeue_with_a_retry_time_in_the_past_is_immediate(store: QueueStore, redis: Redis,
                                                                    keys: Keys) -> None:
    await store.enqueue(A, tasks("a", 1), now=T0)
    await serve(store, A, 1, T0)
    result = await store.requeue(A, [("a0", 1)], count_attempt=True, reason="x", retry_at_ms=T0,
                                 now=T0 + S)
    assert result.requeued == 1
    assert await redis.zcard(keys.delayed) == 0
    assert await ids(store, A) == ["a0"]


# --- cancel --------------------------------------------------------------------------------------

async def test_cancel_removes_a_queued_task_and_keeps_the_counters_exact(store: QueueStore, redis: Redis,
                                                                         keys: Keys) -> None:
    await store.enqueue(A, [entry("a0", at=T0), entry("a1", at=T0 + S), entry("h0", prio=HIGH, at=T0 + S)],
                        now=T0 + S)
    await store.enqueue(B, [entry("b0")], now=T0 + S)
    assert await store.cancel(A, "a0", now=T0 + 2 * S)
    assert await ids(store, A) == ["h0", "a1"]
    assert await store.pending() == 3
    assert (await store.device_meta(A))["backlog"] == "2"
    # the oldest task went, so the device's wait now starts at the next oldest
    assert await schedule_score(redis, keys, A, HIGH) == T0 + S
    assert await store.cancel(A, "h0", now=T0 + 2 * S)
    assert await schedule_score(redis, keys, A, HIGH) is None
    assert await schedule_score(redis, keys, A, NORMAL) == T0 + S


async def test_cancelling_the_last_task_makes_the_device_idle(store: QueueStore, redis: Redis,
                                                              keys: Keys) -> None:
    await store.enqueue(A, [entry("a0")], now=T0)
    assert await store.cancel(A, "a0", now=T0 + S)
    meta = await store.device_meta(A)
    assert meta == {}  # idle, nothing outstanding: its meta is forgotten
    assert not await redis.sismember(keys.devices, A)
    assert (await store.rank(now=T0 + 2 * S)).mac is None


async def test_cancel_of_a_leased_or_unknown_task_returns_false_and_changes_nothing(
        store: QueueStore, redis: Redis, settings: Settings) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.pop(A, "tok", 1, now=T0)
    await store.release(A, "tok", now=T0)
    before = await snapshot(redis, settings.redis_prefix)
    assert await store.cancel(A, "a0", now=T0 + S) is False
    assert await store.cancel(A, "zzz", now=T0 + S) is False
    assert await store.cancel(B, "a1", now=T0 + S) is False
    assert await snapshot(redis, settings.redis_prefix) == before


async def test_remove_queued_returns_the_removed_entry(store: QueueStore) -> None:
    queued = entry("a0", prio=HIGH, ttl_ms=10 * S)
    await store.enqueue(A, [queued, entry("a1")], now=T0)
    assert await store.remove_queued(A, "a0", now=T0 + 20 * S) == queued
    assert await store.remove_queued(A, "a0", now=T0 + 20 * S) is None
    assert await ids(store, A) == ["a1"]


async def test_cancel_matches_the_whole_task_id(store: QueueStore) -> None:
    await store.enqueue(A, [entry("task-10"), entry("task-1")], now=T0)
    assert await store.cancel(A, "task-1", now=T0)
    assert await ids(store, A) == ["task-10"]


async def test_cancel_in_a_device_in_backoff_keeps_it_in_backoff(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 2), now=T0)
    popped = await store.pop(A, "tok", 1, now=T0)
    await store.defer(A, "tok", [popped.taken[0].task_id], "no worker", now=T0)
    assert await store.cancel(A, "a0", now=T0 + S)
    assert await store.cancel(A, "a1", now=T0 + S)
    meta = await store.device_meta(A)
    assert (meta["state"], meta["backlog"]) == ("backoff", "0")
    # its resume finds nothing left
    assert await store.resume_due(now=T0 + 30 * S) == [A]
    assert await store.device_meta(A) == {}  # idle, nothing outstanding: its meta is forgotten


# --- leases ------------------------------------------------------------------------------------------

async def test_leases_due_lists_expired_leases_by_device_and_renew_pushes_them_back(
        store: QueueStore, redis: Redis, keys: Keys) -> None:
    ttl = int(store.settings.lease_ttl_s * 1000)
    await store.enqueue(A, tasks("a", 2), now=T0)
    await store.enqueue(B, tasks("b", 1), now=T0)
    await serve(store, A, 2, T0)
    await serve(store, B, 1, T0 + 10 * S)
    assert await store.leases_due(now=T0 + ttl - 1) == {}
    assert await store.leases_due(now=T0 + ttl) == {A: [("a0", 1), ("a1", 1)]}
    assert await store.leases_due(now=T0 + 10 * S + ttl) == {A: [("a0", 1), ("a1", 1)], B: [("b0", 1)]}
    # When a live worker renews a0 (and an unknown id)
    await store.renew_leases(["a0", "ghost"], now=T0 + 30 * S)
    # Then a0 is due later, and no lease is invented
    assert await redis.zscore(keys.leases, "a0") == T0 + 30 * S + ttl
    assert await redis.zscore(keys.leases, "ghost") is None
    assert await store.leases_due(now=T0 + ttl) == {A: [("a1", 1)]}
    await store.renew_leases([])


async def test_leases_due_drops_a_deadline_without_lease_data(store: QueueStore, redis: Redis,
                                                               keys: Keys) -> None:
    await redis.zadd(keys.leases, {"orphan": T0})
    assert await store.leases_due(now=T0 + S) == {}
    assert await redis.zscore(keys.leases, "orphan") is None


async def test_expired_leases_go_back_through_requeue(store: QueueStore) -> None:
    ttl = int(store.settings.lease_ttl_s * 1000)
    await store.enqueue(A, tasks("a", 3), now=T0)
    await serve(store, A, 2, T0)
    due = await store.leases_due(now=T0 + ttl)
    for mac, leases in due.items():
        await store.requeue(mac, list(leases), count_attempt=True, reason="lease expired", now=T0 + ttl)
    assert [(e.task_id, e.attempt) for e in await store.queued(A)] == [("a0", 1), ("a1", 1), ("a2", 0)]
    assert await store.leases_due(now=T0 + 2 * ttl) == {}


# --- concurrency ---------------------------------------------------------------------------------

async def test_concurrent_pops_of_one_device_hand_out_each_task_once(store: QueueStore) -> None:
    await store.enqueue(A, tasks("a", 20), now=T0)
    results = await asyncio.gather(*(store.pop(A, f"tok-{i}", 5, now=T0) for i in range(8)))
    winners = [r for r in results if r.ready]
    assert len(winners) == 1
    assert [e.task_id for e in winners[0].taken] == [f"a{i}" for i in range(5)]

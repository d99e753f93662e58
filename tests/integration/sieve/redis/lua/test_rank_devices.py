"""rankDevices (QueueStore.rank): the longest wait first, priority classes, max_wait lifting a device to the top
tier, weights, starvation hints, the excluded device.
"""

from __future__ import annotations

from redis.asyncio import Redis

from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import (
    BACKGROUND,
    CRITICAL,
    HIGH,
    LOW,
    NORMAL,
    T0,
    A,
    B,
    C,
    S,
    entry,
    serve,
    tasks,
)


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
    redis: Redis, settings: Settings
) -> None:
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


async def test_a_normal_device_whose_wait_reached_max_wait_beats_a_high_priority_one(store: QueueStore) -> None:
    # Given A (NORMAL) queued at T0 and B (HIGH) queued later
    await store.enqueue(A, [entry("a1", prio=NORMAL, at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", prio=HIGH, at=T0 + 60 * S)], now=T0 + 60 * S)
    # Then just before max_wait the HIGH device wins, and from max_wait on the NORMAL one does
    assert (await store.rank(now=T0 + 600 * S - 1)).mac == B
    assert (await store.rank(now=T0 + 600 * S)).mac == A


async def test_two_devices_over_max_wait_are_ranked_by_the_oldest_wait_whatever_their_priority(
    store: QueueStore,
) -> None:
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


async def test_a_weight_does_not_lift_a_device_over_a_higher_priority_class(redis: Redis, settings: Settings) -> None:
    store = QueueStore(redis, settings.replace(device_weights=f"{A}=100"))
    await store.enqueue(A, [entry("a1", prio=NORMAL, at=T0)], now=T0)
    await store.enqueue(B, [entry("b1", prio=HIGH, at=T0 + 100 * S)], now=T0 + 100 * S)
    assert (await store.rank(now=T0 + 101 * S)).mac == B


async def test_a_weight_is_capped_by_max_wait_but_still_counts_in_the_top_tier(
    redis: Redis, settings: Settings
) -> None:
    store = QueueStore(redis, settings.replace(device_weights=f"{A}=2"))
    await store.enqueue(B, [entry("b1", at=T0)], now=T0)
    await store.enqueue(A, [entry("a1", at=T0 + 100 * S)], now=T0 + 100 * S)
    # B waited 1000 s, A 900 s: both capped at 600 s; A's weight decides
    assert (await store.rank(now=T0 + 1000 * S)).mac == A


async def test_equal_scores_go_to_the_heavier_device(redis: Redis, settings: Settings) -> None:
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


async def test_rank_skips_an_excluded_device_even_behind_two_others_in_the_same_set(store: QueueStore) -> None:
    for i, mac in enumerate((A, B, C)):
        await store.enqueue(mac, [entry(f"t{i}", at=T0 + i * S)], now=T0 + i * S)
    assert (await store.rank(exclude=A, now=T0 + 10 * S)).mac == B

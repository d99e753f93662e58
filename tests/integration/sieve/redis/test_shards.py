"""The queue store with the keyspace in 4 shards on one Redis: a device's keys are in its shard's tag, calls about
many devices are split by shard, claims, acks, requeues, delayed tasks, reclaims and dead letters work across the
shards, and the global views are the shards' sums."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from sieve.redis.dead_letter_store import DeadLetterStore
from sieve.redis.entry import Entry
from sieve.redis.keys import Keys, shard_of
from sieve.redis.queue_store import QueueStore
from sieve.redis.scheduler_state import SchedulerState
from sieve.settings import Settings
from sieve.v1 import types_pb2
from tests.integration.sieve.redis.lua.helpers import T0, S, assert_counters, entry, tasks
from tests.support.redis import keys_matching

SHARDS = 4
MACS = [f"AA:BB:CC:DD:00:{i:02X}" for i in range(40)]
TEXT = types_pb2.TASK_TYPE_TEXT


@pytest.fixture
def sharded(settings: Settings) -> Settings:
    return settings.replace(redis_shards=SHARDS, lease_ttl_s=10)


@pytest.fixture
async def store(redis: Redis, sharded: Settings) -> AsyncIterator[QueueStore]:
    store = QueueStore(redis, sharded)
    await store.mark_rebuilt("test")
    yield store
    await assert_counters(redis, sharded.redis_prefix, SHARDS)


def owned(caller: str, prefix: str, n: int) -> list[Entry]:
    return [Entry(f"{prefix}{i}", TEXT, 3, T0, T0 + 3600 * S, caller=caller) for i in range(n)]


async def test_enqueueing_over_many_devices_lands_in_every_shards_tag_and_the_sums_are_right(
    redis: Redis, store: QueueStore, sharded: Settings
) -> None:
    outcome = await store.enqueue_many({mac: owned("c1", f"{i}-", 2) for i, mac in enumerate(MACS)}, now=T0)
    assert all(isinstance(o, tuple) and o[0] == 2 for o in outcome.values())
    # each device's keys are under its shard's tag, and every shard has some
    metas = await keys_matching(redis, store.keys.meta_pattern)
    assert len(metas) == len(MACS)
    assert {Keys(sharded.redis_prefix, shard_of(mac, SHARDS), SHARDS).meta(mac) for mac in MACS} == set(metas)
    assert {shard_of(mac, SHARDS) for mac in MACS} == set(range(SHARDS))
    per_shard = [int(await redis.get(k.pending) or 0) for k in store.shard_keys]
    assert all(n > 0 for n in per_shard) and sum(per_shard) == 80
    # the global views are the sums
    assert await store.pending() == 80
    assert await store.caller_open(["c1"]) == {"c1": 80}
    assert await store.caller_open() == {"c1": 80}
    pending, backlogs, caller_open, _, _ = await store.admission_view(MACS[:5], "c1")
    assert (pending, caller_open, backlogs) == (80, 80, dict.fromkeys(MACS[:5], 2))
    gauges = await SchedulerState(store).gauges()
    assert (gauges.pending, gauges.devices) == (80, 40)


async def test_the_global_limit_counts_the_other_shards(store: QueueStore, sharded: Settings) -> None:
    store = QueueStore(store.redis, sharded.replace(max_total_pending=10))
    first, second = [m for m in MACS if shard_of(m, SHARDS) == 0][:1], [m for m in MACS if shard_of(m, SHARDS) == 1]
    assert await store.enqueue_many({first[0]: tasks("a", 8, at=T0)}, now=T0) == {first[0]: (8, 8)}
    # another shard holds 2 tasks of room: a device there gets them, the next is refused
    outcome = await store.enqueue_many({second[0]: tasks("b", 2, at=T0), second[1]: tasks("c", 1, at=T0)}, now=T0)
    assert outcome[second[0]] == (2, 10)
    refused = outcome[second[1]]
    assert not isinstance(refused, tuple) and refused.pending == 10


async def test_a_claim_round_takes_from_every_shard_and_acks_find_their_shard(store: QueueStore) -> None:
    await store.enqueue_many({mac: tasks(f"{i}-", 1, at=T0) for i, mac in enumerate(MACS)}, now=T0)
    claim = await store.claim("tok", 40, {TEXT: 40}, max_devices=40, now=T0 + S)
    assert claim.taken == 40
    assert {shard_of(mac, SHARDS) for mac, _ in claim.devices} == set(range(SHARDS))
    assert await store.pending() == 0
    leases = [(e.task_id, e.attempt) for _, p in claim.devices for e in p.taken]
    device_of = {e.task_id: mac for mac, p in claim.devices for e in p.taken}
    # half acked with their devices known, half looked up in every shard's lease data
    half = len(leases) // 2
    assert await store.ack(leases[:half], device_of=device_of) == [True] * half
    assert await store.ack(leases[half:]) == [True] * (len(leases) - half)
    assert await store.ack(leases[:2]) == [False, False]
    gauges = await SchedulerState(store).gauges()
    assert (gauges.leased, gauges.devices) == (0, 0)


async def test_a_claim_round_splits_its_budget_by_the_shards_ready_devices(store: QueueStore) -> None:
    await store.enqueue_many({mac: tasks(f"{i}-", 5, at=T0) for i, mac in enumerate(MACS)}, now=T0)
    taken: collections.Counter[int] = collections.Counter()
    for r in range(20):  # (one task per device per call: a round takes 4, one per caller's part in a shard)
        claim = await store.claim(f"t{r}", 8, {TEXT: 8}, max_devices=8, per_device=1, now=T0 + S + r)
        taken.update(shard_of(mac, SHARDS) for mac, p in claim.devices for _ in p.taken)
    devices = collections.Counter(shard_of(mac, SHARDS) for mac in MACS)
    # 80 tasks in all, each shard within one task of its share by ready devices
    assert sum(taken.values()) == 80
    for shard in range(SHARDS):
        assert abs(taken[shard] - 80 * devices[shard] / len(MACS)) <= 1.5, (taken, devices)
    await store.recount_pending()


async def test_requeue_delay_promote_and_reclaim_work_in_each_devices_shard(store: QueueStore) -> None:
    macs = [next(m for m in MACS if shard_of(m, SHARDS) == s) for s in range(SHARDS)]
    await store.enqueue_many({mac: [entry(f"t{i}", at=T0)] for i, mac in enumerate(macs)}, now=T0)
    claim = await store.claim("tok", 4, None, max_devices=4, now=T0)
    assert claim.taken == 4
    by_mac = {mac: p.taken[0] for mac, p in claim.devices}
    # the first two go back after a delay, the others' leases run out
    for mac in macs[:2]:
        e = by_mac[mac]
        await store.requeue(
            mac, [(e.task_id, e.attempt)], count_attempt=True, reason="x", retry_at_ms=T0 + 5 * S, now=T0
        )
    assert len(await store.delayed_task_ids()) == 2
    assert await store.promote_due(now=T0 + 6 * S, shards=[shard_of(macs[0], SHARDS)]) == 1
    assert await store.promote_due(now=T0 + 6 * S) == 1
    due = await store.leases_due(now=T0 + 60 * S)
    assert set(due) == set(macs[2:])
    for mac, leases in due.items():
        await store.requeue(mac, [(t, a) for t, a in leases], count_attempt=False, reason="lease expired")
    assert await store.pending() == 4
    assert {e.task_id for mac in macs for e in await store.queued(mac)} == {"t0", "t1", "t2", "t3"}


async def test_lease_facts_renewals_and_dead_letters_are_read_across_shards(
    store: QueueStore, sharded: Settings
) -> None:
    store = QueueStore(store.redis, sharded.replace(max_attempts=1))
    macs = [next(m for m in MACS if shard_of(m, SHARDS) == s) for s in range(SHARDS)]
    await store.enqueue_many({mac: [entry(f"t{i}", at=T0)] for i, mac in enumerate(macs)}, now=T0)
    claim = await store.claim("tok", 4, None, max_devices=4, now=T0)
    facts = await store.lease_facts([f"t{i}" for i in range(4)] + ["nope"])
    assert sorted(facts) == ["t0", "t1", "t2", "t3"] and {f.mac for f in facts.values()} == set(macs)
    await store.renew_leases(["t0", "t3"], now=T0 + 100 * S)
    assert set(await store.leases_due(now=T0 + 50 * S)) == {macs[1], macs[2]}
    # a counted requeue at the last attempt dead-letters, in the device's shard
    for mac, p in claim.devices:
        await store.requeue(mac, [(e.task_id, e.attempt) for e in p.taken], count_attempt=True, reason="boom")
    letters = DeadLetterStore(store)
    assert await letters.count() == 4
    records = await letters.all()
    assert sorted(r["task_id"] for _, r in records) == ["t0", "t1", "t2", "t3"]
    assert sorted(await store.dead_letter_records()) == ["t0", "t1", "t2", "t3"]
    assert await letters.remove([records[0][0]]) == 1
    await letters.append([records[0][1]])
    assert await letters.count() == 4 and await letters.clear() == 4


async def test_a_shard_that_lost_its_generation_is_the_one_reported_lost(store: QueueStore) -> None:
    assert await store.lost_shards() == [] and await store.generation() == "|".join(["test"] * SHARDS)
    await store.redis.delete(store.shard_keys[2].generation)
    assert await store.lost_shards() == [2] and await store.generation() is None
    with pytest.raises(Exception, match="rebuilt"):
        await store.enqueue_many({MACS[0]: tasks("a", 1, at=T0)}, now=T0)
    await store.mark_rebuilt("again", shards=[2])
    assert await store.lost_shards() == []


async def test_a_caller_with_one_device_gets_half_beside_a_caller_with_devices_in_every_shard(
    store: QueueStore,
) -> None:
    one = MACS[0]
    many = [m for m in MACS[1:] if shard_of(m, SHARDS) != shard_of(one, SHARDS)][:12]
    many.append(next(m for m in MACS[1:] if shard_of(m, SHARDS) == shard_of(one, SHARDS)))
    groups = {mac: owned("many", f"{i}-", 50) for i, mac in enumerate(many)} | {one: owned("one", "o-", 190)}
    await store.enqueue_many(groups, now=T0)
    served: collections.Counter[str] = collections.Counter()
    for r in range(40):
        claim = await store.claim(f"t{r}", 10, {TEXT: 10}, max_devices=10, now=T0 + S + r)
        served.update(e.caller for _, p in claim.devices for e in p.taken)
        await store.ack([(e.task_id, e.attempt) for _, p in claim.devices for e in p.taken])
    # the caller level holds across shards: half each, whatever the number of devices and shards
    total = served["one"] + served["many"]
    assert total >= 300 and abs(served["one"] / total - 0.5) <= 0.05, served
    await store.recount_pending()


def test_the_split_gives_each_caller_its_share_and_each_shard_the_sum_of_its_callers_parts(
    store: QueueStore,
) -> None:
    # caller a: 4 ready devices in each of the 4 shards; caller b: one, in shard 2
    per_group = [{"a": (1, 4)}, {"a": (1, 4)}, {"a": (1, 4), "b": (1, 1)}, {"a": (1, 4)}]
    given: collections.Counter[tuple[int, str]] = collections.Counter()
    for _ in range(100):
        shares, caps = store.shard_shares(per_group, 8)
        assert sum(shares) == 8 and all(sum(caps[s].values()) == shares[s] for s in range(SHARDS))
        given.update({(s, g): n for s in range(SHARDS) for g, n in caps[s].items()})
    assert given[(2, "b")] == 400 and all(given[(s, "a")] == 100 for s in range(SHARDS))
    # a round is no larger than one batch per caller's part in a shard: b's half of it is at most one batch
    counts = [{g: n for g, (_, n) in groups.items()} for groups in per_group]
    shares, caps = store.shard_shares(per_group, 1000, counts, store.settings.batch_size)
    assert caps[2]["b"] == store.settings.batch_size and sum(shares) == 2 * store.settings.batch_size

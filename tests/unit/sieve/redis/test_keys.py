"""The key schema with shards: one shard names every key as before shards existed; shard s > 0 has a tag of its
own; a device's shard is a stable hash of its MAC; the global keys keep the plain tag."""

from __future__ import annotations

import collections
import fnmatch

import pytest
from redis.crc import key_slot

from sieve.redis.keys import CLUSTER_SLOTS, Keys, shard_of, shard_tag

MACS = [f"AA:BB:CC:DD:{i // 256:02X}:{i % 256:02X}" for i in range(4000)]


def test_one_shard_keeps_every_key_name_as_it_was() -> None:
    keys = Keys("p")
    assert keys.base == keys.global_base == "{p}"
    assert (keys.pending, keys.leases, keys.lease_data, keys.generation) == (
        "{p}:pending",
        "{p}:leases",
        "{p}:lease:data",
        "{p}:generation",
    )
    assert (keys.meta("m"), keys.queue("m", 3), keys.lock("m"), keys.schedule(3, 1, "c")) == (
        "{p}:meta:m",
        "{p}:q:m:3",
        "{p}:lock:m",
        "{p}:sched:3:1:c",
    )
    assert (keys.queue_pattern, keys.meta_pattern) == ("{p}:q:*", "{p}:meta:*")
    assert all(shard_of(mac, 1) == 0 for mac in MACS[:10])


def test_a_shard_after_the_first_has_its_own_hash_tag_and_the_global_keys_keep_the_plain_one() -> None:
    keys = Keys("p", 3, 4)
    tag = keys.base
    assert shard_tag("p", 0, 4) == "{p}" and tag == shard_tag("p", 3, 4) and tag.startswith("{p~3")
    assert (keys.pending, keys.meta("m"), keys.dead_letters, keys.caller_open, keys.generation) == (
        f"{tag}:pending",
        f"{tag}:meta:m",
        f"{tag}:dead",
        f"{tag}:caller:open",
        f"{tag}:generation",
    )
    # what the installation shares stays under {p}, whatever the shard
    for name in ("lease_key", "schedulers", "wake_channel", "rebuild_lock", "reconcile_lock", "drain", "watermark"):
        assert getattr(keys, name) == getattr(Keys("p"), name)
    assert keys.submit_bucket("c") == "{p}:bucket:c" and keys.worker("w") == "{p}:worker:w"
    assert keys.shard_lease(2) == "{p}:shard:2"


def test_the_scan_patterns_cover_every_shard_and_no_other_prefix() -> None:
    shards = [Keys("p", s, 4) for s in range(4)]
    names = [k.queue("m", 3) for k in shards] + [k.meta("m") for k in shards] + [k.pending for k in shards]
    pattern = shards[1].all_pattern
    assert all(fnmatch.fnmatchcase(n, pattern) for n in names)
    assert not fnmatch.fnmatchcase("{px}:pending", pattern) and not fnmatch.fnmatchcase("{q}:pending", pattern)
    assert [n for n in names if fnmatch.fnmatchcase(n, shards[0].queue_pattern)] == names[:4]
    assert [n for n in names if fnmatch.fnmatchcase(n, shards[2].meta_pattern)] == names[4:8]


@pytest.mark.parametrize("prefix", ["sieve", "test-0a1b2c3d4e", "x"])
def test_the_shards_slots_are_spread_evenly_round_the_slot_ring(prefix: str) -> None:
    slots = [key_slot(Keys(prefix, s, 6).base.encode()) for s in range(6)]
    # each shard's slot sits in its sixth of the ring counted from shard 0's, so three masters with equal ranges
    # of slots serve two shards each, give or take one
    for s, slot in enumerate(slots):
        assert 0 <= (slot - slots[0] - s * CLUSTER_SLOTS / 6) % CLUSTER_SLOTS < CLUSTER_SLOTS / 6 / 4
    for first in range(0, CLUSTER_SLOTS, 997):  # wherever the masters' ranges begin
        per_master = collections.Counter(int((slot - first) % CLUSTER_SLOTS // (CLUSTER_SLOTS / 3)) for slot in slots)
        assert sorted(per_master) == [0, 1, 2] and max(per_master.values()) <= 3


def test_a_device_goes_to_the_same_shard_every_time_and_devices_spread_over_all_shards() -> None:
    assert [shard_of(mac, 6) for mac in MACS[:50]] == [shard_of(mac, 6) for mac in MACS[:50]]
    assert shard_of("AA:BB:CC:DD:EE:01", 6) == 5  # crc32: the same in every process and every release
    spread = collections.Counter(shard_of(mac, 6) for mac in MACS)
    assert sorted(spread) == list(range(6))
    assert max(spread.values()) < 1.2 * len(MACS) / 6

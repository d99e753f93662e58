"""The Redis key schema: every key Sieve uses is named here, and nowhere else.

The keyspace is split into `redis_shards` shards, each under its own hash tag: shard 0 under `{prefix}`, shard
s > 0 under `{prefix~s}` or `{prefix~s~k}` (`shard_tag`: its slot is spread evenly from shard 0's), so every Lua
script's keys — one shard's — live in one Redis Cluster slot, and a cluster spreads the shards over its masters.
A device belongs to shard `shard_of(mac, shards)` (crc32 of the MAC, modulo the number of shards: stable, the same
in every process); everything about devices and tasks is kept in the device's shard (meta, queues, locks, schedule
and caller-group sets, pending and caller counts, serving, backoff, overloaded, leases, delayed, dead letters,
generation). What the whole installation shares is global, under the plain `{prefix}` tag (`Keys.global_base`):
the lease signing key, the scheduler replicas and their shard leases, the rebuild and reconcile turns, the
registry's workers, the GPU-expected mark, the drain rates, the watermark, the submit buckets and the wake
channel. With one shard, shard 0 is the whole keyspace and every name is what it was before shards existed.

Per-device keys come as one block (`DeviceKeys.block`) in a fixed order that every device script
expects as KEYS[1..11] (and names with `lua/includes/deviceBlock.lua`):

    KEYS[1]      meta hash of the device      {p}:meta:<mac>
    KEYS[2..6]   its queue lists, priority 1..5 (BACKGROUND..CRITICAL)   {p}:q:<mac>:<prio>
    KEYS[7..11]  the schedule sets of its weight, priority 1..5, without the caller group:
                 {p}:sched:<prio>:<weight>; the device sits in {p}:sched:<prio>:<weight>:<group>

The fair order has two levels (`lua/includes/rankNext.lua`): caller groups, then the devices of a group. A
device's group is the caller that first queued work for it (meta "group", "-" when none was named). The
scripts name a group's keys from these patterns (same hash tag, so the same slot): `schedule`, `group_ready`,
`callers`; `lua/includes/deviceBlock.lua` builds the same names as this module (checked by the tests), and
`claimDevices` builds a device's block as `device` does.

Queue entries are strings `task_id|type|prio|enqueued_ms|expires_ms|attempt|defers|failures|trace[|caller]`
(`entry.py`).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

from redis.crc import key_slot

PRIORITIES = (1, 2, 3, 4, 5)  # BACKGROUND, LOW, NORMAL, HIGH, CRITICAL (sieve.v1.Priority values)


@dataclass(frozen=True, slots=True)
class DeviceKeys:
    """The keys of one device, for a given weight."""

    meta: str
    queues: tuple[str, ...]
    schedules: tuple[str, ...]
    lock: str

    @property
    def block(self) -> list[str]:
        """KEYS[1..11] of every device script: meta, five queues, five schedule sets."""
        return [self.meta, *self.queues, *self.schedules]


def group_name(caller: str) -> str:
    """The caller group of a caller's devices ("-" for tasks without a caller)."""
    return caller or "-"


#: between the prefix and the shard number in a shard's hash tag ("{prefix~3}")
SHARD_MARK = "~"


def shard_of(mac: str, shards: int) -> int:
    """The shard of a device: crc32 of its (normalised) MAC modulo the number of shards; 0 with one shard."""
    if shards <= 1:
        return 0
    return zlib.crc32(mac.encode()) % shards


#: Redis Cluster's slots
CLUSTER_SLOTS = 16384


@functools.cache
def shard_tag(prefix: str, shard: int, shards: int = 1) -> str:
    """The hash tag of a shard's keys: "{prefix}" for shard 0; for shard s of n, "{prefix~s}" or "{prefix~s~k}"
    with the least k that puts its slot in the first quarter of the s-th n-th of the slot ring counted from shard
    0's slot. The shards' slots are then spread evenly over the ring, so that a cluster whose masters serve equal
    ranges of slots (what `redis-cli --cluster create` makes) serves n / masters shards each, give or take one,
    whatever the prefix: a shard tag's slot is chosen, not left to chance."""
    if shard == 0:
        return "{" + prefix + "}"
    name = f"{prefix}{SHARD_MARK}{shard}"
    if shards <= 1:
        return "{" + name + "}"
    width = CLUSTER_SLOTS / shards
    start = (key_slot(prefix.encode()) + shard * width) % CLUSTER_SLOTS
    for k in range(100_000):
        candidate = name if k == 0 else f"{name}{SHARD_MARK}{k}"
        if (key_slot(candidate.encode()) - start) % CLUSTER_SLOTS < max(1.0, width / 4):
            return "{" + candidate + "}"
    return "{" + name + "}"  # (not reached: a window of a quarter of a shard's width is found in a few dozen tries)


class Keys:
    """Builds every key name of one shard (its own tag) and of the installation (the global tag) from the
    configured prefix; `shards` (how many the installation has) only widens the SCAN patterns to cover them all."""

    def __init__(self, prefix: str, shard: int = 0, shards: int = 1) -> None:
        self.prefix = prefix
        self.shard = shard
        self.shards = max(1, shards)
        #: the tag of what every shard shares (the same as shard 0's)
        self.global_base = "{" + prefix + "}"
        #: this shard's tag
        self.base = shard_tag(prefix, shard, self.shards)
        g = self.global_base
        #: Tasks waiting in all device queues (not leased, not delayed).
        self.pending = f"{self.base}:pending"
        #: Devices currently being served: mac -> lock deadline (ms).
        self.serving = f"{self.base}:serving"
        #: Devices in backoff: mac -> unschedulable_until (ms).
        self.backoff = f"{self.base}:backoff"
        #: Devices over their pending limit: refused until a pop or a cancel brings their backlog below it.
        self.overloaded = f"{self.base}:overloaded"
        #: Devices that have queued work or are being served.
        self.devices = f"{self.base}:devices"
        #: Handed-out tasks: task_id -> lease deadline (ms).
        self.leases = f"{self.base}:leases"
        #: Handed-out tasks: task_id -> "mac|entry" (the entry carries the attempt, the fencing token).
        self.lease_data = f"{self.base}:lease:data"
        #: The key lease tokens are signed with (sieve/redis/leases.py), shared by every scheduler replica.
        self.lease_key = f"{g}:lease:key"
        #: Scheduler replicas that are alive: replica id -> when it last said so (ms). A replica silent for
        #: scheduler_dead_after_s is gone: what it handed out and no worker re-announced is put back.
        self.schedulers = f"{g}:schedulers"
        #: Tasks waiting out a retry delay: "mac|entry" -> due time (ms).
        self.delayed = f"{self.base}:delayed"
        #: Dead letters, newest first, capped (JSON objects).
        self.dead_letters = f"{self.base}:dead"
        #: The latest watermark record (JSON, with a TTL).
        self.watermark = f"{g}:watermark"
        #: Changes when Redis is rebuilt from PostgreSQL; a missing key means Redis lost its memory.
        self.generation = f"{self.base}:generation"
        #: With several shards: how many the keyspace had when this shard was rebuilt (a shard that survived a change
        #: of redis_shards tells of it: scheduler_svc/rebuild.py refuses to rebuild the others beside it).
        self.shard_count = f"{self.base}:shards"
        #: Held (SET NX EX) by the scheduler replica that rebuilds Redis from PostgreSQL.
        self.rebuild_lock = f"{g}:rebuild"
        #: Taken (SET NX PX, for one reconcile interval) by the scheduler replica that reconciles Redis with
        #: PostgreSQL next: passes start at least an interval apart, whatever the number of replicas.
        self.reconcile_lock = f"{g}:reconcile"
        #: Pub/sub channel: a device became schedulable.
        self.wake_channel = f"{g}:wake"
        #: Registry: ids of registered workers (the records themselves expire).
        self.worker_index = f"{g}:workers"
        #: Tasks each caller has open in Redis (queued, leased or delayed): caller -> count (hash; a caller at 0
        #: has no field). Kept by the same scripts that move tasks, rebuilt with the queues.
        self.caller_open = f"{self.base}:caller:open"
        #: Exists (with a TTL of gpu_expected_s, refreshed by every scheduler replica) while a GPU worker that
        #: takes OCR has been alive recently: GPU workers are expected (the no-GPU strategy applies).
        self.gpu_expected = f"{g}:gpu:expected"
        #: Dispatch rate of each scheduler replica: replica id -> "tasks_per_s|at_ms" (how fast the queues drain,
        #: for the intake's retry delays).
        self.drain = f"{g}:drain"
        #: Each caller group's virtual start in the fair order: group -> ms of charged work (lua/includes/callerGroup).
        self.caller_served = f"{self.base}:caller:served"
        #: The virtual time of the caller level: the virtual start of the group served last.
        self.caller_vtime = f"{self.base}:caller:vtime"
        #: Every caller group that has had a ready device (its schedule sets are where the reconciler looks).
        self.groups = f"{self.base}:groups"

    def queue(self, mac: str, priority: int) -> str:
        return f"{self.base}:q:{mac}:{priority}"

    def meta(self, mac: str) -> str:
        return f"{self.base}:meta:{mac}"

    def lock(self, mac: str) -> str:
        return f"{self.base}:lock:{mac}"

    def schedule_base(self, priority: int, weight: int) -> str:
        """The name the schedule sets of a priority and weight share before ":<group>" (KEYS[7..11])."""
        return f"{self.base}:sched:{priority}:{weight}"

    def schedule(self, priority: int, weight: int, group: str = "-") -> str:
        """Ready devices of a caller group, priority and weight, scored by the start of their wait (ms)."""
        return f"{self.schedule_base(priority, weight)}:{group_name(group)}"

    def group_ready(self, group: str) -> str:
        """Every ready device of a caller group, scored by the start of its wait (ms)."""
        return f"{self.base}:gready:{group_name(group)}"

    def callers(self, caller_weight: int) -> str:
        """Caller groups of this weight with a ready device, scored by their virtual start (includes/callerGroup)."""
        return f"{self.base}:callers:{caller_weight}"

    def device(self, mac: str, weight: int) -> DeviceKeys:
        return DeviceKeys(
            meta=self.meta(mac),
            queues=tuple(self.queue(mac, p) for p in PRIORITIES),
            schedules=tuple(self.schedule_base(p, weight) for p in PRIORITIES),
            lock=self.lock(mac),
        )

    def submit_bucket(self, caller: str) -> str:
        """A caller's submit token bucket (hash: tokens, ts_ms; expires once full again)."""
        return f"{self.global_base}:bucket:{caller}"

    def slot_pool(self, pool: str) -> str:
        """A slot pool's holders (zset: holder -> lease deadline, ms; sieve/redis/slot_pools), under the global tag:
        a pool is one cap for the whole installation, whatever shard its jobs' devices live in."""
        return f"{self.global_base}:slots:{pool}"

    def worker(self, worker_id: str) -> str:
        return f"{self.global_base}:worker:{worker_id}"

    @property
    def worker_pattern(self) -> str:
        """SCAN MATCH pattern of worker records."""
        return f"{self.global_base}:worker:*"

    def shard_lease(self, shard: int) -> str:
        """The lease of a shard by a scheduler replica (SET NX PX replica id; sieve/redis/shard_leases.py)."""
        return f"{self.global_base}:shard:{shard}"

    @property
    def _tags_pattern(self) -> str:
        """SCAN MATCH pattern of the tags of every shard ("{prefix}" and "{prefix~s}"), or of the one tag."""
        return f"{{{self.prefix}}}" if self.shards == 1 else f"{{{self.prefix}[{SHARD_MARK}}}]*"

    @property
    def all_pattern(self) -> str:
        """SCAN MATCH pattern of every key of this prefix, in every shard (whatever their number)."""
        return f"{{{self.prefix}[}}{SHARD_MARK}]*"

    @property
    def queue_pattern(self) -> str:
        """SCAN MATCH pattern of every device queue list (of every shard)."""
        return f"{self._tags_pattern}:q:*"

    @property
    def meta_pattern(self) -> str:
        """SCAN MATCH pattern of every device meta hash (of every shard)."""
        return f"{self._tags_pattern}:meta:*"

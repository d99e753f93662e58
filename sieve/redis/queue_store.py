"""Typed access to the device queues in Redis: every state change is one Lua script call.

The path of a task through Redis reads in this module's order: enqueue -> rank -> claim / pop (lease)
-> release -> ack, with requeue / defer / resume for the ways back.

Shards (`redis_shards`, sieve/redis/keys.py): every script works on one shard's keys, never two (on a Redis
Cluster two shards may live on two masters). A call about one device goes to its shard; a call about many
devices (enqueue_many, admission reads, acks, locate, repair) is split by shard, one script call per shard, all
in one pipelined round trip; the global views (pending, caller open counts, dead letters, delayed ids) are read
from every shard and summed. With one shard every call is what it was before shards existed: same keys, same
round trips. What is only approximate across shards (the global limits, the fair order) is said where it is done.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from sieve.caller_policy import CallerPolicies
from sieve.errors import AdmissionRefused, LockNotOwned, RedisNotReady, ScriptCode
from sieve.redis import lua
from sieve.redis.entry import Entry
from sieve.redis.keys import PRIORITIES, Keys, group_name, shard_of
from sieve.redis.reply import reply as _reply
from sieve.settings import Settings

#: a pending limit that is never reached
NO_LIMIT = 2**50
#: most devices one enqueueMany call takes (bounds the time one call holds Redis)
ENQUEUE_DEVICES_PER_CALL = 1000
#: what one task is worth to its caller's virtual start when nothing better is known (ms; lua/includes/callerGroup)
DEFAULT_MS_PER_TASK = 1.0


def now_ms() -> float:
    """Now in milliseconds, to 0.1 ms (Lua keeps 14 significant digits of a number)."""
    return round(time.time() * 1000, 1)


@dataclass(frozen=True, slots=True)
class Rank:
    """The device to serve next (`mac` is None when none is schedulable)."""

    mac: str | None
    starving: bool
    next_backoff_ms: float | None
    longest_wait_ms: float | None


@dataclass(frozen=True, slots=True)
class Popped:
    """Tasks taken from a device (leased), and tasks dropped there because they had expired."""

    ready: bool
    taken: list[Entry] = field(default_factory=list)
    expired: list[Entry] = field(default_factory=list)
    #: popping stopped at a task of this type: not allowed, or its budget was spent (0: it did not stop so)
    blocked: int = 0


@dataclass(frozen=True, slots=True)
class ClaimRound:
    """What one claim round asks for (QueueStore.claim): `want` tasks in all, `budget` per type (None: any), from at
    most `max_devices` devices and `per_device` each, the carry and the clock of the round."""

    token: str
    want: int
    budget: Mapping[int, int] | None
    max_devices: int
    per_device: int | None
    carry_max_ms: float
    ms_per_task: float
    now: float


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claimDevices call took: each device claimed, in the fair order, and the device ranked next."""

    devices: list[tuple[str, Popped]]
    next: Rank

    @property
    def taken(self) -> int:
        return sum(len(p.taken) for _, p in self.devices)


@dataclass(frozen=True, slots=True)
class TokenTake:
    """Submit tokens to take from a caller's token bucket (takeTokens)."""

    caller: str
    wanted: int
    rate_per_s: float
    burst: int


@dataclass(frozen=True, slots=True)
class Requeued:
    """What a requeue did: tasks put back at once, dead letters, and every task whose lease it took back."""

    requeued: int
    dead_letters: list[dict[str, Any]]
    #: tasks whose lease this call took and put back (at once or delayed), dead letters aside
    put_back: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LeaseFact:
    """What Redis holds about one lease: its device, entry (its attempt is the lease number) and deadline (ms)."""

    mac: str
    entry: Entry
    deadline_ms: float


@dataclass(frozen=True, slots=True)
class Deferred:
    """A device backed off (deferDevice): until when (0 when nothing was left), and the tasks dead-lettered."""

    unschedulable_until_ms: int
    dead_letters: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Drain:
    """How fast the queues drain (tasks/s; None when no scheduler replica is dispatching now) and when a
    replica last published its rate (ms; None when none did within DRAIN_KEEP_MS, a day)."""

    rate_per_s: float | None
    last_ms: int | None


#: the drain record lives this long after its last write
DRAIN_KEEP_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class TypesDeferred:
    """Tasks of some types of one device sent to wait (the device itself keeps being served)."""

    #: when the first of them is due again (0 when none waits)
    earliest_due_ms: int
    #: ids of the tasks that wait (leased ones and queued ones alike)
    waiting: list[str]
    dead_letters: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One device as an operator sees it (`QueueStore.device_views`): what waits in each priority's queue, since
    when, and whether it is overloaded or in backoff."""

    mac: str
    #: queued tasks by priority, BACKGROUND..CRITICAL (PRIORITIES' order)
    queued: tuple[int, ...]
    #: the enqueue time (ms) of the oldest task at the head of one of its queues; None when nothing is queued
    oldest_enqueued_ms: int | None
    overloaded: bool
    #: when its backoff ends (ms), None when it is not in backoff
    backoff_until_ms: float | None
    #: the start of its wait as the fair order reads it (ms; the later of its oldest task's enqueue and its last
    #: serve), None when it is not ready (nothing queued, being served, in backoff)
    ready_since_ms: float | None = None


class QueueStore:
    """The per-device queues, schedule sets, locks and leases of one Sieve installation."""

    _SCRIPTS = (
        "enqueueMany",
        "rankDevices",
        "popBatch",
        "claimDevices",
        "releaseDevice",
        "deferDevice",
        "deferTypes",
        "resumeDevice",
        "ackMany",
        "requeueTasks",
        "removeQueued",
        "promoteDelayed",
        "takeTokens",
        "admissionReads",
        "shardDemand",
    )

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        #: how many shards the keyspace is split into, and each shard's keys
        self.shards = settings.redis_shards
        self.shard_keys = tuple(Keys(settings.redis_prefix, s, self.shards) for s in range(self.shards))
        #: shard 0's keys, which carry the global names too (the only shard when there is one)
        self.keys = self.shard_keys[0]
        #: each (shard, caller group)'s part of a claim round not given yet (fractions of a task): rounding favours none
        self._claim_credit: dict[tuple[int, str], float] = {}
        self._scripts = {name: redis.register_script(lua.load(name)) for name in self._SCRIPTS}
        self._classes = [(p, w) for w in settings.all_weights for p in PRIORITIES]
        self._classes_arg = ",".join(f"{p}:{w}" for p, w in self._classes)
        self.callers = CallerPolicies(settings)
        self._caller_weights_arg = ",".join(map(str, self.callers.all_weights))

    async def _call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts[name](keys=keys, args=args)

    async def _call_pipelined(self, calls: list[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Several script calls in one round trip (EVALSHA; loads the scripts once if Redis lost them). Only the
        calls answered NOSCRIPT run again: with several shards on several masters, the others have run."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in todo:
                    name, keys, args = calls[i]
                    pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
                for i, reply in zip(todo, await pipe.execute(raise_on_error=False), strict=True):
                    replies[i] = reply
            todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
            if attempt == 1 and todo:
                for script in self._scripts.values():
                    await self.redis.script_load(script.script)
                continue
            break
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def shard_of(self, mac: str) -> int:
        """The shard a device's keys are in."""
        return shard_of(mac, self.shards)

    def keys_of(self, mac: str) -> Keys:
        """The keys of a device's shard."""
        return self.keys if self.shards == 1 else self.shard_keys[shard_of(mac, self.shards)]

    def _by_shard(self, macs: list[str]) -> dict[int, list[str]]:
        """The devices of each shard, in the order given (shards in the order their first device comes)."""
        out: dict[int, list[str]] = defaultdict(list)
        for mac in macs:
            out[shard_of(mac, self.shards)].append(mac)
        return out

    def _shards(self, shards: list[int] | None) -> list[Keys]:
        """The keys of the given shards (None: all)."""
        return list(self.shard_keys) if shards is None else [self.shard_keys[i] for i in shards]

    async def _each_shard(self, command: Any, shards: list[int] | None = None) -> list[Any]:
        """One command per shard, in one round trip (`command(pipe, keys)` queues it): the replies, in shard order."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for k in self._shards(shards):
                command(pipe, k)
            return list(await pipe.execute())

    def _device(self, mac: str) -> tuple[list[str], str]:
        dk = self.keys_of(mac).device(mac, self.settings.weight_of(mac))
        return dk.block, dk.lock

    # --- enqueue ----------------------------------------------------------------------------------
    async def enqueue(
        self, mac: str, entries: list[Entry], *, now: float | None = None, caller_limit: int = NO_LIMIT
    ) -> tuple[int, int]:
        """Queues a device's tasks; returns (device backlog, global pending) or raises AdmissionRefused."""
        if not entries:
            raise ValueError("nothing to enqueue")
        outcome = (await self.enqueue_many({mac: entries}, now=now, caller_limit=caller_limit))[mac]
        if isinstance(outcome, AdmissionRefused):
            raise outcome
        return outcome

    async def enqueue_many(
        self,
        groups: dict[str, list[Entry]],
        *,
        now: float | None = None,
        admit: bool = True,
        rebuilding: bool = False,
        caller_limit: int = NO_LIMIT,
    ) -> dict[str, tuple[int, int] | AdmissionRefused]:
        """Queues several devices' tasks in one round trip (enqueueMany: one script call per 1 000 devices); each
        device is admitted alone
        (`admit=False` skips the limits: an operator's requeue of dead letters, a rebuild), and so is each
        caller of its entries: at most `caller_limit` open tasks per caller. Raises RedisNotReady while
        Redis has lost its memory and is not rebuilt (`rebuilding=True` is the rebuild itself)."""
        now = now or now_ms()
        s = self.settings
        total, per_device = (s.max_total_pending, s.max_per_device_pending) if admit else (NO_LIMIT, NO_LIMIT)
        per_caller = caller_limit if admit else NO_LIMIT
        by_shard = {0: list(groups)} if self.shards == 1 else self._by_shard(list(groups))
        # several shards: each shard's script checks its own counters, so the global and caller limits are checked
        # against what the other shards held a moment before (read-then-enqueue: concurrent intakes may overshoot a
        # limit by what they enqueue at the same moment); a shard that lost its memory refuses before anything
        others: dict[int, tuple[int, int]] = {}
        if self.shards > 1 and not rebuilding:
            others = await self._other_shards_counts(groups, by_shard)
        calls, macs = [], []
        for shard, shard_macs in by_shard.items():
            k = self.shard_keys[shard]
            other_pending, other_open = others.get(shard, (0, 0))
            limits = [max(0, total - other_pending), per_device, max(0, per_caller - other_open)]
            for start in range(0, len(shard_macs), ENQUEUE_DEVICES_PER_CALL):
                args: list[Any] = [now, *limits, k.wake_channel, int(not rebuilding), k.base]
                for mac in shard_macs[start : start + ENQUEUE_DEVICES_PER_CALL]:
                    entries = groups[mac]
                    caller = entries[0].caller
                    args += [mac, s.weight_of(mac), group_name(caller), self.callers.weight(caller), len(entries)]
                    args += [e.encode() for e in entries]
                    macs.append((mac, other_pending, other_open))
                calls.append(("enqueueMany", [k.pending, k.overloaded, k.devices, k.generation, k.caller_open], args))
        chunks = await self._call_pipelined(calls)
        if any(reply[0] == ScriptCode.REDIS_NOT_READY for reply in chunks):
            raise RedisNotReady("Redis lost its queues; they are being rebuilt from PostgreSQL")
        flat = [v for reply in chunks for v in reply]
        replies = [flat[i : i + 4] for i in range(0, len(flat), 4)]
        out: dict[str, tuple[int, int] | AdmissionRefused] = {}
        for (mac, other_pending, other_open), (code, backlog, pending, caller_open) in zip(macs, replies, strict=True):
            pending, caller_open = pending + other_pending, caller_open + other_open
            out[mac] = (
                (backlog, pending)
                if code == ScriptCode.OK
                else AdmissionRefused(ScriptCode(code), backlog, pending, caller_open)
            )
        return out

    async def _other_shards_counts(
        self, groups: dict[str, list[Entry]], by_shard: dict[int, list[str]]
    ) -> dict[int, tuple[int, int]]:
        """For each shard that takes some of `groups`: the pending tasks and the open tasks of their callers (the
        most of any one of them) that the other shards hold now (one round trip). Raises RedisNotReady when a shard
        has no generation (it lost its memory and is not rebuilt yet): nothing is enqueued then."""
        callers = sorted({entries[0].caller for entries in groups.values() if entries})
        async with self.redis.pipeline(transaction=False) as pipe:
            for k in self.shard_keys:
                pipe.get(k.pending)
                pipe.exists(k.generation)
                pipe.hmget(k.caller_open, callers or [""])
            replies = await pipe.execute()
        pending = [int(replies[3 * i] or 0) for i in range(self.shards)]
        if not all(replies[3 * i + 1] for i in range(self.shards)):
            raise RedisNotReady("Redis lost the queues of a shard; they are being rebuilt from PostgreSQL")
        opens = [[int(v or 0) for v in replies[3 * i + 2]] for i in range(self.shards)]
        out: dict[int, tuple[int, int]] = {}
        for shard in by_shard:
            other_pending = sum(pending) - pending[shard]
            other_open = max(
                (sum(o[c] for i, o in enumerate(opens) if i != shard) for c in range(len(callers) or 1)), default=0
            )
            out[shard] = (other_pending, other_open)
        return out

    async def admission_snapshot(self, devices: list[str]) -> tuple[int, dict[str, int]]:
        """Global pending and each device's backlog, in one round trip (a cheap check before writing)."""
        pending, backlogs, *_ = await self.admission_view(devices, "")
        return pending, backlogs

    async def admission_view(
        self, devices: list[str], caller: str, take: TokenTake | None = None
    ) -> tuple[int, dict[str, int], int, int, float]:
        """Global pending, each device's backlog and the caller's open tasks ("": none) — and with `take`, the
        submit tokens taken from a caller's bucket (granted, seconds until the rest is back; else 0, 0) — in one
        round trip (admissionReads: one command for all the devices)."""
        # one read per shard (every shard's, for the global sums), in one round trip
        by_shard = {0: devices} if self.shards == 1 else {i: [] for i in range(self.shards)} | self._by_shard(devices)
        calls: list[tuple[str, list[str], list[Any]]] = []
        if take is not None:
            calls.append(
                ("takeTokens", [self.keys.submit_bucket(take.caller)], ["", take.rate_per_s, take.burst, take.wanted])
            )
        for shard, macs in by_shard.items():
            k = self.shard_keys[shard]
            calls.append(("admissionReads", [k.pending, k.caller_open], [caller, k.base, *macs]))
        values = await self._call_pipelined(calls)
        granted, wait_s = 0, 0.0
        if take is not None:
            (granted, wait_ms), values = values[0], values[1:]
            granted, wait_s = int(granted), int(wait_ms) / 1000
        pending, caller_open, backlogs = 0, 0, {}
        for macs, (shard_pending, shard_open, *backlog) in zip(by_shard.values(), values, strict=True):
            pending, caller_open = pending + int(shard_pending), caller_open + int(shard_open)
            backlogs.update({m: int(v) for m, v in zip(macs, backlog, strict=True)})
        return pending, backlogs, caller_open, granted, wait_s

    async def caller_open(self, callers: list[str] | None = None) -> dict[str, int]:
        """Open tasks (queued, leased or delayed) per caller: of `callers`, or of every caller that has some."""
        if callers is not None and not callers:
            return {}
        if self.shards == 1:
            if callers is None:
                return {c: int(n) for c, n in (await _reply(self.redis.hgetall(self.keys.caller_open))).items()}
            values = await _reply(self.redis.hmget(self.keys.caller_open, callers))
            return {c: int(v or 0) for c, v in zip(callers, values, strict=True)}
        out: dict[str, int] = defaultdict(int)
        if callers is None:
            for counts in await self._each_shard(lambda pipe, k: pipe.hgetall(k.caller_open)):
                for c, n in counts.items():
                    out[c] += int(n)
            return dict(out)
        for values in await self._each_shard(lambda pipe, k: pipe.hmget(k.caller_open, callers)):
            for c, v in zip(callers, values, strict=True):
                out[c] += int(v or 0)
        return {c: out[c] for c in callers}

    async def take_tokens(
        self, caller: str, wanted: int, rate_per_s: float, burst: int, *, now: float | None = None
    ) -> tuple[int, float]:
        """Takes up to `wanted` submit tokens from the caller's token bucket (Redis's clock unless `now`, ms, is
        given): (tokens granted, seconds until the refused rest is back; 0 when all were granted)."""
        granted, wait_ms = await self._call(
            "takeTokens", [self.keys.submit_bucket(caller)], ["" if now is None else now, rate_per_s, burst, wanted]
        )
        return int(granted), int(wait_ms) / 1000

    async def mark_overloaded(self, mac: str) -> None:
        """Marks a device refused for being over its limit (cleared when its backlog drops below it)."""
        await _reply(self.redis.sadd(self.keys_of(mac).overloaded, mac))

    async def remove_queued(self, mac: str, task_id: str, *, now: float | None = None) -> Entry | None:
        """Takes a task out of its device queue (cancelled or expired); None when it is not queued."""
        block, _ = self._device(mac)
        k = self.keys_of(mac)
        raw = await self._call(
            "removeQueued",
            [*block, k.pending, k.overloaded, k.devices, k.caller_open],
            [now or now_ms(), mac, task_id, self.settings.max_per_device_pending],
        )
        return Entry.decode(raw) if raw else None

    async def cancel(self, mac: str, task_id: str, *, now: float | None = None) -> bool:
        """Removes a queued task; False when it is not in the queue (leased, gone)."""
        return await self.remove_queued(mac, task_id, now=now) is not None

    # --- claim ------------------------------------------------------------------------------------
    def _rank_call(self, exclude: str | None, now: float, k: Keys | None = None) -> tuple[str, list[str], list[Any]]:
        s = self.settings
        k = k or self.keys
        return (
            "rankDevices",
            [k.backoff],
            [
                now,
                int(s.aging_max_wait_s * 1000),
                int(s.starvation_hint_s * 1000),
                exclude or "",
                self._classes_arg,
                self._caller_weights_arg,
                k.base,
            ],
        )

    @staticmethod
    def _rank(reply: list[Any]) -> Rank:
        # (the chosen device's wait, weight and runner-up are what claimDevices works its carry out of)
        mac, _group, starving, next_backoff, longest, _wait, _weight, _runner = reply
        next_backoff, longest = float(next_backoff), float(longest)
        return Rank(
            mac or None, bool(starving), None if next_backoff < 0 else next_backoff, None if longest < 0 else longest
        )

    async def rank(self, *, exclude: str | None = None, now: float | None = None) -> Rank:
        """The device with the best aging score that is schedulable (not served, not in backoff)."""
        now = now or now_ms()
        if self.shards == 1:
            return self._rank(await self._call(*self._rank_call(exclude, now)))
        replies = await self._call_pipelined([self._rank_call(exclude, now, k) for k in self.shard_keys])
        return self._merge_ranks(replies)

    def _merge_ranks(self, replies: list[list[Any]]) -> Rank:
        """The best of several shards' choices (by min(wait, max_wait) x weight, as within a shard), the earliest
        backoff deadline, the longest wait, and whether any shard starves."""
        max_wait = self.settings.aging_max_wait_s * 1000
        best: tuple[float, str] | None = None
        backoffs, longest, starving = [], [], False
        for reply in replies:
            rank = self._rank(reply)
            starving = starving or rank.starving
            if rank.next_backoff_ms is not None:
                backoffs.append(rank.next_backoff_ms)
            if rank.longest_wait_ms is not None:
                longest.append(rank.longest_wait_ms)
            if rank.mac is not None:
                score = min(float(reply[5]), max_wait) * float(reply[6] or 1)
                if best is None or score > best[0]:
                    best = (score, rank.mac)
        return Rank(
            None if best is None else best[1],
            starving,
            min(backoffs) if backoffs else None,
            max(longest) if longest else None,
        )

    def _pop_call(
        self,
        mac: str,
        token: str,
        count: int,
        allowed_types: list[int] | None,
        release: bool,
        now: float,
        carry_ms: float = 0.0,
    ) -> tuple[str, list[str], list[Any]]:
        block, lock = self._device(mac)
        k, s = self.keys_of(mac), self.settings
        return (
            "popBatch",
            [*block, lock, k.pending, k.serving, k.leases, k.lease_data, k.overloaded, k.devices, k.caller_open],
            [
                now,
                token,
                int(s.lock_ttl_s * 1000),
                count,
                int(s.aging_max_wait_s * 1000),
                int(s.lease_ttl_s * 1000),
                mac,
                s.max_per_device_pending,
                # "-" allows no type at all ("" would allow any)
                "" if allowed_types is None else (",".join(map(str, allowed_types)) or "-"),
                int(release),
                round(carry_ms, 1),
                DEFAULT_MS_PER_TASK,
            ],
        )

    @staticmethod
    def _popped(reply: list[Any]) -> Popped:
        if reply[0] in (ScriptCode.LOCK_HELD, ScriptCode.DEVICE_NOT_READY):
            return Popped(ready=False)
        taken_count, blocked, rest = reply[1], reply[2], reply[3:]
        return Popped(
            True,
            [Entry.decode(r) for r in rest[:taken_count]],
            [Entry.decode(r) for r in rest[taken_count:]],
            int(blocked),
        )

    async def pop(
        self,
        mac: str,
        token: str,
        count: int,
        *,
        allowed_types: list[int] | None = None,
        release: bool = False,
        now: float | None = None,
    ) -> Popped:
        """Locks the device with `token`, marks it served and leases up to `count` of its tasks (only of
        `allowed_types`, when given). With `release` the device is unlocked and rescheduled at once."""
        return self._popped(
            await self._call(*self._pop_call(mac, token, count, allowed_types, release, now or now_ms()))
        )

    async def claim(
        self,
        token: str,
        want: int,
        budget: Mapping[int, int] | None,
        *,
        max_devices: int,
        per_device: int | None = None,
        carry_max_ms: float = 0.0,
        ms_per_task: float = DEFAULT_MS_PER_TASK,
        now: float | None = None,
    ) -> Claim:
        """Claims the next devices of the fair order and takes up to `want` tasks of theirs in one round trip
        (claimDevices): at most `per_device` from each (batch_size; min_batch_size while another device waited
        past the hint), at most `budget[type]` of each type (None: any), from at most `max_devices` devices.
        Each device is released and rescheduled as it is served; a device whose task could not be taken
        because its type's budget was spent keeps that task at its head (`Popped.blocked`). `ms_per_task`: about
        how long the workers take per task — the call's clock runs on by that much per task taken, as it would
        between separate claims, and each caller is charged that much per task (over its weight)."""
        r = ClaimRound(token, want, budget, max_devices, per_device, carry_max_ms, ms_per_task, now or now_ms())
        if self.shards > 1:
            return await self._claim_shards(r)
        reply = await self._call(*self._claim_call(self.keys, r))
        devices = self._claimed(reply)
        return Claim(devices, self._rank(reply[-8:]))

    def _claim_call(
        self, k: Keys, r: ClaimRound, group_caps: Mapping[str, int] | None = None
    ) -> tuple[str, list[str], list[Any]]:
        s = self.settings
        budget_arg = "" if r.budget is None else (",".join(f"{t}:{n}" for t, n in r.budget.items()) or "-")
        return (
            "claimDevices",
            [k.backoff, k.pending, k.serving, k.leases, k.lease_data, k.overloaded, k.devices, k.caller_open],
            [
                r.now,
                r.token,
                int(s.lock_ttl_s * 1000),
                r.want,
                r.per_device or s.batch_size,
                s.min_batch_size,
                int(s.aging_max_wait_s * 1000),
                int(s.starvation_hint_s * 1000),
                int(s.lease_ttl_s * 1000),
                s.max_per_device_pending,
                budget_arg,
                round(r.carry_max_ms, 1),
                r.max_devices,
                self._classes_arg,
                self._caller_weights_arg,
                k.base,
                round(r.ms_per_task, 3),
                *(x for group, cap in (group_caps or {}).items() for x in (group, cap)),
            ],
        )

    async def _claim_shards(self, r: ClaimRound) -> Claim:
        """A claim round over several shards: what each shard has ready (shardDemand, one round trip), the round's
        tasks split across the shards in proportion to it (`shard_shares`), then one claimDevices per shard that
        gets a part, in one more round trip. Within a shard the fair order is exact; across shards it is as
        good as the split (docs/design.md, "Shards")."""
        demand_calls = [
            ("shardDemand", [k.backoff], [self._classes_arg, self._caller_weights_arg, k.base]) for k in self.shard_keys
        ]
        demands = await self._call_pipelined(demand_calls)
        backoffs = [float(d[0]) for d in demands if float(d[0]) >= 0]
        per_group = [{str(d[i]): (int(d[i + 1]), int(d[i + 2])) for i in range(1, len(d), 4)} for d in demands]
        counts = [{str(d[i]): int(d[i + 3]) for i in range(1, len(d), 4)} for d in demands]
        shares, caps = self.shard_shares(per_group, r.want, counts, r.per_device or self.settings.batch_size)
        calls, shards = [], []
        left = dict(r.budget) if r.budget is not None else None
        for shard in sorted(range(self.shards), key=lambda i: -shares[i]):
            n = shares[shard]
            if n <= 0:
                continue
            part: dict[int, int] | None = None
            if left is not None:
                part = {t: min(c, n) for t, c in left.items()}
                for t in part:
                    left[t] -= part[t]
                if sum(part.values()) <= 0:
                    continue
            part_round = replace(r, token=f"{r.token}:{shard}", want=n, budget=part, max_devices=min(r.max_devices, n))
            calls.append(self._claim_call(self.shard_keys[shard], part_round, caps[shard]))
            shards.append(shard)
        if not calls:
            return Claim([], Rank(None, False, min(backoffs) if backoffs else None, None))
        replies = await self._call_pipelined(calls)
        devices = [d for reply in replies for d in self._claimed(reply)]
        nxt = self._merge_ranks([reply[-8:] for reply in replies])
        if backoffs and (nxt.next_backoff_ms is None or min(backoffs) < nxt.next_backoff_ms):
            nxt = Rank(nxt.mac, nxt.starving, min(backoffs), nxt.longest_wait_ms)
        return Claim(devices, nxt)

    def shard_shares(
        self,
        per_group: list[dict[str, tuple[int, int]]],
        want: int,
        counts: list[dict[str, int]] | None = None,
        per_device: int | None = None,
    ) -> tuple[list[int], list[dict[str, int]]]:
        """How many of a round's `want` tasks each shard gets, and each caller group in it, from what each shard has
        ready (per shard: caller group -> (caller weight, weighted ready devices)). Each caller group's part of the
        round is its caller weight over the ready groups' (what the caller level of the fair order gives it within
        one shard), split over the shards it has ready devices in by their weighted count (what the device level
        gives it); a shard gets the sum of its groups' parts, each group capped at its own in that shard's claim
        (claimDevices' groupCaps), so that a caller with one device and a caller with a thousand over every shard
        get half each. A round is no larger than every part can be taken in one call (`counts`: the ready devices
        of each group in each shard, each giving at most `per_device`): the credits left go to the next round at
        once, in the same proportions. Fractions carry to the next round (largest remainder over every (shard,
        group)), so that a part of a task is never lost to rounding."""
        totals: dict[str, float] = defaultdict(float)
        weights: dict[str, int] = {}
        for groups in per_group:
            for g, (cweight, devices) in groups.items():
                totals[g] += devices
                weights[g] = cweight
        all_weight = sum(weights.values())
        caps: list[dict[str, int]] = [{} for _ in range(self.shards)]
        if want <= 0 or all_weight <= 0:
            self._claim_credit = {}
            return [0] * self.shards, caps
        fractions = {
            (s, g): weights[g] / all_weight * devices / totals[g]
            for s, groups in enumerate(per_group)
            for g, (_, devices) in groups.items()
            if totals[g] > 0
        }
        if counts is not None and per_device:
            for (s, g), fraction in fractions.items():
                feasible = min(counts[s].get(g, 0), 1) * per_device
                if fraction > 0 and feasible > 0:
                    want = max(1, min(want, int(feasible / fraction)))
        exact = {pair: self._claim_credit.get(pair, 0.0) + want * fraction for pair, fraction in fractions.items()}
        given = {pair: max(0, int(x)) for pair, x in exact.items()}
        rest = want - sum(given.values())
        for pair in sorted(exact, key=lambda pair: given[pair] - exact[pair]):
            if rest <= 0:
                break
            given[pair] += 1
            rest -= 1
        # what a (shard, group) was owed beyond what it got carries over, within one task either way
        self._claim_credit = {pair: max(-1.0, min(1.0, exact[pair] - n)) for pair, n in given.items()}
        for (s, g), n in given.items():
            caps[s][g] = n
        return [sum(c.values()) for c in caps], caps

    def _claimed(self, reply: list[Any]) -> list[tuple[str, Popped]]:
        """The devices one claimDevices reply claimed, in its order."""
        devices: list[tuple[str, Popped]] = []
        at = 2
        for _ in range(int(reply[1])):
            mac, code, taken, expired, blocked = reply[at : at + 5]
            mac = mac.decode() if isinstance(mac, bytes) else mac
            at += 5
            entries = [Entry.decode(r) for r in reply[at : at + taken + expired]]
            at += taken + expired
            ok = code == ScriptCode.OK
            devices.append((mac, Popped(ok, entries[:taken], entries[taken:], int(blocked))))
        return devices

    async def release(self, mac: str, token: str, *, now: float | None = None) -> None:
        """Unlocks a device after a dispatch; it is scheduled again if it has work (wait restarts)."""
        block, lock = self._device(mac)
        k = self.keys_of(mac)
        code = await self._call("releaseDevice", [*block, lock, k.serving, k.devices], [now or now_ms(), token, mac])
        if code == ScriptCode.LOCK_NOT_OWNED:
            raise LockNotOwned(f"lock of {mac} is not held by {token}")

    async def extend_lock(self, mac: str, token: str) -> bool:
        """Renews a held device lock; False when the token no longer holds it."""
        _, lock = self._device(mac)
        async with self.redis.pipeline(transaction=True) as pipe:
            await pipe.watch(lock)
            if await pipe.get(lock) != token:
                await pipe.unwatch()  # type: ignore[no-untyped-call]  # (redis-py leaves it unannotated)
                return False
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.pexpire(lock, int(self.settings.lock_ttl_s * 1000))
            await pipe.execute()
        return True

    # --- the ways back ----------------------------------------------------------------------------
    async def defer(
        self, mac: str, token: str, task_ids: list[str], reason: str, *, now: float | None = None
    ) -> Deferred:
        """Puts `task_ids` back and backs the device off exponentially."""
        block, lock = self._device(mac)
        k, s = self.keys_of(mac), self.settings
        reply = await self._call(
            "deferDevice",
            [
                *block,
                lock,
                k.serving,
                k.backoff,
                k.pending,
                k.leases,
                k.lease_data,
                k.dead_letters,
                k.devices,
                k.caller_open,
            ],
            [
                now or now_ms(),
                token,
                mac,
                int(s.defer_backoff_base_s * 1000),
                int(s.defer_backoff_max_s * 1000),
                s.max_attempts,
                reason,
                s.dead_letter_keep,
                *task_ids,
            ],
        )
        if reply[0] == ScriptCode.LOCK_NOT_OWNED:
            raise LockNotOwned(f"lock of {mac} is not held by {token}")
        return Deferred(int(reply[0]), [json.loads(r) for r in reply[1:]])

    async def defer_types(
        self, mac: str, token: str, task_ids: list[str], task_types: list[int], reason: str, *, now: float | None = None
    ) -> TypesDeferred:
        """Sends the leased `task_ids` and every queued task of `task_types` of this device to wait in the
        delayed set (each base x 2^(defers-1), capped; dead-lettered at max_attempts defers), then releases
        the device and schedules it for its other work: one type that cannot be served does not hold back
        the device's others."""
        block, lock = self._device(mac)
        k, s = self.keys_of(mac), self.settings
        reply = await self._call(
            "deferTypes",
            [
                *block,
                lock,
                k.serving,
                k.pending,
                k.leases,
                k.lease_data,
                k.dead_letters,
                k.devices,
                k.delayed,
                k.overloaded,
                k.caller_open,
            ],
            [
                now or now_ms(),
                token,
                mac,
                int(s.defer_backoff_base_s * 1000),
                int(s.defer_backoff_max_s * 1000),
                s.max_attempts,
                reason,
                s.dead_letter_keep,
                ",".join(str(t) for t in sorted(set(task_types))),
                s.max_per_device_pending,
                *task_ids,
            ],
        )
        if reply[0] == ScriptCode.LOCK_NOT_OWNED:
            raise LockNotOwned(f"lock of {mac} is not held by {token}")
        dead_count = int(reply[1])
        return TypesDeferred(
            int(reply[0]), [str(i) for i in reply[2 + dead_count :]], [json.loads(r) for r in reply[2 : 2 + dead_count]]
        )

    async def resume_due(
        self, *, now: float | None = None, limit: int = 500, shards: list[int] | None = None
    ) -> list[str]:
        """Schedules again every device whose backoff has ended (of the given shards; None: all); returns them."""
        now = now or now_ms()
        resumed = []
        for k in self._shards(shards):
            due = await self.redis.zrangebyscore(k.backoff, "-inf", now, start=0, num=limit)
            for mac in due:
                block, _ = self._device(mac)
                if await self._call("resumeDevice", [*block, k.backoff, k.devices], [now, mac]):
                    resumed.append(mac)
        return resumed

    async def ack(
        self,
        leases: list[tuple[str, int]],
        *,
        device_of: Mapping[str, str] | None = None,
        charges: Mapping[str, float] | None = None,
    ) -> list[bool]:
        """Finishes leased tasks; an ack whose attempt is not the lease's current one is refused. One script call for
        all (ackMany), so that a device left with nothing queued or outstanding forgets its meta.
        `device_of` (task id -> device) spares reading the lease data for the devices. `charges` (device ->
        ms): fair by cost, what one of its acked tasks cost the worker pool in wall-clock time, kept in the
        device's meta for its next serves (scheduler_svc/cost.py, lua/includes/chargeDevice)."""
        if not leases:
            return []
        known = dict(device_of or {})
        unknown = [task_id for task_id, _ in leases if task_id not in known]
        if unknown:
            # a task whose device is not known: its lease data, looked up in every shard (one HMGET each)
            for values in await self._each_shard(lambda pipe, k: pipe.hmget(k.lease_data, unknown)):
                for task_id, value in zip(unknown, values, strict=True):
                    if value is not None:
                        known[task_id] = value.partition("|")[0]
        by_device: dict[str, list[int]] = defaultdict(list)
        for i, (task_id, _) in enumerate(leases):
            if task_id in known:
                by_device[known[task_id]].append(i)
        acked = [False] * len(leases)
        if not by_device:
            return acked
        # one ackMany per shard, in one round trip
        by_shard: dict[int, list[str]] = {0: list(by_device)} if self.shards == 1 else self._by_shard(list(by_device))
        calls, order = [], []
        for shard, macs in by_shard.items():
            k = self.shard_keys[shard]
            args: list[Any] = [k.base]
            for mac in macs:
                indexes = by_device[mac]
                args += [mac, round((charges or {}).get(mac, 0.0), 3), len(indexes)]
                args += [x for i in indexes for x in leases[i]]
                order += indexes
            calls.append(("ackMany", [k.leases, k.lease_data, k.caller_open], args))
        replies = [await self._call(*calls[0])] if len(calls) == 1 else await self._call_pipelined(calls)
        for i, r in zip(order, (r for reply in replies for r in reply), strict=True):
            acked[i] = bool(r)
        return acked

    async def requeue(
        self,
        mac: str,
        leases: list[tuple[str, int | None]],
        *,
        count_attempt: bool,
        reason: str,
        retry_at_ms: float | None = None,
        max_attempts: int | None = None,
        now: float | None = None,
    ) -> Requeued:
        """Puts one device's leased tasks back at the front of its queues (None attempt: any), at once
        or, with `retry_at_ms` in the future, once that time comes (promote_due)."""
        block, _ = self._device(mac)
        k, s = self.keys_of(mac), self.settings
        args: list[Any] = [
            now or now_ms(),
            mac,
            int(count_attempt),
            s.max_attempts if max_attempts is None else max_attempts,
            reason,
            s.dead_letter_keep,
            retry_at_ms or 0,
        ]
        for task_id, attempt in leases:
            args += [task_id, "*" if attempt is None else attempt]
        reply = await self._call(
            "requeueTasks",
            [*block, k.pending, k.leases, k.lease_data, k.dead_letters, k.devices, k.delayed, k.caller_open],
            args,
        )
        dead = int(reply[1])
        return Requeued(
            int(reply[0]), [json.loads(r) for r in reply[2 : 2 + dead]], [str(i) for i in reply[2 + dead :]]
        )

    async def promote_due(self, *, now: float | None = None, limit: int = 1000, shards: list[int] | None = None) -> int:
        """Puts delayed tasks whose retry time has come back at the front of their queues (of the given shards;
        None: all)."""
        now = now or now_ms()
        back = 0
        for k in self._shards(shards):
            due = await self.redis.zrangebyscore(k.delayed, "-inf", now, start=0, num=limit)
            by_device: dict[str, list[str]] = defaultdict(list)
            for member in due:
                by_device[member.partition("|")[0]].append(member)
            for mac, members in by_device.items():
                back += await self._call(
                    "promoteDelayed", [*self._device(mac)[0], k.pending, k.delayed, k.devices], [now, mac, *members]
                )
        return back

    async def leases_due(
        self, *, now: float | None = None, limit: int = 1000, shards: list[int] | None = None
    ) -> dict[str, list[tuple[str, int]]]:
        """Leases that ran out (in the given shards; None: all), grouped by device: {mac: [(task_id, attempt)]}."""
        by_device: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for k in self._shards(shards):
            ids = await self.redis.zrangebyscore(k.leases, "-inf", now or now_ms(), start=0, num=limit)
            if not ids:
                continue
            values = await _reply(self.redis.hmget(k.lease_data, ids))
            for task_id, value in zip(ids, values, strict=True):
                if value is None:
                    await self.redis.zrem(k.leases, task_id)
                    continue
                mac, _, raw = value.partition("|")
                by_device[mac].append((task_id, Entry.decode(raw).attempt))
        return dict(by_device)

    async def lease_facts(self, task_ids: list[str]) -> dict[str, LeaseFact]:
        """The leases Redis holds for these tasks (device, entry, deadline), in one round trip (two with several
        shards: the lease data of every shard, then the deadlines where it was found); a task without lease data
        is left out."""
        if not task_ids:
            return {}
        if self.shards == 1:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.lease_data, task_ids)
                for task_id in task_ids:
                    pipe.zscore(self.keys.leases, task_id)
                values, *deadlines = await pipe.execute()
            found = [(t, v, d, self.keys) for t, v, d in zip(task_ids, values, deadlines, strict=True)]
        else:
            where: dict[str, tuple[str, Keys]] = {}
            for k, values in zip(
                self.shard_keys, await self._each_shard(lambda pipe, k: pipe.hmget(k.lease_data, task_ids)), strict=True
            ):
                for task_id, value in zip(task_ids, values, strict=True):
                    if value is not None:
                        where[task_id] = (value, k)
            async with self.redis.pipeline(transaction=False) as pipe:
                for task_id, (_, k) in where.items():
                    pipe.zscore(k.leases, task_id)
                deadlines = await pipe.execute() if where else []
            found = [(t, v, d, k) for (t, (v, k)), d in zip(where.items(), deadlines, strict=True)]
        out: dict[str, LeaseFact] = {}
        for task_id, value, deadline, _ in found:
            if value is None:
                continue
            mac, _, raw = value.partition("|")
            out[task_id] = LeaseFact(mac, Entry.decode(raw), float(deadline) if deadline is not None else 0.0)
        return out

    async def renew_leases(self, task_ids: list[str], *, now: float | None = None) -> None:
        """Pushes the deadline of leases that are still held by a live worker (only existing ones: with several
        shards, the same ZADD XX to each shard, in one round trip, adds nothing where a task has no lease)."""
        if not task_ids:
            return
        deadline = (now or now_ms()) + int(self.settings.lease_ttl_s * 1000)
        if self.shards == 1:
            await self.redis.zadd(self.keys.leases, dict.fromkeys(task_ids, deadline), xx=True)
            return
        await self._each_shard(lambda pipe, k: pipe.zadd(k.leases, dict.fromkeys(task_ids, deadline), xx=True))

    # --- drain rate -------------------------------------------------------------------------------
    async def publish_drain(self, replica: str, tasks_per_s: float, *, now: float | None = None) -> None:
        """Records how fast this scheduler replica takes tasks from the queues (the entries expire together,
        DRAIN_KEEP_MS after the last write; readers tell fresh ones from stale ones)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.drain, replica, f"{max(0.0, tasks_per_s):.3f}|{int(now or now_ms())}")
            pipe.pexpire(self.keys.drain, DRAIN_KEEP_MS)
            await pipe.execute()

    async def drain_rate(self, *, fresh_ms: float, now: float | None = None) -> Drain:
        """How fast the queues drain: the sum of the rates the scheduler replicas published within `fresh_ms`
        (None when none is that fresh: nothing is dispatched now), and when the newest one was published."""
        now = now or now_ms()
        rates: list[float] = []
        newest: int | None = None
        for value in (await _reply(self.redis.hgetall(self.keys.drain))).values():
            rate, _, at = value.partition("|")
            if not at.isdigit():
                continue
            newest = max(newest or 0, int(at))
            if now - int(at) <= fresh_ms:
                rates.append(float(rate))
        return Drain(sum(rates) if rates else None, newest)

    async def active_devices(self) -> int:
        """How many devices have work in the queues or out (the active devices sets of every shard)."""
        return sum(int(n) for n in await self._each_shard(lambda pipe, k: pipe.scard(k.devices)))

    # --- generation ---------------------------------------------------------------------------------
    async def generation(self) -> str | None:
        """The id of the current rebuild of Redis from PostgreSQL; None when Redis lost its memory (with several
        shards: the shards' ids joined by "|", None when any shard lost its memory)."""
        if self.shards == 1:
            generation: str | None = await _reply(self.redis.get(self.keys.generation))
            return generation
        values = await self._each_shard(lambda pipe, k: pipe.get(k.generation))
        return None if any(v is None for v in values) else "|".join(values)

    async def lost_shards(self) -> list[int]:
        """The shards without a generation: they lost their memory (a Redis master restarted empty) and must be
        rebuilt from PostgreSQL."""
        values = await self._each_shard(lambda pipe, k: pipe.exists(k.generation))
        return [i for i, v in enumerate(values) if not v]

    async def mark_rebuilt(self, generation: str, *, shards: list[int] | None = None) -> None:
        """Redis holds every unfinished task again (of the given shards; None: all): intake may enqueue. With several
        shards each also records how many there are (`Keys.shard_count`)."""

        def mark(pipe: Any, k: Keys) -> None:
            pipe.set(k.generation, generation)
            if self.shards > 1:
                pipe.set(k.shard_count, self.shards)

        await self._each_shard(mark, shards)

    async def shard_counts(self, shards: list[int]) -> dict[int, int | None]:
        """How many shards each of the given shards recorded at its last rebuild (None: it recorded none)."""
        values = await self._each_shard(lambda pipe, k: pipe.get(k.shard_count), shards)
        return {s: None if v is None else int(v) for s, v in zip(shards, values, strict=True)}

    # --- reading ----------------------------------------------------------------------------------
    async def pending(self) -> int:
        """Tasks waiting in every device queue (the shards' pending counters, summed)."""
        if self.shards == 1:
            return int(await self.redis.get(self.keys.pending) or 0)
        return sum(int(v or 0) for v in await self._each_shard(lambda pipe, k: pipe.get(k.pending)))

    async def device_views(self, *, sample: int, also: Sequence[str] = ()) -> list[DeviceView]:
        """Operators' view of some active devices: up to `sample` of each shard's (Redis picks them at random) and
        the devices named in `also`, each with its queue lengths by priority, the enqueue time of its oldest queued
        task and the start of its wait. Three pipelines: 1 command a shard, 13 a device, 1 a ready device (for the
        console, not the dispatch path)."""
        macs: dict[str, None] = dict.fromkeys(also)
        if sample > 0:
            async with self.redis.pipeline(transaction=False) as pipe:
                for k in self.shard_keys:
                    pipe.srandmember(k.devices, sample)
                for found in await pipe.execute():
                    macs.update(dict.fromkeys(str(m) for m in found or ()))
        if not macs:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for mac in macs:
                k = self.keys_of(mac)
                for p in PRIORITIES:
                    pipe.llen(k.queue(mac, p))
                    pipe.lindex(k.queue(mac, p), 0)
                pipe.sismember(k.overloaded, mac)
                pipe.zscore(k.backoff, mac)
                pipe.hget(k.meta(mac), "group")
            replies = await pipe.execute()
        width = 2 * len(PRIORITIES) + 3
        rows = [replies[i * width : (i + 1) * width] for i in range(len(macs))]
        # the start of each ready device's wait: its score in its caller group's ready set
        grouped = [(mac, row[-1]) for mac, row in zip(macs, rows, strict=True) if row[-1]]
        since: dict[str, float] = {}
        if grouped:
            async with self.redis.pipeline(transaction=False) as pipe:
                for mac, group in grouped:
                    pipe.zscore(self.keys_of(mac).group_ready(group), mac)
                for (mac, _), score in zip(grouped, await pipe.execute(), strict=True):
                    if score is not None:
                        since[mac] = float(score)
        views: list[DeviceView] = []
        for mac, row in zip(macs, rows, strict=True):
            lengths = tuple(int(row[2 * j] or 0) for j in range(len(PRIORITIES)))
            heads = [Entry.decode(row[2 * j + 1]).enqueued_ms for j in range(len(PRIORITIES)) if row[2 * j + 1]]
            backoff = row[-2]
            views.append(
                DeviceView(
                    mac=mac,
                    queued=lengths,
                    oldest_enqueued_ms=min(heads) if heads else None,
                    overloaded=bool(row[-3]),
                    backoff_until_ms=None if backoff is None else float(backoff),
                    ready_since_ms=since.get(mac),
                )
            )
        return views

    async def longest_waiting(self, limit: int, *, groups: int = 100) -> list[str]:
        """The ready devices that have waited longest, longest first, at most `limit`: the first `limit` of the ready
        set of each caller group (of the first `groups` groups of each shard and caller weight), merged. A ready
        device's wait is what the fair order reads (since the later of its oldest task's enqueue and its last
        serve); devices being served or in backoff are not ready. For operators (the console)."""
        if limit <= 0:
            return []
        weights = self.callers.all_weights
        async with self.redis.pipeline(transaction=False) as pipe:
            for k in self.shard_keys:
                for w in weights:
                    pipe.zrange(k.callers(w), 0, groups - 1)
            replies = await pipe.execute()
        found = [
            (k, str(group))
            for i, k in enumerate(self.shard_keys)
            for reply in replies[i * len(weights) : (i + 1) * len(weights)]
            for group in reply or ()
        ]
        if not found:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for k, group in found:
                pipe.zrange(k.group_ready(group), 0, limit - 1, withscores=True)
            heads = await pipe.execute()
        ready = sorted((float(score), str(mac)) for reply in heads for mac, score in reply or ())
        out: list[str] = []
        for _score, mac in ready:
            if mac not in out:
                out.append(mac)
            if len(out) == limit:
                break
        return out

    async def device_meta(self, mac: str) -> dict[str, str]:
        meta: dict[str, str] = await _reply(self.redis.hgetall(self.keys_of(mac).meta(mac)))
        return meta

    async def queued(self, mac: str) -> list[Entry]:
        """Every queued entry of a device, highest priority first (for tests and operators)."""
        k = self.keys_of(mac)
        async with self.redis.pipeline(transaction=False) as pipe:
            for p in reversed(PRIORITIES):
                pipe.lrange(k.queue(mac, p), 0, -1)
            lists = await pipe.execute()
        return [Entry.decode(raw) for items in lists for raw in items]

    # --- reconciliation with PostgreSQL (scheduler_svc/reconcile.py) -----------------------------------
    def _script(self, name: str) -> str:
        """Registers one of the reconciler's scripts on first use; returns its name (for _call / _call_pipelined)."""
        if name not in self._scripts:
            self._scripts[name] = self.redis.register_script(lua.load(name))
        return name

    def _reconcile_keys(self, mac: str) -> list[str]:
        """KEYS[1..18] of locateTasks and repairDevice."""
        block, lock = self._device(mac)
        k = self.keys_of(mac)
        return [*block, lock, k.serving, k.backoff, k.leases, k.lease_data, k.delayed, k.devices]

    async def locate(self, groups: dict[str, list[str]], *, exact: bool) -> dict[str, Located]:
        """Where each device's given tasks are (one locateTasks call per device, one round trip): the ids in no
        queue and no lease (with `exact`, nor in the delayed set: the whole truth at one instant per device),
        leases without a deadline, ids found twice, and what is wrong with the device's own keys."""
        if not groups:
            return {}
        name = self._script("locateTasks")
        replies = await self._call_pipelined(
            [(name, self._reconcile_keys(mac), [mac, int(exact), *ids]) for mac, ids in groups.items()]
        )
        out: dict[str, Located] = {}
        for mac, reply in zip(groups, replies, strict=True):
            queued, backlog, problem, m, u, d = reply[:6]
            ids = [str(i) for i in reply[6:]]
            out[mac] = Located(int(queued), int(backlog), str(problem), ids[:m], ids[m : m + u], ids[m + u : m + u + d])
        return out

    async def repair_devices(
        self, macs: list[str], *, groups: Mapping[str, str] | None = None, now: float | None = None
    ) -> dict[str, tuple[str, int, int]]:
        """Mends the devices whose own keys disagree (repairDevice, checked again atomically): {mac: (problem,
        queued, backlog before)} for those that had one. `groups`: the caller group whose schedule set a device
        was found in (misscheduled_devices), for a device whose meta was lost."""
        if not macs:
            return {}
        name, now = self._script("repairDevice"), now or now_ms()
        groups = groups or {}
        replies = await self._call_pipelined(
            [
                (name, self._reconcile_keys(mac), [now, mac, self.settings.weight_of(mac), groups.get(mac, "")])
                for mac in macs
            ]
        )
        return {mac: (str(r[0]), int(r[1]), int(r[2])) for mac, r in zip(macs, replies, strict=True) if r[0]}

    async def recount_pending(self, *, tries: int = 3, shards: list[int] | None = None) -> tuple[int, int] | None:
        """Sets each shard's pending counter (of the given shards; None: all) to the entries in its active devices'
        queues: (before, after), summed, or None when a shard's active devices kept changing under it."""
        name = self._script("recountPending")
        before, after = 0, 0
        for k in self._shards(shards):
            for _ in range(tries):
                devices = sorted(await _reply(self.redis.smembers(k.devices)))
                keys = [k.pending, k.devices, *(k.queue(mac, p) for mac in devices for p in PRIORITIES)]
                reply = await self._call(name, keys, devices)
                if reply[0] == ScriptCode.OK:
                    before, after = before + int(reply[1]), after + int(reply[2])
                    break
            else:
                return None
        return before, after

    async def delayed_task_ids(self) -> set[str]:
        """Ids of every task in the delayed sets (members "mac|task_id|..."), read in SCAN steps (not atomic)."""
        return {
            member.split("|", 2)[1]
            for k in self.shard_keys
            async for member, _ in self.redis.zscan_iter(k.delayed, count=1000)
            if member.count("|") >= 2
        }

    async def misscheduled_devices(self) -> dict[str, str]:
        """Devices in a schedule set whose meta does not say they belong there (a deleted or evicted meta: the
        dispatcher would claim them in vain, again and again), with the caller group of the set they were found
        in (every shard's). Read in steps, not atomic: repair_devices checks."""
        members: list[tuple[str, int, str]] = []
        # the schedule sets of every group that had a ready device (never a SCAN of the keyspace, which holds
        # every device's keys)
        for k in self.shard_keys:
            groups = sorted({"-", *await _reply(self.redis.smembers(k.groups))})
            for group in groups:
                for priority, weight in self._classes:
                    key = k.schedule(priority, weight, group)
                    members += [(mac, priority, group) async for mac, _ in self.redis.zscan_iter(key, count=1000)]
        if not members:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for mac, _, _ in members:
                pipe.hmget(self.keys_of(mac).meta(mac), ["state", "class", "group"])
            metas = await pipe.execute()
        return {
            mac: group
            for (mac, priority, group), (state, cls, own) in sorted(zip(members, metas, strict=True))
            if state != "ready" or cls != str(priority) or (own or "-") != group
        }

    async def give_lease_deadlines(self, task_ids: list[str], *, now: float | None = None) -> int:
        """Leases without a deadline (lease data, no entry in the leases set) get one lease TTL from now: renewed
        while a live worker holds them, taken back otherwise. Returns how many were added."""
        if not task_ids:
            return 0
        deadline = (now or now_ms()) + int(self.settings.lease_ttl_s * 1000)
        if self.shards == 1:
            return int(await self.redis.zadd(self.keys.leases, dict.fromkeys(task_ids, deadline), nx=True))
        # the shard of each lease: where its lease data is
        found = await self._each_shard(lambda pipe, k: pipe.hmget(k.lease_data, task_ids))
        ids_of = [[t for t, v in zip(task_ids, values, strict=True) if v is not None] for values in found]
        async with self.redis.pipeline(transaction=False) as pipe:
            for k, ids in zip(self.shard_keys, ids_of, strict=True):
                if ids:
                    pipe.zadd(k.leases, dict.fromkeys(ids, deadline), nx=True)
            added = await pipe.execute() if any(ids_of) else []
        return sum(int(a) for a in added)

    async def dead_letter_records(self) -> dict[str, dict[str, Any]]:
        """The newest dead-letter record of each task in the dead-letter lists (task_id -> record)."""
        out: dict[str, dict[str, Any]] = {}
        lists = await self._each_shard(lambda pipe, k: pipe.lrange(k.dead_letters, 0, -1))
        for raw in (raw for records in lists for raw in records):
            try:
                record = json.loads(raw)
                task_id = str(record["task_id"])
            except (ValueError, KeyError, TypeError):
                continue
            if task_id not in out or record.get("dead_ms", 0) > out[task_id].get("dead_ms", 0):
                out[task_id] = record
        return out

    async def take_turn(self, key: str, token: str, ttl_ms: int) -> bool:
        """SET NX PX: True when `token` now holds `key` (a lock or a turn) for `ttl_ms`."""
        return bool(await self.redis.set(key, token, nx=True, px=max(1, int(ttl_ms))))

    async def keep_turn(self, key: str, token: str, ttl_ms: int) -> bool:
        """Sets the remaining time of `key` to `ttl_ms` while `token` holds it (0 or less: gives it up);
        False when it is not held by `token`."""
        async with self.redis.pipeline(transaction=True) as pipe:
            await pipe.watch(key)
            if await pipe.get(key) != token:
                await pipe.unwatch()  # type: ignore[no-untyped-call]  # (redis-py leaves it unannotated)
                return False
            pipe.multi()  # type: ignore[no-untyped-call]
            if ttl_ms > 0:
                pipe.pexpire(key, int(ttl_ms))
            else:
                pipe.delete(key)
            await pipe.execute()
        return True


@dataclass(frozen=True, slots=True)
class Located:
    """Where some open tasks of one device are in Redis (QueueStore.locate)."""

    #: entries in the device's queues, and its meta's backlog (they agree unless Redis lost something)
    queued: int
    backlog: int
    #: "" or what is wrong with the device's own keys (repairDevice mends it; see includes/deviceFacts.lua)
    problem: str
    #: ids in no queue and no lease (and, from an exact look, not in the delayed set)
    missing: list[str]
    #: ids whose lease has no deadline (it would never be taken back)
    unleased: list[str]
    #: ids found twice (two queue entries, or a queue entry and a lease)
    duplicated: list[str]

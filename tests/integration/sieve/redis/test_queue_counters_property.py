"""Property test of the device queues against the real Redis: random sequences of enqueue (some
already expired, each by one of several callers or none), pop+release, typed pop with release, rank+pop,
pop+defer, pop+defer of task types, ack (right and stale), requeue (counted or not, at once or delayed),
cancel (queued and leased), lease expiry, and time passing (resume, promotion of delayed tasks) over 3-5
devices.

After every step: the global pending counter == the sum of queue lengths == the sum of device
backlogs; each caller's open-task counter == its tasks in queues, leases and the delayed set == the model's
accepted and not finished ones (and an enqueue over the caller limit is refused as such);
every task is in exactly one place (queued once, leased, delayed, or finished one way);
each device's state matches the schedule, backoff and active sets; its `outstanding` == its leased and
delayed tasks, and a device idle with none keeps no meta at all; rank names only a ready device.
(Not checked: that an idle device has left the active set; a defer or resume that leaves a device
idle keeps it there, see lua/test_defer_device.py and lua/test_resume_device.py.)

Each hypothesis example runs in its own event loop on its own key prefix, deleted at the end (the
function-scoped fixtures are not reset between examples).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis as redis_sync
from hypothesis import HealthCheck, event, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from sieve.errors import AdmissionRefused, ScriptCode
from sieve.redis.entry import Entry
from sieve.redis.keys import PRIORITIES, Keys, group_name
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.support.counters import counters
from tests.support.redis import delete_prefix

T0 = 1_700_000_000_000
S = 1000
MACS = [f"AA:BB:CC:DD:EE:0{i}" for i in range(5)]
MAX_TOTAL, MAX_PER_DEVICE, MAX_ATTEMPTS = 9, 5, 2
#: open tasks one caller may have (queued, leased, delayed)
MAX_PER_CALLER = 6
TYPES = (1, 2)  # TEXT, OCR_IMAGE
#: "" is a task without a caller (not counted); "x|y" checks that a name may hold the separator
CALLERS = ("alice", "bob", "", "x|y")

Op = tuple[Any, ...]

dev = st.integers(0, 4)
OPS: st.SearchStrategy[Op] = st.one_of(
    st.tuples(
        st.just("enqueue"),
        dev,
        st.integers(1, 4),
        st.sampled_from(PRIORITIES),
        st.sampled_from([False, False, False, True]),
        st.sampled_from(TYPES),
        st.sampled_from(CALLERS),
    ),
    st.tuples(st.just("serve"), dev, st.integers(1, 4)),
    st.tuples(st.just("serve_typed"), dev, st.integers(1, 4), st.sampled_from([(1,), (2,), (1, 2)])),
    st.tuples(st.just("rank_serve"), st.integers(1, 4)),
    st.tuples(st.just("defer"), dev, st.integers(0, 4)),
    st.tuples(st.just("defer_types"), dev, st.integers(0, 4), st.sampled_from([(1,), (2,), (1, 2)])),
    st.tuples(st.just("ack"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("requeue"), st.integers(0, 50), st.integers(1, 3), st.booleans(), st.booleans()),
    st.tuples(st.just("cancel"), dev, st.integers(0, 50), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([0, 5, 30, 60, 120, 240, 600, 700])),
    st.tuples(st.just("expire_leases")),
)


@dataclass
class Model:
    """Where each task created in this example should be, besides the queues."""

    created: dict[str, str] = field(default_factory=dict)  # task id -> device
    callers: dict[str, str] = field(default_factory=dict)  # task id -> caller ("" for none)
    leased: dict[str, tuple[str, int]] = field(default_factory=dict)  # task id -> (device, attempt)
    delayed: dict[str, int] = field(default_factory=dict)  # task id -> retry time (ms)
    finished: dict[str, str] = field(default_factory=dict)  # task id -> acked|expired|cancelled|dead
    #: counted failures of each task (a counted requeue raises it; max_attempts of them dead-letter it)
    failures: dict[str, int] = field(default_factory=dict)
    serial: int = 0

    def new_id(self) -> str:
        self.serial += 1
        return f"t{self.serial}"

    def queued_ids(self, mac: str | None = None) -> set[str]:
        return {
            t
            for t, m in self.created.items()
            if t not in self.leased and t not in self.delayed and t not in self.finished and (mac is None or m == mac)
        }

    def open_by_caller(self) -> Counter[str]:
        """Accepted and not finished tasks (queued, leased or delayed) of each caller."""
        return Counter(c for t, c in self.callers.items() if c and t not in self.finished)

    def finish(self, task_id: str, how: str) -> None:
        assert task_id not in self.finished, f"{task_id} finished twice ({self.finished[task_id]}, {how})"
        self.leased.pop(task_id, None)
        self.finished[task_id] = how


@dataclass(frozen=True, slots=True)
class DeviceView:
    """What Redis holds of one device between steps."""

    meta: dict[str, str]
    lock: str | None
    backoff_until: float | None
    #: its queued entries, highest priority first
    entries: list[Entry]
    #: (priority, weight, caller group) -> score, for each schedule set the device is in
    members: dict[tuple[int, int, str], float]
    #: caller group -> score, for each group's ready set the device is in
    ready_in: dict[str, float]


@dataclass(frozen=True, slots=True)
class View:
    """Everything `check` reads besides the counters, in one round trip."""

    lease_data: dict[str, str]
    lease_ids: set[str]
    serving: int
    active: set[str]
    delayed: list[tuple[str, float]]
    devices: dict[str, DeviceView]


async def read_view(redis: Redis, store: QueueStore, macs: list[str]) -> View:
    k: Keys = store.keys
    groups = sorted({group_name(c) for c in CALLERS})
    classes = [(p, w, g) for p in PRIORITIES for w in store.settings.all_weights for g in groups]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(k.lease_data)
        pipe.zrange(k.leases, 0, -1)
        pipe.zcard(k.serving)
        pipe.smembers(k.devices)
        pipe.zrange(k.delayed, 0, -1, withscores=True)
        for mac in macs:
            pipe.hgetall(k.meta(mac))
            pipe.get(k.lock(mac))
            pipe.zscore(k.backoff, mac)
            for p in reversed(PRIORITIES):
                pipe.lrange(k.queue(mac, p), 0, -1)
            for p, w, g in classes:
                pipe.zscore(k.schedule(p, w, g), mac)
            for g in groups:
                pipe.zscore(k.group_ready(g), mac)
        values = await pipe.execute()
    lease_data, lease_list, serving, active, delayed = values[:5]
    per_device = 3 + len(PRIORITIES) + len(classes) + len(groups)
    devices: dict[str, DeviceView] = {}
    for i, mac in enumerate(macs):
        row = values[5 + i * per_device : 5 + (i + 1) * per_device]
        entries = [Entry.decode(raw) for items in row[3 : 3 + len(PRIORITIES)] for raw in items]
        at = 3 + len(PRIORITIES)
        members = {
            pw: score for pw, score in zip(classes, row[at : at + len(classes)], strict=True) if score is not None
        }
        ready_in = {g: score for g, score in zip(groups, row[at + len(classes) :], strict=True) if score is not None}
        devices[mac] = DeviceView(row[0], row[1], row[2], entries, members, ready_in)
    return View(lease_data, set(lease_list), serving, active, delayed, devices)


def check_leases_and_delays(view: View, model: Model) -> None:
    """Leases and delayed tasks are the model's; nothing is being served between steps."""
    assert set(view.lease_data) == view.lease_ids == set(model.leased)
    for task_id, value in view.lease_data.items():
        mac, _, raw = value.partition("|")
        assert (mac, Entry.decode(raw).attempt) == model.leased[task_id]
    assert {Entry.decode(m.partition("|")[2]).task_id: due for m, due in view.delayed} == model.delayed
    # nothing is being served between steps
    assert view.serving == 0


def check_schedule(store: QueueStore, mac: str, device: DeviceView, state: str | None) -> None:
    """A ready device sits in the schedule set of its best priority, scored by when its wait began; any other
    sits in none; a device backing off (and only one) is in the backoff set until its unschedulable_until."""
    meta, entries, members = device.meta, device.entries, device.members
    if state == "ready":
        assert entries, f"{mac} is ready with nothing queued"
        best = max(e.priority for e in entries)
        heads = [first[0] for p in PRIORITIES if (first := [e for e in entries if e.priority == p])]
        since = max(min(e.enqueued_ms for e in heads), int(meta.get("last_served_ms") or 0))
        # in the set of its priority and weight within its caller group, and in its group's ready set
        assert members == {(best, store.settings.weight_of(mac), meta["group"]): since}, (mac, meta, members)
        assert device.ready_in == {meta["group"]: since}, (mac, meta, device.ready_in)
        assert meta["class"] == str(best)
    else:
        assert not members, f"{mac} is {state} but scheduled in {members}"
        assert not device.ready_in, f"{mac} is {state} but ready in {device.ready_in}"
    if state == "backoff":
        assert device.backoff_until == int(meta["unschedulable_until_ms"])
    else:
        assert device.backoff_until is None, f"{mac} is {state} but in the backoff set"


def check_device(store: QueueStore, model: Model, mac: str, device: DeviceView, active: set[str]) -> list[str]:
    """One device's state against the schedule, backoff and active sets and the model; returns its queued ids."""
    meta, entries = device.meta, device.entries
    ids = [e.task_id for e in entries]
    assert set(ids) == model.queued_ids(mac), (mac, ids, model.queued_ids(mac))
    assert device.lock is None
    state = meta.get("state")
    if entries:
        assert mac in active, f"{mac} has work but is not active"
    check_schedule(store, mac, device, state)
    if state in (None, "idle"):
        assert not entries, f"{mac} is {state} with {len(entries)} queued"
        assert int(meta.get("backlog") or 0) == 0
    # leased or delayed tasks are the device's outstanding; with none and nothing queued its meta is gone
    outstanding = sum(1 for t, m in model.created.items() if m == mac and (t in model.leased or t in model.delayed))
    assert int(meta.get("outstanding") or 0) == outstanding, (mac, meta, outstanding)
    if state in (None, "idle") and not outstanding:
        assert meta == {}, f"{mac} has no work left but keeps {meta}"
    return ids


def check_one_place(queued: Counter[str], view: View, model: Model) -> None:
    """Every task is queued once, or leased, or delayed: never in two of them."""
    lease_ids = view.lease_ids
    assert all(n == 1 for n in queued.values()), f"queued twice: {[t for t, n in queued.items() if n > 1]}"
    assert not (set(queued) & lease_ids), f"queued and leased: {set(queued) & lease_ids}"
    assert not (set(queued) & set(model.delayed)) and not (lease_ids & set(model.delayed))


def check_callers(view: View, caller_open: dict[str, int]) -> None:
    """Each caller's counter is what Redis holds of its tasks (queued, leased, delayed)."""
    held: Counter[str] = Counter()
    for device in view.devices.values():
        held.update(e.caller for e in device.entries)
    held.update(Entry.decode(v.partition("|")[2]).caller for v in view.lease_data.values())
    held.update(Entry.decode(m.partition("|")[2]).caller for m, _ in view.delayed)
    del held[""]
    assert dict(held) == caller_open, (held, caller_open)


async def check(redis: Redis, store: QueueStore, model: Model, macs: list[str], now: int) -> None:
    k: Keys = store.keys
    # --- the counter invariant
    counted = await counters(redis, k)
    assert counted.consistent, (counted.pending, counted.queued, counted.backlog)
    caller_open = {c: int(n) for c, n in (await redis.hgetall(k.caller_open)).items()}
    assert caller_open == dict(model.open_by_caller()), (caller_open, model.open_by_caller())

    # --- read everything else in one round trip
    view = await read_view(redis, store, macs)
    # --- every task in exactly one place
    check_leases_and_delays(view, model)
    # --- each device's state matches the schedule, backoff and active sets
    queued: Counter[str] = Counter()
    for mac, device in view.devices.items():
        queued.update(check_device(store, model, mac, device, view.active))
    check_one_place(queued, view, model)
    # --- each caller's counter is what Redis holds of its tasks
    check_callers(view, caller_open)

    # the rank never names a device that cannot be popped
    rank = await store.rank(now=now)
    if rank.mac is not None:
        assert (await redis.hget(k.meta(rank.mac), "state")) == "ready"


async def run(redis_url: str, n_devices: int, ops: list[Op]) -> None:
    prefix = f"prop-{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env(
        {},
        redis_url=redis_url,
        redis_prefix=prefix,
        max_total_pending=MAX_TOTAL,
        max_per_device_pending=MAX_PER_DEVICE,
        max_attempts=MAX_ATTEMPTS,
        device_weights=f"{MACS[1]}=2",
    )
    redis = Redis.from_url(redis_url, decode_responses=True)
    store = QueueStore(redis, settings)
    await store.mark_rebuilt("property-test")
    macs = MACS[:n_devices]
    model = Model()
    now = T0
    try:
        for step, op in enumerate(ops):
            now = await apply(store, model, macs, op, now + S, f"tok-{step}")
            await check(redis, store, model, macs, now)
    finally:
        await delete_prefix(redis, prefix)
        await redis.aclose()


async def take(
    store: QueueStore,
    model: Model,
    mac: str,
    token: str,
    count: int,
    now: int,
    *,
    allowed: tuple[int, ...] | None = None,
    release: bool = False,
) -> list[Entry]:
    """Pops `count` from a device, recording leases and expiries; [] when it was not ready."""
    state = (await store.device_meta(mac)).get("state")
    popped = await store.pop(
        mac, token, count, now=now, release=release, allowed_types=None if allowed is None else list(allowed)
    )
    assert popped.ready == (state == "ready"), (mac, state, popped)
    if popped.expired:
        event("pop dropped expired tasks")
    for e in popped.expired:
        assert e.expires_ms <= now
        model.finish(e.task_id, "expired")
    for e in popped.taken:
        assert e.expires_ms > now
        assert e.task_id in model.queued_ids(mac)
        assert allowed is None or e.task_type in allowed
        model.leased[e.task_id] = (mac, e.attempt)
        assert e.failures == model.failures.get(e.task_id, 0), (e, model.failures.get(e.task_id))
    if popped.blocked:
        event("pop blocked by task type")
        assert allowed is not None and len(popped.taken) < count
    elif popped.ready:
        # it took as many as asked for, or all there were
        assert len(popped.taken) == min(count, len(popped.taken) + len(model.queued_ids(mac)))
    return popped.taken if popped.ready else []


@dataclass(frozen=True, slots=True)
class Step:
    """One operation's world: the store, the model, the devices, the time it runs at and its lock token."""

    store: QueueStore
    model: Model
    macs: list[str]
    now: int
    token: str

    def mac(self, d: int) -> str:
        return self.macs[d % len(self.macs)]


async def op_enqueue(step: Step, d: int, n: int, prio: int, expired: bool, task_type: int, caller: str) -> int:
    store, model, now = step.store, step.model, step.now
    mac = step.mac(d)
    at = now - 3601 * S if expired else now
    entries = [Entry(model.new_id(), task_type, prio, at, at + 3600 * S, caller=caller) for _ in range(n)]
    total, mine = len(model.queued_ids()), len(model.queued_ids(mac))
    opened = model.open_by_caller()[caller] if caller else 0
    over_caller = bool(caller) and opened + n > MAX_PER_CALLER
    try:
        await store.enqueue(mac, entries, now=now, caller_limit=MAX_PER_CALLER)
    except AdmissionRefused as refused:
        expected = (
            ScriptCode.GLOBAL_LIMIT
            if total + n > MAX_TOTAL
            else ScriptCode.CALLER_LIMIT
            if over_caller
            else ScriptCode.DEVICE_LIMIT
        )
        assert refused.code is expected
        assert total + n > MAX_TOTAL or over_caller or mine + n > MAX_PER_DEVICE
        if refused.code is ScriptCode.CALLER_LIMIT:
            assert refused.caller_open == opened
        event(f"enqueue refused: {refused.code.name}")
        return now
    assert total + n <= MAX_TOTAL and not over_caller and mine + n <= MAX_PER_DEVICE
    for e in entries:
        model.created[e.task_id] = mac
        model.callers[e.task_id] = caller
    return now


async def serve_device(step: Step, mac: str, count: int) -> int:
    """Pops `count` from a device and releases it (when it was ready)."""
    state = (await step.store.device_meta(mac)).get("state")
    await take(step.store, step.model, mac, step.token, count, step.now)
    if state == "ready":
        await step.store.release(mac, step.token, now=step.now)
    return step.now


async def op_serve(step: Step, d: int, count: int) -> int:
    return await serve_device(step, step.mac(d), count)


async def op_rank_serve(step: Step, count: int) -> int:
    rank = await step.store.rank(now=step.now)
    if rank.mac is None:
        return step.now
    return await serve_device(step, rank.mac, count)


async def op_serve_typed(step: Step, d: int, count: int, allowed: tuple[int, ...]) -> int:
    await take(step.store, step.model, step.mac(d), step.token, count, step.now, allowed=allowed, release=True)
    return step.now


async def op_defer(step: Step, d: int, k: int) -> int:
    store, model, now, mac = step.store, step.model, step.now, step.mac(d)
    state = (await store.device_meta(mac)).get("state")
    taken = await take(store, model, mac, step.token, max(k, 1), now)
    if state != "ready":
        return now
    put_back = taken[:k]  # defer 0 of them: the rest stay leased (handed out)
    deferred = await store.defer(mac, step.token, [e.task_id for e in put_back], "no worker", now=now)
    dead = {d["task_id"] for d in deferred.dead_letters}
    assert dead == {e.task_id for e in put_back if e.defers + 1 >= MAX_ATTEMPTS}
    if dead:
        event("defer dead-lettered")
    for e in put_back:
        if e.task_id in dead:
            model.finish(e.task_id, "dead")
        else:
            del model.leased[e.task_id]
    return now


async def op_defer_types(step: Step, d: int, k: int, types: tuple[int, ...]) -> int:
    store, model, now, mac = step.store, step.model, step.now, step.mac(d)
    state = (await store.device_meta(mac)).get("state")
    taken = await take(store, model, mac, step.token, max(k, 1), now)
    if state != "ready":
        return now
    put_back = taken[:k]  # the rest stay leased (handed out)
    # what waits: those taken here, and every queued task of those types that has not expired
    queued = [e for e in await store.queued(mac) if e.task_type in types and e.expires_ms > now]
    result = await store.defer_types(mac, step.token, [e.task_id for e in put_back], list(types), "no worker", now=now)
    moved = [*put_back, *queued]
    dead = {r["task_id"] for r in result.dead_letters}
    assert dead == {e.task_id for e in moved if e.defers + 1 >= MAX_ATTEMPTS}
    assert set(result.waiting) == {e.task_id for e in moved} - dead
    if dead:
        event("defer_types dead-lettered")
    for e in put_back:
        model.leased.pop(e.task_id)
    for e in moved:
        if e.task_id in dead:
            model.finish(e.task_id, "dead")
    for t in result.waiting:
        due = await store.redis.zscore(
            store.keys.delayed, next(m for m in await store.redis.zrange(store.keys.delayed, 0, -1) if f"|{t}|" in m)
        )
        model.delayed[t] = int(due)
    return now


async def op_ack(step: Step, i: int, stale: bool) -> int:
    model = step.model
    if not model.leased:
        return step.now
    task_id = sorted(model.leased)[i % len(model.leased)]
    attempt = model.leased[task_id][1]
    result = await step.store.ack([(task_id, attempt + 1 if stale else attempt)])
    assert result == [not stale]
    if not stale:
        model.finish(task_id, "acked")
    return step.now


async def op_requeue(step: Step, i: int, k: int, counted: bool, later: bool) -> int:
    model, now = step.model, step.now
    if not model.leased:
        return now
    first = sorted(model.leased)[i % len(model.leased)]
    mac = model.leased[first][0]
    mine = sorted(t for t, (m, _) in model.leased.items() if m == mac)
    chosen = mine[mine.index(first) :][:k]
    retry_at = now + 60 * S if later else None
    result = await step.store.requeue(
        mac,
        [(t, model.leased[t][1]) for t in chosen],
        count_attempt=counted,
        reason="nack",
        retry_at_ms=retry_at,
        now=now,
    )
    dead = {d["task_id"] for d in result.dead_letters}
    if counted:
        for t in chosen:
            model.failures[t] = model.failures.get(t, 0) + 1
    assert dead == {t for t in chosen if counted and model.failures[t] >= MAX_ATTEMPTS}
    assert result.requeued == (0 if later else len(chosen) - len(dead))
    if later:
        event("requeue delayed")
        model.delayed.update((t, retry_at) for t in chosen if t not in dead)
    if dead:
        event("requeue dead-lettered")
    for t in chosen:
        if t in dead:
            model.finish(t, "dead")
        else:
            del model.leased[t]
    return now


async def op_cancel(step: Step, d: int, i: int, leased: bool) -> int:
    store, model, now, mac = step.store, step.model, step.now, step.mac(d)
    pool = sorted(t for t, (m, _) in model.leased.items() if m == mac) if leased else sorted(model.queued_ids(mac))
    if not pool:
        assert await store.cancel(mac, "nothing-here", now=now) is False
        return now
    task_id = pool[i % len(pool)]
    assert await store.cancel(mac, task_id, now=now) is (not leased)
    if not leased:
        model.finish(task_id, "cancelled")
    return now


async def op_tick(step: Step, seconds: int) -> int:
    store, model = step.store, step.model
    now = step.now + seconds * S
    if await store.resume_due(now=now):
        event("resumed a device")
    due = {t for t, at in model.delayed.items() if at <= now}
    assert await store.promote_due(now=now) == len(due)
    for t in due:
        del model.delayed[t]
    if due:
        event("promoted delayed tasks")
    return now


async def op_expire_leases(step: Step) -> int:
    store, model, now = step.store, step.model, step.now
    due = await store.leases_due(now=now + int(store.settings.lease_ttl_s * 1000))
    for mac, leases in due.items():
        result = await store.requeue(mac, list(leases), count_attempt=True, reason="lease expired", now=now)
        for t, _ in leases:
            model.failures[t] = model.failures.get(t, 0) + 1
        for d in result.dead_letters:
            model.finish(d["task_id"], "dead")
        for t, _ in leases:
            model.leased.pop(t, None)
    return now


#: each kind of operation in OPS, and what it does (its arguments are the rest of the tuple)
OPERATIONS: dict[str, Callable[..., Awaitable[int]]] = {
    "enqueue": op_enqueue,
    "serve": op_serve,
    "serve_typed": op_serve_typed,
    "rank_serve": op_rank_serve,
    "defer": op_defer,
    "defer_types": op_defer_types,
    "ack": op_ack,
    "requeue": op_requeue,
    "cancel": op_cancel,
    "tick": op_tick,
    "expire_leases": op_expire_leases,
}


async def apply(store: QueueStore, model: Model, macs: list[str], op: Op, now: int, token: str) -> int:
    """Applies one operation at `now` (checking its reply against the model); returns the new time."""
    kind = op[0]
    event(kind)
    operation = OPERATIONS.get(kind)
    if operation is None:  # pragma: no cover
        raise AssertionError(kind)
    return await operation(Step(store, model, macs, now, token), *op[1:])


@pytest.fixture
def redis_url(settings: Settings) -> str:
    client = redis_sync.Redis.from_url(settings.redis_url)
    try:
        client.ping()
    except redis_sync.RedisError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis is required in CI: {exc}")
        pytest.skip(f"Redis not available: {exc}")
    finally:
        client.close()
    return settings.redis_url


@hypothesis_settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(n_devices=st.integers(3, 5), ops=st.lists(OPS, min_size=20, max_size=60))
# tasks of a type nobody takes wait twice and are dead-lettered the second time (their caller's count drops)
@example(
    n_devices=3,
    ops=[
        ("enqueue", 0, 2, 3, False, 1, "alice"),
        ("enqueue", 0, 1, 3, False, 2, "bob"),
        ("defer_types", 0, 1, (1,)),
        ("tick", 60),
        ("defer_types", 0, 0, (1,)),
        ("serve", 0, 4),
        ("ack", 0, False),
    ],
)
def test_counters_agree_and_every_task_is_in_exactly_one_place_after_any_sequence(
    redis_url: str, n_devices: int, ops: list[Op]
) -> None:
    asyncio.run(run(redis_url, n_devices, ops))

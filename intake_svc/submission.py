"""Accepting tasks: the caller's own limits, admission check, the task row in PostgreSQL first, then the enqueue.

First what the caller may do (`caller_limits.py`: priorities, submit rate, device ownership; each refused task
changes nothing), then the cheap admission check (global, caller quota, device). A task is accepted only once
its row and its queue entry are both written. If the enqueue is refused (a limit was reached meanwhile) or
fails, the row is withdrawn, so nothing is left half-accepted; a repeated idempotency key returns the first
task without queueing anything again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from intake_svc.admission import RetryAdvisor
from intake_svc.caller_limits import CallerLimits
from intake_svc.decisions import Accepted, Conflict, Decision, Refused
from intake_svc.ownership import DeviceOwners, Ownership
from intake_svc.tracing import count_decisions, enqueue_span, stamp_trace, step_timer
from sieve.caller_policy import CallerPolicy
from sieve.db.tasks import NewTask, TaskStore
from sieve.errors import AdmissionRefused, ScriptCode
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore
from sieve.rpc.auth import Principal, current_principal
from sieve.settings import Settings
from sieve.v1 import types_pb2

log = logging.getLogger("sieve.intake.submission")


def _entry(task: NewTask, enqueued_ms: int) -> Entry:
    return Entry(
        str(task.task_id),
        task.task_type,
        task.priority,
        enqueued_ms,
        int(task.expires_at.timestamp() * 1000),
        trace=task.trace_context or "",
        caller=task.caller,
    )


@dataclass(frozen=True, slots=True)
class _Counters:
    """What the cheap admission check reads before writing anything: global pending, each device's backlog,
    the caller's open tasks."""

    pending: int
    backlogs: dict[str, int]
    caller_open: int


class Submitter:
    """Admits, records and enqueues validated tasks; one instance per intake process."""

    def __init__(
        self, tasks: TaskStore, queues: QueueStore, settings: Settings, ownership: Ownership | None = None
    ) -> None:
        self.tasks = tasks
        self.queues = queues
        self.settings = settings
        #: retry delays of refusals (the global one from the measured drain rate)
        self.retry = RetryAdvisor(queues, settings)
        #: what each caller may do: priorities, submit rate, pending quota
        self.limits = CallerLimits(queues, settings, self.retry)
        #: who owns which device
        self.ownership = ownership or Ownership(DeviceOwners(tasks.pool), settings.device_owner_refresh_s)

    def _entitled(
        self,
        batch: list[NewTask],
        principal: Principal,
        policy: CallerPolicy,
        fields: Sequence[str],
        decisions: list[Decision | None],
    ) -> list[int]:
        """Refuses the tasks of a priority this caller is not entitled to; returns the others' indexes."""
        allowed: list[int] = []
        for i, t in enumerate(batch):
            if policy.may_use(t.priority):
                allowed.append(i)
                continue
            field, priority = f"{fields[i]}.priority", types_pb2.Priority.Name(t.priority)
            decisions[i] = Refused(
                "priority",
                f"{field}: {priority} is an entitlement caller {principal.name!r} does not have",
                0.0,
                grpc.StatusCode.PERMISSION_DENIED,
                "PRIORITY_NOT_ENTITLED",
                (("field", field), ("priority", priority)),
            )
        return allowed

    async def _owned(
        self, batch: list[NewTask], principal: Principal, allowed: list[int], decisions: list[Decision | None]
    ) -> list[int]:
        """Refuses the tasks for devices another caller owns (claiming unowned ones); returns the others."""
        if not allowed or not self.limits.claims_devices(principal):
            return allowed
        owners = await self.ownership.owners(sorted({batch[i].device for i in allowed}), principal.name)
        mine = []
        for i in allowed:
            device = batch[i].device
            if owners[device] == principal.name:
                mine.append(i)
            else:  # the device is named, its owner never is
                decisions[i] = Refused(
                    "not_owner",
                    f"device {device} belongs to another caller",
                    0.0,
                    grpc.StatusCode.PERMISSION_DENIED,
                    "DEVICE_NOT_OWNED",
                    (("device", device),),
                )
        return mine

    async def submit(
        self, batch: list[NewTask], principal: Principal | None = None, fields: Sequence[str] | None = None
    ) -> list[Decision]:
        """Decides every task of the batch, in order, for `principal` (default: the RPC's caller); `fields` name
        each task in refusals ("task", "tasks[3]"). Raises when PostgreSQL or Redis is unreachable (then nothing
        of the batch was accepted)."""
        principal = principal or current_principal.get()
        fields = fields or [f"tasks[{i}]" for i in range(len(batch))]
        batch = stamp_trace(batch)  # the Submit's trace goes with each task (row and queue entry)
        decisions: list[Decision | None] = [None] * len(batch)
        policy = self.limits.policy_of(principal)

        with step_timer("caller_limits"):
            # 0. priorities this caller may not use
            allowed = self._entitled(batch, principal, policy, fields, decisions)
            # 1. one round trip: the caller's submit tokens, and the counters of a cheap check before writing
            allowed, counters = await self._rate_limited(batch, principal, policy, allowed, decisions)
        # 2. devices of other callers
        with step_timer("ownership"):
            candidates = await self._owned(batch, principal, allowed, decisions)
        # 3. refuse devices (or all) that are already full, and a caller at its quota
        quota = self.limits.quota(policy)
        admitted = await self._within_limits(batch, principal, candidates, counters, quota, decisions)
        if admitted:
            # 4. the record first
            with step_timer("record"):
                fresh = await self._record(batch, admitted, decisions)
            # 5. then the queues, one atomic admission + enqueue per device
            if fresh:
                with step_timer("enqueue"):
                    await self._enqueue(batch, fresh, principal, quota, decisions)
        return count_decisions([d for d in decisions if d is not None])

    async def _rate_limited(
        self,
        batch: list[NewTask],
        principal: Principal,
        policy: CallerPolicy,
        allowed: list[int],
        decisions: list[Decision | None],
    ) -> tuple[list[int], _Counters]:
        """Takes the caller's submit tokens and reads the admission counters in one round trip; refuses the tasks
        beyond the tokens granted. Returns the others' indexes and the counters."""
        devices = sorted({batch[i].device for i in allowed})
        counted = principal.name if policy.max_pending is not None else ""
        take = self.limits.token_take(principal.name, policy, len(allowed))
        pending, backlogs, caller_open, granted, wait_s = await self.queues.admission_view(devices, counted, take)
        if take is not None:
            for i in allowed[granted:]:
                decisions[i] = Refused(
                    "caller_rate",
                    f"caller {principal.name!r} is over its submit rate ({policy.rate_per_s:g} "
                    f"tasks/s, burst {policy.burst}); retry in {wait_s:.3f}s",
                    wait_s + 0.002,
                )
            allowed = allowed[:granted]
        return allowed, _Counters(pending, backlogs, caller_open)

    async def _within_limits(
        self,
        batch: list[NewTask],
        principal: Principal,
        candidates: list[int],
        counters: _Counters,
        quota: int,
        decisions: list[Decision | None],
    ) -> list[int]:
        """The cheap check before anything is written: refuses every task when the global limit would be passed,
        then when the caller's quota would be (one answer for the whole batch), then the tasks of devices that
        would pass their own limit. Returns the indexes of the tasks admitted."""
        incoming: dict[str, int] = defaultdict(int)
        for i in candidates:
            incoming[batch[i].device] += 1
        admitted: list[int] = []
        pending, backlogs, caller_open = counters.pending, counters.backlogs, counters.caller_open
        over_quota: Refused | None = None  # one answer for every task of the batch
        for i in candidates:
            t = batch[i]
            if pending + len(candidates) > self.settings.max_total_pending:
                full = AdmissionRefused(ScriptCode.GLOBAL_LIMIT, 0, pending)
                decisions[i] = await self._refusal(full, t, len(candidates))
            elif caller_open + len(candidates) > quota:
                over = AdmissionRefused(ScriptCode.CALLER_LIMIT, backlogs[t.device], pending, caller_open)
                over_quota = over_quota or await self._refusal(over, t, len(candidates), principal)
                decisions[i] = over_quota
            elif backlogs[t.device] + incoming[t.device] > self.settings.max_per_device_pending:
                refusal = AdmissionRefused(ScriptCode.DEVICE_LIMIT, backlogs[t.device], pending)
                decisions[i] = await self._refusal(refusal, t, incoming[t.device])
            else:
                admitted.append(i)
        return admitted

    async def _record(
        self, batch: list[NewTask], admitted: list[int], decisions: list[Decision | None]
    ) -> dict[str, list[int]]:
        """Writes the admitted tasks' rows; decides those whose idempotency key named an earlier task. Returns
        the indexes of the new rows by device (what is left to enqueue)."""
        recorded = await self.tasks.insert([batch[i] for i in admitted])
        fresh: dict[str, list[int]] = defaultdict(list)
        for i, rec in zip(admitted, recorded, strict=True):
            if rec.created:
                fresh[batch[i].device].append(i)
            elif rec.conflict:  # the key names a task of another request: nothing changes
                decisions[i] = Conflict(rec.task_id, batch[i].idempotency_key or "")
            else:
                decisions[i] = Accepted(rec.task_id, deduplicated=True)
        return fresh

    async def _enqueue(
        self,
        batch: list[NewTask],
        fresh: dict[str, list[int]],
        principal: Principal,
        quota: int,
        decisions: list[Decision | None],
    ) -> None:
        """Enqueues the new rows, one atomic admission + enqueue per device; withdraws the rows of devices whose
        enqueue was refused (a limit reached meanwhile), and all of them when the enqueue failed (re-raised)."""
        now_ms = int(time.time() * 1000)
        groups = {mac: [_entry(batch[i], now_ms) for i in idx] for mac, idx in fresh.items()}
        try:
            with enqueue_span(groups):
                results = await self.queues.enqueue_many(groups, now=now_ms, caller_limit=quota)
        except Exception:
            await self._withdraw([batch[i].task_id for idx in fresh.values() for i in idx])
            raise
        withdrawn: list[uuid.UUID] = []
        for mac, idx in fresh.items():
            outcome = results[mac]
            if isinstance(outcome, AdmissionRefused):
                withdrawn += [batch[i].task_id for i in idx]
                for i in idx:
                    decisions[i] = await self._refusal(outcome, batch[i], len(idx), principal)
            else:
                for i in idx:
                    decisions[i] = Accepted(batch[i].task_id, deduplicated=False)
        if withdrawn:
            await self._withdraw(withdrawn)

    async def _refusal(
        self, refusal: AdmissionRefused, task: NewTask, incoming: int, principal: Principal | None = None
    ) -> Refused:
        if refusal.code is ScriptCode.CALLER_LIMIT:  # the caller's own quota: its devices are not overloaded
            policy = self.limits.policy_of(principal or current_principal.get())
            delay = await self.limits.quota_retry_after_s(refusal.caller_open, incoming, policy)
            return Refused(
                "caller_limit",
                f"caller {task.caller!r} is at its pending limit ({policy.max_pending} "
                f"tasks accepted and not final); retry in {delay:.1f}s",
                delay,
            )
        meta: dict[str, str] = {}
        if not refusal.is_global:
            await self.queues.mark_overloaded(task.device)
            meta = await self.queues.device_meta(task.device)
        delay = await self.retry.after_s(refusal, meta, incoming)
        reason = "global_limit" if refusal.is_global else "device_limit"
        what = (
            "Sieve is at its global pending limit"
            if refusal.is_global
            else (f"device {task.device} is at its pending limit ({self.settings.max_per_device_pending})")
        )
        return Refused(reason, f"{what}; retry in {delay:.1f}s", delay)

    async def _withdraw(self, task_ids: list[uuid.UUID]) -> None:
        try:
            await self.tasks.withdraw(task_ids)
        except Exception:  # the rows stay PENDING; a Redis rebuild from PostgreSQL queues them
            log.exception("could not withdraw %d unqueued tasks", len(task_ids))

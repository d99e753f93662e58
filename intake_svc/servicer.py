"""The IntakeService RPCs: Submit, SubmitBatch, GetTask, CancelTask, ListTasks, ReportDetection, WatchTask; for
operators AssignDevice, GetDeviceOwner.

Only this module turns Sieve's errors into gRPC statuses: InvalidInput -> INVALID_ARGUMENT naming the
field, a limit -> RESOURCE_EXHAUSTED with RetryInfo, what the caller may not do (a priority it is not
entitled to, another caller's device) -> PERMISSION_DENIED with an ErrorInfo, an unknown task -> NOT_FOUND,
PostgreSQL or Redis unreachable -> UNAVAILABLE.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import grpc
from google.protobuf import duration_pb2
from google.rpc import status_pb2
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from intake_svc.caller_limits import permission_denied
from intake_svc.decisions import Accepted, Conflict, Refused
from intake_svc.listing import NotPermitted, list_page
from intake_svc.ownership import Owner
from intake_svc.reports import ReportConflict, report_message, validate_report
from intake_svc.stats import get_stats
from intake_svc.submission import Submitter
from intake_svc.task_view import NewTaskTemplates, fill_new_task, new_task_message, task_message
from intake_svc.tracing import step_timer
from intake_svc.validation import parse_device, parse_task_id, validate_batch, validate_spec
from intake_svc.watch import (
    CursorExpired,
    Revoked,
    ShuttingDown,
    TooManyStreams,
    UnknownTasks,
    WatchHub,
    parse_request,
)
from sieve import rpc
from sieve.db.callbacks import CallbackStore
from sieve.db.reports import ReportStore
from sieve.db.task_changes import TaskChangeStore
from sieve.db.tasks import TaskStore
from sieve.enums import enum_value
from sieve.errors import InvalidInput, RedisNotReady
from sieve.redis.queue_store import QueueStore
from sieve.rpc import audit
from sieve.rpc.auth import Principal, current_credential_valid, current_principal
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2

log = logging.getLogger("sieve.intake")
#: how long a caller refused a further WatchTask stream is told to wait
WATCH_RETRY_AFTER_S = 5.0
T = TypeVar("T")

# a connection PostgreSQL terminated can surface as InternalClientError on its next use: transient too
_UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    RedisConnectionError,
    RedisTimeoutError,
    RedisNotReady,
)


class IntakeServicer(intake_pb2_grpc.IntakeServiceServicer):
    """The IntakeService RPCs. Each validates its request, delegates to the `Submitter` (admission, the row, the
    enqueue), the task store or the device ownership, and turns the outcome into an answer or a status."""

    def __init__(self, tasks: TaskStore, queues: QueueStore, settings: Settings) -> None:
        self.tasks = tasks
        self.queues = queues
        self.settings = settings
        self.submitter = Submitter(tasks, queues, settings)
        self.reports = ReportStore(tasks.pool)
        self.callbacks = CallbackStore(tasks.pool)
        #: the WatchTask streams (their change signal is a background loop of the intake: `watch.run`)
        self.watch = WatchHub(TaskChangeStore(tasks.pool), settings)

    async def _guard(self, context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except InvalidInput as exc:
            await rpc.abort(context, rpc.invalid_argument(exc.field, exc.description))
        except NotPermitted as exc:  # a client asking for another caller's records
            await rpc.abort(context, permission_denied(str(exc), "NOT_AN_OPERATOR", field="caller"))
        except _UNAVAILABLE as exc:
            log.warning("dependency unavailable: %s", exc)
            await rpc.abort(
                context,
                rpc.plain_status(grpc.StatusCode.UNAVAILABLE, f"storage unavailable, retry: {type(exc).__name__}"),
            )
        raise AssertionError("unreachable")

    async def _task(self, task_id: str, principal: Principal) -> types_pb2.Task | None:
        """The task as `principal` may see it: None when it does not exist or is another caller's (an
        operator sees every task)."""
        found = await self.tasks.get(parse_task_id(task_id))
        if found is None or not principal.owns(found[0]["caller"]):
            return None
        audit.cross_tenant(found[0]["caller"], f"task {task_id}")  # an operator reading another caller's task
        row, result = found
        deliveries = await self.callbacks.of_task(row["id"]) if row["callback_url"] else []
        return task_message(row, result, deliveries)

    # --- Submit --------------------------------------------------------------------------------------
    async def Submit(
        self, request: intake_pb2.SubmitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.SubmitResponse:
        async def run() -> intake_pb2.SubmitResponse | Refused | Conflict:
            if not request.HasField("task"):
                raise InvalidInput("task", "is required")
            with step_timer("validate"):
                task = validate_spec(request.task, "task", current_principal.get().name, self.settings)
            (decision,) = await self.submitter.submit([task], current_principal.get(), ["task"])
            if isinstance(decision, Refused | Conflict):
                return decision
            # a new task is answered from what was recorded; only an earlier one is read back
            view = (
                await self._task(str(decision.task_id), current_principal.get())
                if decision.deduplicated
                else new_task_message(task)
            )
            return intake_pb2.SubmitResponse(task=view, deduplicated=decision.deduplicated)

        outcome = await self._guard(context, run)
        if isinstance(outcome, Refused) and outcome.code == grpc.StatusCode.PERMISSION_DENIED:
            await rpc.abort(
                context, permission_denied(outcome.message, outcome.error_reason, **dict(outcome.error_metadata))
            )
        if isinstance(outcome, Refused):
            await rpc.abort(context, rpc.resource_exhausted(outcome.message, outcome.retry_after_s))
        if isinstance(outcome, Conflict):
            await rpc.abort(context, outcome.status("task.idempotency_key"))
        assert isinstance(outcome, intake_pb2.SubmitResponse)
        return outcome

    async def SubmitBatch(
        self, request: intake_pb2.SubmitBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.SubmitBatchResponse:
        async def run() -> intake_pb2.SubmitBatchResponse:
            with step_timer("validate"):
                batch = validate_batch(request, current_principal.get().name, self.settings)
            decisions = await self.submitter.submit(
                batch, current_principal.get(), [f"tasks[{i}]" for i in range(len(batch))]
            )
            reply = intake_pb2.SubmitBatchResponse()
            templates: NewTaskTemplates = {}
            for task, decision in zip(batch, decisions, strict=True):
                item = reply.items.add()
                if isinstance(decision, Accepted) and not decision.deduplicated:
                    fill_new_task(item.task, task, templates)
                elif isinstance(decision, Accepted):  # the earlier task: GetTask tells its state
                    item.task.task_id = str(decision.task_id)
                    item.task.device_id = task.device
                    item.task.type = enum_value(types_pb2.TaskType, task.task_type)
                    item.task.priority = enum_value(types_pb2.Priority, task.priority)
                    item.deduplicated = True
                elif isinstance(decision, Conflict):
                    item.code = grpc.StatusCode.ALREADY_EXISTS.value[0]
                    item.message = decision.message
                elif decision.code == grpc.StatusCode.PERMISSION_DENIED:
                    item.code = decision.code.value[0]
                    item.message = decision.message
                else:
                    item.code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
                    item.message = decision.message
                    retry = duration_pb2.Duration()
                    retry.FromMilliseconds(math.ceil(decision.retry_after_s * 1000))
                    item.retry_after.CopyFrom(retry)  # present even when 0
            return reply

        return await self._guard(context, run)

    # --- reading and cancelling ----------------------------------------------------------------------
    async def GetTask(
        self, request: intake_pb2.GetTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.GetTaskResponse:
        view = await self._guard(context, lambda: self._task(request.task_id, current_principal.get()))
        if view is None:
            await rpc.abort(context, rpc.plain_status(grpc.StatusCode.NOT_FOUND, f"no task {request.task_id}"))
        return intake_pb2.GetTaskResponse(task=view)

    async def CancelTask(
        self, request: intake_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.CancelTaskResponse:
        async def run() -> types_pb2.Task | None:
            task_id = parse_task_id(request.task_id)
            principal = current_principal.get()
            found = await self.tasks.get(task_id)
            if found is None or not principal.owns(found[0]["caller"]):
                return None
            who = f"cancelled by {principal.name}"
            moved = await self.tasks.transition([task_id], "CANCELLED", who)
            if moved:
                # a queued task leaves its queue now; a running one finishes but its result is refused
                await self.queues.cancel(found[0]["device"], str(task_id))
            return await self._task(str(task_id), principal)

        view = await self._guard(context, run)
        if view is None:
            await rpc.abort(context, rpc.plain_status(grpc.StatusCode.NOT_FOUND, f"no task {request.task_id}"))
        return intake_pb2.CancelTaskResponse(task=view)

    # --- device ownership (operators) ----------------------------------------------------------------
    async def AssignDevice(
        self, request: intake_pb2.AssignDeviceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.AssignDeviceResponse:
        async def run() -> intake_pb2.AssignDeviceResponse:
            device = parse_device(request.device_id)
            caller = request.caller.strip()
            if not caller or len(caller) > 128 or not caller.isprintable() or set("/:,") & set(caller):
                raise InvalidInput("caller", "must be a credential name (1..128 printable characters, none of / : ,)")
            owner, previous = await self.submitter.ownership.assign(device, caller, current_principal.get().name)
            log.info(
                "device %s assigned to %s (was %s)", device, caller, previous or "nobody", extra={"device": device}
            )
            return intake_pb2.AssignDeviceResponse(owner=_owner_message(owner), previous_caller=previous or "")

        return await self._guard(context, run)

    async def GetDeviceOwner(
        self, request: intake_pb2.GetDeviceOwnerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.GetDeviceOwnerResponse:
        async def run() -> Owner | None:
            return await self.submitter.ownership.owner(parse_device(request.device_id))

        owner = await self._guard(context, run)
        if owner is None:
            await rpc.abort(
                context, rpc.plain_status(grpc.StatusCode.NOT_FOUND, f"nobody owns device {request.device_id!r} yet")
            )
        assert owner is not None
        return intake_pb2.GetDeviceOwnerResponse(owner=_owner_message(owner))

    # --- listing -------------------------------------------------------------------------------------
    async def ListTasks(
        self, request: intake_pb2.ListTasksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.ListTasksResponse:
        return await self._guard(context, lambda: list_page(self.tasks.pool, request, current_principal.get()))

    # --- statistics ----------------------------------------------------------------------------------
    async def GetStats(
        self, request: intake_pb2.GetStatsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.GetStatsResponse:
        return await self._guard(context, lambda: get_stats(self.tasks.pool, request, current_principal.get()))

    # --- reports of the devices' own detections ------------------------------------------------------
    async def ReportDetection(
        self, request: intake_pb2.ReportDetectionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> intake_pb2.ReportDetectionResponse:
        async def run() -> intake_pb2.ReportDetectionResponse | status_pb2.Status:
            principal = current_principal.get()
            report = validate_report(request, principal.name, self.settings)
            if self.submitter.limits.claims_devices(principal):
                owners = await self.submitter.ownership.owners([report.device], principal.name)
                if owners[report.device] != principal.name:
                    return permission_denied(
                        f"device {report.device} belongs to another caller", "DEVICE_NOT_OWNED", device=report.device
                    )
            stored = await self.reports.store(report)
            if not stored.same_request:
                return ReportConflict(report.report_id).status()
            return intake_pb2.ReportDetectionResponse(
                report=report_message(stored.row), deduplicated=not stored.created
            )

        outcome = await self._guard(context, run)
        if isinstance(outcome, status_pb2.Status):
            await rpc.abort(context, outcome)
        assert isinstance(outcome, intake_pb2.ReportDetectionResponse)
        return outcome

    # --- watching ------------------------------------------------------------------------------------
    async def WatchTask(
        self, request: intake_pb2.WatchTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[intake_pb2.WatchTaskResponse]:
        principal = current_principal.get()
        still_valid = current_credential_valid.get()
        try:
            watch = parse_request(request, principal)
        except InvalidInput as exc:
            await rpc.abort(context, rpc.invalid_argument(exc.field, exc.description))
        except NotPermitted as exc:
            await rpc.abort(context, permission_denied(str(exc), "NOT_AN_OPERATOR", field="caller"))
        refusal: status_pb2.Status | None = None
        try:
            with self.watch.slot(principal.name):
                async for response in self.watch.stream(watch, still_valid):
                    yield response
        except Revoked:
            refusal = rpc.plain_status(grpc.StatusCode.UNAUTHENTICATED, "the credential was revoked")
        except TooManyStreams as exc:
            refusal = rpc.resource_exhausted(str(exc), WATCH_RETRY_AFTER_S)
        except CursorExpired:
            refusal = rpc.plain_status(
                grpc.StatusCode.OUT_OF_RANGE,
                "cursor: older than the changes kept (SIEVE_WATCH_HISTORY_S); read the tasks' state with ListTasks "
                "and watch from now",
            )
        except UnknownTasks as exc:
            refusal = rpc.plain_status(grpc.StatusCode.NOT_FOUND, str(exc))
        except ShuttingDown:
            refusal = rpc.plain_status(
                grpc.StatusCode.UNAVAILABLE, "intake stopping: resume from the last cursor (on another replica)"
            )
        except _UNAVAILABLE as exc:
            log.warning("WatchTask: dependency unavailable: %s", exc)
            refusal = rpc.plain_status(
                grpc.StatusCode.UNAVAILABLE, f"storage unavailable, resume from the last cursor: {type(exc).__name__}"
            )
        if refusal is not None:
            await rpc.abort(context, refusal)


def _owner_message(owner: Owner) -> intake_pb2.DeviceOwner:
    message = intake_pb2.DeviceOwner(device_id=owner.device, caller=owner.caller, assigned_by=owner.assigned_by or "")
    if owner.since is not None:
        message.since.FromDatetime(owner.since)
    return message

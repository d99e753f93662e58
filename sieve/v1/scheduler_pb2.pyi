import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sieve.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuditKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIT_KIND_UNSPECIFIED: _ClassVar[AuditKind]
    AUDIT_KIND_OPERATOR: _ClassVar[AuditKind]
    AUDIT_KIND_REFUSED: _ClassVar[AuditKind]
    AUDIT_KIND_CROSS_TENANT: _ClassVar[AuditKind]
AUDIT_KIND_UNSPECIFIED: AuditKind
AUDIT_KIND_OPERATOR: AuditKind
AUDIT_KIND_REFUSED: AuditKind
AUDIT_KIND_CROSS_TENANT: AuditKind

class WorkerHello(_message.Message):
    __slots__ = ("worker_id", "task_types", "gpu", "held")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    task_types: _containers.RepeatedScalarFieldContainer[_types_pb2.TaskType]
    gpu: bool
    held: _containers.RepeatedCompositeFieldContainer[HeldLease]
    def __init__(self, worker_id: _Optional[str] = ..., task_types: _Optional[_Iterable[_Union[_types_pb2.TaskType, str]]] = ..., gpu: _Optional[bool] = ..., held: _Optional[_Iterable[_Union[HeldLease, _Mapping]]] = ...) -> None: ...

class HeldLease(_message.Message):
    __slots__ = ("task_id", "lease_token", "assigned_at")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    lease_token: str
    assigned_at: _timestamp_pb2.Timestamp
    def __init__(self, task_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., assigned_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("task_id", "lease_token", "worker_time_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    lease_token: str
    worker_time_ms: int
    def __init__(self, task_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., worker_time_ms: _Optional[int] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("task_id", "lease_token", "reason", "retry_after", "count_attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    COUNT_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    lease_token: str
    reason: str
    retry_after: _duration_pb2.Duration
    count_attempt: bool
    def __init__(self, task_id: _Optional[str] = ..., lease_token: _Optional[str] = ..., reason: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., count_attempt: _Optional[bool] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("hello", "credits", "acks", "nacks", "draining")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    hello: WorkerHello
    credits: int
    acks: _containers.RepeatedCompositeFieldContainer[Ack]
    nacks: _containers.RepeatedCompositeFieldContainer[Nack]
    draining: bool
    def __init__(self, hello: _Optional[_Union[WorkerHello, _Mapping]] = ..., credits: _Optional[int] = ..., acks: _Optional[_Iterable[_Union[Ack, _Mapping]]] = ..., nacks: _Optional[_Iterable[_Union[Nack, _Mapping]]] = ..., draining: _Optional[bool] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("task_id", "device_id", "type", "priority", "attempt", "lease_token", "assigned_at", "enqueued_at", "traceparent")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    device_id: str
    type: _types_pb2.TaskType
    priority: _types_pb2.Priority
    attempt: int
    lease_token: str
    assigned_at: _timestamp_pb2.Timestamp
    enqueued_at: _timestamp_pb2.Timestamp
    traceparent: str
    def __init__(self, task_id: _Optional[str] = ..., device_id: _Optional[str] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., priority: _Optional[_Union[_types_pb2.Priority, str]] = ..., attempt: _Optional[int] = ..., lease_token: _Optional[str] = ..., assigned_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., enqueued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ...) -> None: ...

class AssignmentBatch(_message.Message):
    __slots__ = ("assignments",)
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    def __init__(self, assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: AssignmentBatch
    def __init__(self, batch: _Optional[_Union[AssignmentBatch, _Mapping]] = ...) -> None: ...

class GetWatermarkRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetWatermarkResponse(_message.Message):
    __slots__ = ("total_pending", "active_devices", "live_workers", "at", "overloaded_devices", "backoff_devices", "dead_letters", "oldest_wait", "leased")
    TOTAL_PENDING_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    OVERLOADED_DEVICES_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_DEVICES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    total_pending: int
    active_devices: int
    live_workers: int
    at: _timestamp_pb2.Timestamp
    overloaded_devices: _containers.RepeatedScalarFieldContainer[str]
    backoff_devices: _containers.RepeatedScalarFieldContainer[str]
    dead_letters: int
    oldest_wait: _duration_pb2.Duration
    leased: int
    def __init__(self, total_pending: _Optional[int] = ..., active_devices: _Optional[int] = ..., live_workers: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., overloaded_devices: _Optional[_Iterable[str]] = ..., backoff_devices: _Optional[_Iterable[str]] = ..., dead_letters: _Optional[int] = ..., oldest_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., leased: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("task_id", "device_id", "type", "priority", "error", "attempts", "requeue_count", "enqueued_at", "dead_at")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    DEAD_AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    device_id: str
    type: _types_pb2.TaskType
    priority: _types_pb2.Priority
    error: str
    attempts: int
    requeue_count: int
    enqueued_at: _timestamp_pb2.Timestamp
    dead_at: _timestamp_pb2.Timestamp
    def __init__(self, task_id: _Optional[str] = ..., device_id: _Optional[str] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., priority: _Optional[_Union[_types_pb2.Priority, str]] = ..., error: _Optional[str] = ..., attempts: _Optional[int] = ..., requeue_count: _Optional[int] = ..., enqueued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dead_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DeadLetterFilter(_message.Message):
    __slots__ = ("task_id", "device_id", "type", "error_contains")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    device_id: str
    type: _types_pb2.TaskType
    error_contains: str
    def __init__(self, task_id: _Optional[str] = ..., device_id: _Optional[str] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., error_contains: _Optional[str] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("filter", "limit")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    filter: DeadLetterFilter
    limit: int
    def __init__(self, filter: _Optional[_Union[DeadLetterFilter, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "total")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    total: int
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class RequeueDeadLettersRequest(_message.Message):
    __slots__ = ("filter", "all")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    filter: DeadLetterFilter
    all: bool
    def __init__(self, filter: _Optional[_Union[DeadLetterFilter, _Mapping]] = ..., all: _Optional[bool] = ...) -> None: ...

class RequeueDeadLettersResponse(_message.Message):
    __slots__ = ("task_ids",)
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PurgeDeadLettersRequest(_message.Message):
    __slots__ = ("filter", "all")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    filter: DeadLetterFilter
    all: bool
    def __init__(self, filter: _Optional[_Union[DeadLetterFilter, _Mapping]] = ..., all: _Optional[bool] = ...) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ("purged",)
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("id", "at", "kind", "principal", "roles", "method", "target", "tenant", "peer", "outcome", "detail", "duration")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: _timestamp_pb2.Timestamp
    kind: AuditKind
    principal: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    method: str
    target: str
    tenant: str
    peer: str
    outcome: str
    detail: str
    duration: _duration_pb2.Duration
    def __init__(self, id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[AuditKind, str]] = ..., principal: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., method: _Optional[str] = ..., target: _Optional[str] = ..., tenant: _Optional[str] = ..., peer: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ListAuditEventsRequest(_message.Message):
    __slots__ = ("limit", "principal", "method", "kind", "outcome", "before", "page_token")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    limit: int
    principal: str
    method: str
    kind: AuditKind
    outcome: str
    before: _timestamp_pb2.Timestamp
    page_token: str
    def __init__(self, limit: _Optional[int] = ..., principal: _Optional[str] = ..., method: _Optional[str] = ..., kind: _Optional[_Union[AuditKind, str]] = ..., outcome: _Optional[str] = ..., before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListSlotPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlotHolder(_message.Message):
    __slots__ = ("holder", "lease_deadline")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    holder: str
    lease_deadline: _timestamp_pb2.Timestamp
    def __init__(self, holder: _Optional[str] = ..., lease_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SlotPool(_message.Message):
    __slots__ = ("name", "max_slots", "in_use", "holders")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_SLOTS_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    max_slots: int
    in_use: int
    holders: _containers.RepeatedCompositeFieldContainer[SlotHolder]
    def __init__(self, name: _Optional[str] = ..., max_slots: _Optional[int] = ..., in_use: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[SlotHolder, _Mapping]]] = ...) -> None: ...

class ExternalCost(_message.Message):
    __slots__ = ("provider", "caller", "jobs", "cost")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    provider: str
    caller: str
    jobs: int
    cost: float
    def __init__(self, provider: _Optional[str] = ..., caller: _Optional[str] = ..., jobs: _Optional[int] = ..., cost: _Optional[float] = ...) -> None: ...

class ListSlotPoolsResponse(_message.Message):
    __slots__ = ("pools", "costs")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    COSTS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[SlotPool]
    costs: _containers.RepeatedCompositeFieldContainer[ExternalCost]
    def __init__(self, pools: _Optional[_Iterable[_Union[SlotPool, _Mapping]]] = ..., costs: _Optional[_Iterable[_Union[ExternalCost, _Mapping]]] = ...) -> None: ...

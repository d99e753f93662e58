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

class StatsGranularity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATS_GRANULARITY_UNSPECIFIED: _ClassVar[StatsGranularity]
    STATS_GRANULARITY_HOUR: _ClassVar[StatsGranularity]
    STATS_GRANULARITY_DAY: _ClassVar[StatsGranularity]
STATS_GRANULARITY_UNSPECIFIED: StatsGranularity
STATS_GRANULARITY_HOUR: StatsGranularity
STATS_GRANULARITY_DAY: StatsGranularity

class TaskSpec(_message.Message):
    __slots__ = ("device_id", "type", "priority", "text", "image", "image_url", "external", "idempotency_key", "ttl", "max_attempts", "labels", "callback_url")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    type: _types_pb2.TaskType
    priority: _types_pb2.Priority
    text: str
    image: bytes
    image_url: str
    external: ExternalJob
    idempotency_key: str
    ttl: _duration_pb2.Duration
    max_attempts: int
    labels: _containers.ScalarMap[str, str]
    callback_url: str
    def __init__(self, device_id: _Optional[str] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., priority: _Optional[_Union[_types_pb2.Priority, str]] = ..., text: _Optional[str] = ..., image: _Optional[bytes] = ..., image_url: _Optional[str] = ..., external: _Optional[_Union[ExternalJob, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., callback_url: _Optional[str] = ...) -> None: ...

class ExternalJob(_message.Message):
    __slots__ = ("provider", "input_json")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    provider: str
    input_json: str
    def __init__(self, provider: _Optional[str] = ..., input_json: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskSpec
    def __init__(self, task: _Optional[_Union[TaskSpec, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("task", "deduplicated")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    deduplicated: bool
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., deduplicated: _Optional[bool] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ...) -> None: ...

class SubmitBatchItem(_message.Message):
    __slots__ = ("task", "deduplicated", "code", "message", "retry_after")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    deduplicated: bool
    code: int
    message: str
    retry_after: _duration_pb2.Duration
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ..., deduplicated: _Optional[bool] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[SubmitBatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[SubmitBatchItem, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, _Mapping]] = ...) -> None: ...

class DeviceOwner(_message.Message):
    __slots__ = ("device_id", "caller", "since", "assigned_by")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_BY_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    caller: str
    since: _timestamp_pb2.Timestamp
    assigned_by: str
    def __init__(self, device_id: _Optional[str] = ..., caller: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., assigned_by: _Optional[str] = ...) -> None: ...

class AssignDeviceRequest(_message.Message):
    __slots__ = ("device_id", "caller")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    caller: str
    def __init__(self, device_id: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class AssignDeviceResponse(_message.Message):
    __slots__ = ("owner", "previous_caller")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_CALLER_FIELD_NUMBER: _ClassVar[int]
    owner: DeviceOwner
    previous_caller: str
    def __init__(self, owner: _Optional[_Union[DeviceOwner, _Mapping]] = ..., previous_caller: _Optional[str] = ...) -> None: ...

class GetDeviceOwnerRequest(_message.Message):
    __slots__ = ("device_id",)
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    def __init__(self, device_id: _Optional[str] = ...) -> None: ...

class GetDeviceOwnerResponse(_message.Message):
    __slots__ = ("owner",)
    OWNER_FIELD_NUMBER: _ClassVar[int]
    owner: DeviceOwner
    def __init__(self, owner: _Optional[_Union[DeviceOwner, _Mapping]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("device_id", "statuses", "type", "verdict", "labels", "created_after", "created_before", "page_size", "page_token", "caller")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    statuses: _containers.RepeatedScalarFieldContainer[_types_pb2.TaskStatus]
    type: _types_pb2.TaskType
    verdict: _types_pb2.Verdict
    labels: _containers.ScalarMap[str, str]
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    caller: str
    def __init__(self, device_id: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[_types_pb2.TaskStatus, str]]] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., verdict: _Optional[_Union[_types_pb2.Verdict, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_types_pb2.Task]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[_types_pb2.Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReportDetectionRequest(_message.Message):
    __slots__ = ("device_id", "report_id", "detected_at", "text", "image_url", "image_ref", "verdict", "hits", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    DETECTED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    report_id: str
    detected_at: _timestamp_pb2.Timestamp
    text: str
    image_url: str
    image_ref: str
    verdict: _types_pb2.Verdict
    hits: _containers.RepeatedCompositeFieldContainer[_types_pb2.Hit]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, device_id: _Optional[str] = ..., report_id: _Optional[str] = ..., detected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ..., image_url: _Optional[str] = ..., image_ref: _Optional[str] = ..., verdict: _Optional[_Union[_types_pb2.Verdict, str]] = ..., hits: _Optional[_Iterable[_Union[_types_pb2.Hit, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DetectionReport(_message.Message):
    __slots__ = ("report_id", "device_id", "caller", "detected_at", "received_at", "text", "image_url", "image_ref", "verdict", "hits", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    DETECTED_AT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_URL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    report_id: str
    device_id: str
    caller: str
    detected_at: _timestamp_pb2.Timestamp
    received_at: _timestamp_pb2.Timestamp
    text: str
    image_url: str
    image_ref: str
    verdict: _types_pb2.Verdict
    hits: _containers.RepeatedCompositeFieldContainer[_types_pb2.Hit]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, report_id: _Optional[str] = ..., device_id: _Optional[str] = ..., caller: _Optional[str] = ..., detected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., received_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., text: _Optional[str] = ..., image_url: _Optional[str] = ..., image_ref: _Optional[str] = ..., verdict: _Optional[_Union[_types_pb2.Verdict, str]] = ..., hits: _Optional[_Iterable[_Union[_types_pb2.Hit, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReportDetectionResponse(_message.Message):
    __slots__ = ("report", "deduplicated")
    REPORT_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    report: DetectionReport
    deduplicated: bool
    def __init__(self, report: _Optional[_Union[DetectionReport, _Mapping]] = ..., deduplicated: _Optional[bool] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("task_ids", "caller", "device_id", "labels", "cursor", "initial_state")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    caller: str
    device_id: str
    labels: _containers.ScalarMap[str, str]
    cursor: str
    initial_state: bool
    def __init__(self, task_ids: _Optional[_Iterable[str]] = ..., caller: _Optional[str] = ..., device_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., cursor: _Optional[str] = ..., initial_state: _Optional[bool] = ...) -> None: ...

class WatchTaskResponse(_message.Message):
    __slots__ = ("changes",)
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[TaskChange]
    def __init__(self, changes: _Optional[_Iterable[_Union[TaskChange, _Mapping]]] = ...) -> None: ...

class TaskChange(_message.Message):
    __slots__ = ("task_id", "device_id", "status", "at", "attempt", "detail", "sequence", "verdict", "cursor", "caller")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    device_id: str
    status: _types_pb2.TaskStatus
    at: _timestamp_pb2.Timestamp
    attempt: int
    detail: str
    sequence: int
    verdict: _types_pb2.Verdict
    cursor: str
    caller: str
    def __init__(self, task_id: _Optional[str] = ..., device_id: _Optional[str] = ..., status: _Optional[_Union[_types_pb2.TaskStatus, str]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ..., detail: _Optional[str] = ..., sequence: _Optional[int] = ..., verdict: _Optional[_Union[_types_pb2.Verdict, str]] = ..., cursor: _Optional[str] = ..., caller: _Optional[str] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("start_time", "end_time", "granularity", "device_id", "type", "caller", "by_caller", "by_device", "top")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    BY_CALLER_FIELD_NUMBER: _ClassVar[int]
    BY_DEVICE_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    granularity: StatsGranularity
    device_id: str
    type: _types_pb2.TaskType
    caller: str
    by_caller: bool
    by_device: bool
    top: int
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., granularity: _Optional[_Union[StatsGranularity, str]] = ..., device_id: _Optional[str] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., caller: _Optional[str] = ..., by_caller: _Optional[bool] = ..., by_device: _Optional[bool] = ..., top: _Optional[int] = ...) -> None: ...

class StatsCounts(_message.Message):
    __slots__ = ("succeeded", "failed", "expired", "cancelled", "dead_lettered", "finished", "reported", "p50_processing_time_ms", "p95_processing_time_ms")
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    P50_PROCESSING_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    P95_PROCESSING_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    succeeded: int
    failed: int
    expired: int
    cancelled: int
    dead_lettered: int
    finished: int
    reported: int
    p50_processing_time_ms: float
    p95_processing_time_ms: float
    def __init__(self, succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., expired: _Optional[int] = ..., cancelled: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., finished: _Optional[int] = ..., reported: _Optional[int] = ..., p50_processing_time_ms: _Optional[float] = ..., p95_processing_time_ms: _Optional[float] = ...) -> None: ...

class StatsBucket(_message.Message):
    __slots__ = ("start_time", "caller", "device_id", "type", "verdict", "counts")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    caller: str
    device_id: str
    type: _types_pb2.TaskType
    verdict: _types_pb2.Verdict
    counts: StatsCounts
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., caller: _Optional[str] = ..., device_id: _Optional[str] = ..., type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., verdict: _Optional[_Union[_types_pb2.Verdict, str]] = ..., counts: _Optional[_Union[StatsCounts, _Mapping]] = ...) -> None: ...

class StatsWord(_message.Message):
    __slots__ = ("word", "category", "hits")
    WORD_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    word: str
    category: str
    hits: int
    def __init__(self, word: _Optional[str] = ..., category: _Optional[str] = ..., hits: _Optional[int] = ...) -> None: ...

class StatsCategory(_message.Message):
    __slots__ = ("category", "hits")
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    category: str
    hits: int
    def __init__(self, category: _Optional[str] = ..., hits: _Optional[int] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("pending", "assigned", "running")
    PENDING_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    pending: int
    assigned: int
    running: int
    def __init__(self, pending: _Optional[int] = ..., assigned: _Optional[int] = ..., running: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("start_time", "end_time", "granularity", "buckets", "truncated", "next_start_time", "totals", "queue", "top_words", "top_categories")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_TIME_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TOP_WORDS_FIELD_NUMBER: _ClassVar[int]
    TOP_CATEGORIES_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    granularity: StatsGranularity
    buckets: _containers.RepeatedCompositeFieldContainer[StatsBucket]
    truncated: bool
    next_start_time: _timestamp_pb2.Timestamp
    totals: StatsCounts
    queue: QueueStats
    top_words: _containers.RepeatedCompositeFieldContainer[StatsWord]
    top_categories: _containers.RepeatedCompositeFieldContainer[StatsCategory]
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., granularity: _Optional[_Union[StatsGranularity, str]] = ..., buckets: _Optional[_Iterable[_Union[StatsBucket, _Mapping]]] = ..., truncated: _Optional[bool] = ..., next_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., totals: _Optional[_Union[StatsCounts, _Mapping]] = ..., queue: _Optional[_Union[QueueStats, _Mapping]] = ..., top_words: _Optional[_Iterable[_Union[StatsWord, _Mapping]]] = ..., top_categories: _Optional[_Iterable[_Union[StatsCategory, _Mapping]]] = ...) -> None: ...

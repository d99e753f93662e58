import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_TYPE_UNSPECIFIED: _ClassVar[TaskType]
    TASK_TYPE_TEXT: _ClassVar[TaskType]
    TASK_TYPE_OCR_IMAGE: _ClassVar[TaskType]
    TASK_TYPE_EXTERNAL: _ClassVar[TaskType]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_BACKGROUND: _ClassVar[Priority]
    PRIORITY_LOW: _ClassVar[Priority]
    PRIORITY_NORMAL: _ClassVar[Priority]
    PRIORITY_HIGH: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_PENDING: _ClassVar[TaskStatus]
    TASK_STATUS_ASSIGNED: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_SUCCEEDED: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_EXPIRED: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_DEAD_LETTERED: _ClassVar[TaskStatus]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_PASS: _ClassVar[Verdict]
    VERDICT_REVIEW: _ClassVar[Verdict]
    VERDICT_BLOCK: _ClassVar[Verdict]
TASK_TYPE_UNSPECIFIED: TaskType
TASK_TYPE_TEXT: TaskType
TASK_TYPE_OCR_IMAGE: TaskType
TASK_TYPE_EXTERNAL: TaskType
PRIORITY_UNSPECIFIED: Priority
PRIORITY_BACKGROUND: Priority
PRIORITY_LOW: Priority
PRIORITY_NORMAL: Priority
PRIORITY_HIGH: Priority
PRIORITY_CRITICAL: Priority
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_PENDING: TaskStatus
TASK_STATUS_ASSIGNED: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_EXPIRED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_DEAD_LETTERED: TaskStatus
VERDICT_UNSPECIFIED: Verdict
VERDICT_PASS: Verdict
VERDICT_REVIEW: Verdict
VERDICT_BLOCK: Verdict

class StatusChange(_message.Message):
    __slots__ = ("status", "at", "attempt", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: TaskStatus
    at: _timestamp_pb2.Timestamp
    attempt: int
    detail: str
    def __init__(self, status: _Optional[_Union[TaskStatus, str]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempt: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("word", "category", "severity", "start", "end", "matched_text", "line", "line_start", "line_end", "spans", "rules")
    WORD_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TEXT_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    LINE_START_FIELD_NUMBER: _ClassVar[int]
    LINE_END_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    word: str
    category: str
    severity: int
    start: int
    end: int
    matched_text: str
    line: int
    line_start: int
    line_end: int
    spans: _containers.RepeatedCompositeFieldContainer[HitSpan]
    rules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, word: _Optional[str] = ..., category: _Optional[str] = ..., severity: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., matched_text: _Optional[str] = ..., line: _Optional[int] = ..., line_start: _Optional[int] = ..., line_end: _Optional[int] = ..., spans: _Optional[_Iterable[_Union[HitSpan, _Mapping]]] = ..., rules: _Optional[_Iterable[str]] = ...) -> None: ...

class HitSpan(_message.Message):
    __slots__ = ("line", "start", "end")
    LINE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    line: int
    start: int
    end: int
    def __init__(self, line: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("x", "y")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ...) -> None: ...

class OcrLine(_message.Message):
    __slots__ = ("text", "confidence", "box")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    text: str
    confidence: float
    box: _containers.RepeatedCompositeFieldContainer[Point]
    def __init__(self, text: _Optional[str] = ..., confidence: _Optional[float] = ..., box: _Optional[_Iterable[_Union[Point, _Mapping]]] = ...) -> None: ...

class OcrModeSwitch(_message.Message):
    __slots__ = ("from_mode", "to_mode", "reason", "at", "rebuild_s")
    FROM_MODE_FIELD_NUMBER: _ClassVar[int]
    TO_MODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REBUILD_S_FIELD_NUMBER: _ClassVar[int]
    from_mode: str
    to_mode: str
    reason: str
    at: _timestamp_pb2.Timestamp
    rebuild_s: float
    def __init__(self, from_mode: _Optional[str] = ..., to_mode: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rebuild_s: _Optional[float] = ...) -> None: ...

class OcrRun(_message.Message):
    __slots__ = ("engine", "mode", "device", "simulated", "models", "source", "image_format", "image_width", "image_height", "boxes_found", "mode_switch")
    class ModelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    IMAGE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    BOXES_FOUND_FIELD_NUMBER: _ClassVar[int]
    MODE_SWITCH_FIELD_NUMBER: _ClassVar[int]
    engine: str
    mode: str
    device: str
    simulated: bool
    models: _containers.ScalarMap[str, str]
    source: str
    image_format: str
    image_width: int
    image_height: int
    boxes_found: int
    mode_switch: OcrModeSwitch
    def __init__(self, engine: _Optional[str] = ..., mode: _Optional[str] = ..., device: _Optional[str] = ..., simulated: _Optional[bool] = ..., models: _Optional[_Mapping[str, str]] = ..., source: _Optional[str] = ..., image_format: _Optional[str] = ..., image_width: _Optional[int] = ..., image_height: _Optional[int] = ..., boxes_found: _Optional[int] = ..., mode_switch: _Optional[_Union[OcrModeSwitch, _Mapping]] = ...) -> None: ...

class DetectionResult(_message.Message):
    __slots__ = ("verdict", "hits", "text", "worker_id", "created_at", "lines", "timings_ms", "processing_time_ms", "lexicon_version", "ocr", "attempt")
    class TimingsMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_MS_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LEXICON_VERSION_FIELD_NUMBER: _ClassVar[int]
    OCR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    text: str
    worker_id: str
    created_at: _timestamp_pb2.Timestamp
    lines: _containers.RepeatedCompositeFieldContainer[OcrLine]
    timings_ms: _containers.ScalarMap[str, float]
    processing_time_ms: float
    lexicon_version: int
    ocr: OcrRun
    attempt: int
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ..., text: _Optional[str] = ..., worker_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lines: _Optional[_Iterable[_Union[OcrLine, _Mapping]]] = ..., timings_ms: _Optional[_Mapping[str, float]] = ..., processing_time_ms: _Optional[float] = ..., lexicon_version: _Optional[int] = ..., ocr: _Optional[_Union[OcrRun, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "device_id", "type", "priority", "status", "attempts", "created_at", "updated_at", "expires_at", "history", "result", "error", "idempotency_key", "attempt_log", "max_attempts", "labels", "callback_url", "deliveries")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_LOG_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    device_id: str
    type: TaskType
    priority: Priority
    status: TaskStatus
    attempts: int
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    history: _containers.RepeatedCompositeFieldContainer[StatusChange]
    result: DetectionResult
    error: str
    idempotency_key: str
    attempt_log: _containers.RepeatedCompositeFieldContainer[TaskAttempt]
    max_attempts: int
    labels: _containers.ScalarMap[str, str]
    callback_url: str
    deliveries: _containers.RepeatedCompositeFieldContainer[CallbackDelivery]
    def __init__(self, task_id: _Optional[str] = ..., device_id: _Optional[str] = ..., type: _Optional[_Union[TaskType, str]] = ..., priority: _Optional[_Union[Priority, str]] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., attempts: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history: _Optional[_Iterable[_Union[StatusChange, _Mapping]]] = ..., result: _Optional[_Union[DetectionResult, _Mapping]] = ..., error: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., attempt_log: _Optional[_Iterable[_Union[TaskAttempt, _Mapping]]] = ..., max_attempts: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., callback_url: _Optional[str] = ..., deliveries: _Optional[_Iterable[_Union[CallbackDelivery, _Mapping]]] = ...) -> None: ...

class CallbackDelivery(_message.Message):
    __slots__ = ("url", "state", "status", "attempts", "last_http_status", "last_error", "created_at", "next_attempt_at", "delivered_at", "delivery_id")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[CallbackDelivery.State]
        STATE_PENDING: _ClassVar[CallbackDelivery.State]
        STATE_DELIVERED: _ClassVar[CallbackDelivery.State]
        STATE_GAVE_UP: _ClassVar[CallbackDelivery.State]
    STATE_UNSPECIFIED: CallbackDelivery.State
    STATE_PENDING: CallbackDelivery.State
    STATE_DELIVERED: CallbackDelivery.State
    STATE_GAVE_UP: CallbackDelivery.State
    URL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_AT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    url: str
    state: CallbackDelivery.State
    status: TaskStatus
    attempts: int
    last_http_status: int
    last_error: str
    created_at: _timestamp_pb2.Timestamp
    next_attempt_at: _timestamp_pb2.Timestamp
    delivered_at: _timestamp_pb2.Timestamp
    delivery_id: str
    def __init__(self, url: _Optional[str] = ..., state: _Optional[_Union[CallbackDelivery.State, str]] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., attempts: _Optional[int] = ..., last_http_status: _Optional[int] = ..., last_error: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delivered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delivery_id: _Optional[str] = ...) -> None: ...

class TaskAttempt(_message.Message):
    __slots__ = ("lease", "attempt", "worker_id", "assigned_at", "started_at", "ended_at", "outcome", "detail", "counted", "retry_at")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    RETRY_AT_FIELD_NUMBER: _ClassVar[int]
    lease: int
    attempt: int
    worker_id: str
    assigned_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    outcome: TaskStatus
    detail: str
    counted: bool
    retry_at: _timestamp_pb2.Timestamp
    def __init__(self, lease: _Optional[int] = ..., attempt: _Optional[int] = ..., worker_id: _Optional[str] = ..., assigned_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[_Union[TaskStatus, str]] = ..., detail: _Optional[str] = ..., counted: _Optional[bool] = ..., retry_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

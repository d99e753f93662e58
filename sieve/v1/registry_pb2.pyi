import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sieve.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Resources(_message.Message):
    __slots__ = ("gpu_available", "gpu_count", "gpu_names", "gpu_memory_total_bytes", "gpu_util_percent", "gpu_memory_percent", "cpu_count", "cpu_percent", "memory_total_bytes", "memory_available_bytes", "memory_percent", "active_tasks", "cpu_own_percent", "gpu_memory_own_percent", "scope", "cpu_platform_percent")
    GPU_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_NAMES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_UTIL_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    CPU_OWN_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_OWN_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CPU_PLATFORM_PERCENT_FIELD_NUMBER: _ClassVar[int]
    gpu_available: bool
    gpu_count: int
    gpu_names: _containers.RepeatedScalarFieldContainer[str]
    gpu_memory_total_bytes: int
    gpu_util_percent: float
    gpu_memory_percent: float
    cpu_count: int
    cpu_percent: float
    memory_total_bytes: int
    memory_available_bytes: int
    memory_percent: float
    active_tasks: int
    cpu_own_percent: float
    gpu_memory_own_percent: float
    scope: str
    cpu_platform_percent: float
    def __init__(self, gpu_available: _Optional[bool] = ..., gpu_count: _Optional[int] = ..., gpu_names: _Optional[_Iterable[str]] = ..., gpu_memory_total_bytes: _Optional[int] = ..., gpu_util_percent: _Optional[float] = ..., gpu_memory_percent: _Optional[float] = ..., cpu_count: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., memory_percent: _Optional[float] = ..., active_tasks: _Optional[int] = ..., cpu_own_percent: _Optional[float] = ..., gpu_memory_own_percent: _Optional[float] = ..., scope: _Optional[str] = ..., cpu_platform_percent: _Optional[float] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "hostname", "pid", "task_types", "resources", "registered_at", "last_heartbeat", "available", "unavailable_reasons", "concurrency")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    hostname: str
    pid: int
    task_types: _containers.RepeatedScalarFieldContainer[_types_pb2.TaskType]
    resources: Resources
    registered_at: _timestamp_pb2.Timestamp
    last_heartbeat: _timestamp_pb2.Timestamp
    available: bool
    unavailable_reasons: _containers.RepeatedScalarFieldContainer[str]
    concurrency: int
    def __init__(self, worker_id: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., task_types: _Optional[_Iterable[_Union[_types_pb2.TaskType, str]]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., available: _Optional[bool] = ..., unavailable_reasons: _Optional[_Iterable[str]] = ..., concurrency: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("worker_id", "hostname", "pid", "task_types", "resources", "concurrency")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    hostname: str
    pid: int
    task_types: _containers.RepeatedScalarFieldContainer[_types_pb2.TaskType]
    resources: Resources
    concurrency: int
    def __init__(self, worker_id: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., task_types: _Optional[_Iterable[_Union[_types_pb2.TaskType, str]]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., concurrency: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s", "worker_ttl_s")
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    WORKER_TTL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: int
    worker_ttl_s: int
    def __init__(self, heartbeat_interval_s: _Optional[int] = ..., worker_ttl_s: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "resources")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    resources: Resources
    def __init__(self, worker_id: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("available",)
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    available: bool
    def __init__(self, available: _Optional[bool] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("task_type", "available_only")
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_ONLY_FIELD_NUMBER: _ClassVar[int]
    task_type: _types_pb2.TaskType
    available_only: bool
    def __init__(self, task_type: _Optional[_Union[_types_pb2.TaskType, str]] = ..., available_only: _Optional[bool] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

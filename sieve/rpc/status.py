"""Rich error statuses: INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED with retry info, and their readers."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


def invalid_argument(field_name: str, description: str) -> status_pb2.Status:
    """INVALID_ARGUMENT with a BadRequest detail naming the field."""
    detail = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field=field_name, description=description)]
    )
    status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=f"{field_name}: {description}")
    status.details.add().Pack(detail)
    return status


def resource_exhausted(message: str, retry_after_s: float) -> status_pb2.Status:
    """RESOURCE_EXHAUSTED with a RetryInfo detail."""
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message)
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=_duration(retry_after_s)))
    return status


def plain_status(code: grpc.StatusCode, message: str) -> status_pb2.Status:
    return status_pb2.Status(code=code.value[0], message=message)


async def abort(context: grpc.aio.ServicerContext[Any, Any], status: status_pb2.Status) -> None:
    """Ends the RPC with a rich status (raises)."""
    await context.abort_with_status(rpc_status.to_status(status))


def retry_delay_of(error: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo delay (seconds) of a refused call, if it carries one."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]  # typed for grpc.Call; AioRpcError has its methods
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay_ms: int = info.retry_delay.ToMilliseconds()
            return delay_ms / 1000
    return None


def bad_fields_of(error: grpc.aio.AioRpcError) -> list[str]:
    """The fields named by a BadRequest detail of a refused call."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]  # typed for grpc.Call; AioRpcError has its methods
    fields: list[str] = []
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields += [v.field for v in bad.field_violations]
    return fields

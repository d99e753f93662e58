"""Requests that do not parse get INVALID_ARGUMENT naming the field, not grpc's UNKNOWN.

grpc.aio answers a request its deserializer cannot read with `UNKNOWN: Unexpected DecodeError`. A request
does not parse when its bytes are not protobuf wire format (a truncated length, a bad tag), or when a
`string` field is not valid UTF-8 (protobuf refuses it while parsing, so a lone surrogate or an invalid
byte sequence never reaches a servicer as text). `MalformedRequests`, the innermost server interceptor of
every service (`sieve.rpc.create_server`), gives each handler a deserializer that returns a `Malformed`
marker instead of raising, and ends the call on that marker with INVALID_ARGUMENT and a BadRequest detail:
the field is found by walking the wire bytes against the request's descriptor (`locate`), e.g.
`task.text: is not valid UTF-8`. For streaming requests the same holds for every message read
(`context.read()` or the request iterator), so a stream ends with INVALID_ARGUMENT at its first bad message.

Only the failure path does the extra work: a request that parses costs one isinstance check.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from sieve.observe.rpc_metrics import Behavior, wrap_handler

#: nesting deeper than this is reported as malformed without looking further
MAX_DEPTH = 64
#: the field name used when no single field is to blame (the bytes are not wire format)
WHOLE_REQUEST = "request"


@dataclass(frozen=True, slots=True)
class Malformed:
    """A request message that did not parse: the field to blame and why."""

    field: str
    description: str

    def status(self) -> status_pb2.Status:
        """INVALID_ARGUMENT with a BadRequest detail naming the field."""
        detail = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=self.field, description=self.description)
            ]
        )
        status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=f"{self.field}: {self.description}")
        status.details.add().Pack(detail)
        return status


class _Broken(Exception):
    """The wire bytes end early or hold an invalid tag."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Broken
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


_LENGTH_DELIMITED = frozenset({FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE})
_FIXED = {
    FieldDescriptor.TYPE_DOUBLE: 8,
    FieldDescriptor.TYPE_FIXED64: 8,
    FieldDescriptor.TYPE_SFIXED64: 8,
    FieldDescriptor.TYPE_FLOAT: 4,
    FieldDescriptor.TYPE_FIXED32: 4,
    FieldDescriptor.TYPE_SFIXED32: 4,
}


def _packed_ok(chunk: bytes, field_type: int) -> bool:
    """True when `chunk` is a well-formed packed run of `field_type` values (bytes are never packed)."""
    if field_type == FieldDescriptor.TYPE_BYTES:
        return True
    if field_type in _FIXED:
        return len(chunk) % _FIXED[field_type] == 0
    pos = 0
    try:
        while pos < len(chunk):
            _, pos = _varint(chunk, pos)
    except _Broken:
        return False
    return True


def _find(data: bytes, descriptor: Descriptor, path: str, depth: int) -> tuple[str, str] | None:
    """(field path, problem) of the first field that makes `data` unparsable as `descriptor`, or None."""
    if depth > MAX_DEPTH:
        return path or WHOLE_REQUEST, f"is nested deeper than {MAX_DEPTH} levels"
    seen: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        try:
            tag, pos = _varint(data, pos)
        except _Broken:
            return path or WHOLE_REQUEST, "is not protobuf wire format (truncated tag)"
        number, wire = tag >> 3, tag & 7
        field = descriptor.fields_by_number.get(number)
        name = _element_name(field, number, wire, seen)
        where = f"{path}.{name}" if path else name
        if number == 0:
            return path or WHOLE_REQUEST, "is not protobuf wire format (field number 0)"
        try:
            pos, problem = _step_over_value(data, pos, wire, field, where, depth)
        except _Broken:
            return where, "is not protobuf wire format (truncated)"
        if problem is not None:
            return problem
    return None


def _element_name(field: FieldDescriptor | None, number: int, wire: int, seen: dict[int, int]) -> str:
    """The name of one field occurrence in a path: `name`, `name[i]` for the i-th element of a repeated field
    that is not packed (counted in `seen`), `#n` for a field number the descriptor does not know."""
    if field is None:
        return f"#{number}"
    packed = wire == 2 and field.type not in _LENGTH_DELIMITED
    if field.label == FieldDescriptor.LABEL_REPEATED and not packed:
        index = seen.get(number, 0)
        seen[number] = index + 1
        return f"{field.name}[{index}]"
    return str(field.name)


def _step_over_value(
    data: bytes, pos: int, wire: int, field: FieldDescriptor | None, where: str, depth: int
) -> tuple[int, tuple[str, str] | None]:
    """Steps over the value of wire type `wire` at `pos`: (the position after it, the problem found in it or None).

    Raises _Broken when the value runs past the end of `data`."""
    if wire == 0:
        _, pos = _varint(data, pos)
        return pos, None
    if wire in (1, 5):
        pos += 8 if wire == 1 else 4
        if pos > len(data):
            raise _Broken
        return pos, None
    if wire == 2:
        length, pos = _varint(data, pos)
        if pos + length > len(data):
            raise _Broken
        chunk = data[pos : pos + length]
        return pos + length, (_chunk_problem(chunk, field, where, depth) if field is not None else None)
    # groups (3, 4) are not proto3; 6 and 7 do not exist
    return pos, (where, f"is not protobuf wire format (wire type {wire})")


def _chunk_problem(chunk: bytes, field: FieldDescriptor, where: str, depth: int) -> tuple[str, str] | None:
    """(field path, problem) of a length-delimited value of `field` that does not parse, or None."""
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            return where, "is not valid UTF-8"
        return None
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _find(chunk, field.message_type, where, depth + 1)
    if field.label == FieldDescriptor.LABEL_REPEATED and not _packed_ok(chunk, field.type):
        return where, "is not protobuf wire format (bad packed values)"
    return None


def locate(data: bytes, descriptor: Descriptor | None) -> Malformed:
    """Why `data` does not parse as `descriptor`, naming the field to blame."""
    found = _find(data, descriptor, "", 0) if descriptor is not None else None
    if found is None:
        name = descriptor.full_name if descriptor is not None else "the request type"
        return Malformed(WHOLE_REQUEST, f"does not parse as {name}")
    return Malformed(*found)


def _input_type(method: str, deserializer: Callable[[bytes], Any]) -> Descriptor | None:
    """The request descriptor of "/pkg.Service/Method" (from the default pool, else the deserializer's class)."""
    service, _, name = method.lstrip("/").partition("/")
    try:
        pool = descriptor_pool.Default()  # type: ignore[no-untyped-call]  # types-protobuf leaves it unannotated
        found: Descriptor = pool.FindServiceByName(service).FindMethodByName(name).input_type
        return found
    except (KeyError, AttributeError):
        owner = getattr(deserializer, "__self__", None)
        descriptor = getattr(owner, "DESCRIPTOR", None)
        return descriptor if isinstance(descriptor, Descriptor) else None


def lenient(deserializer: Callable[[bytes], Any], descriptor: Descriptor | None) -> Callable[[bytes], Any]:
    """`deserializer` returning a `Malformed` where it would raise DecodeError."""

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            return locate(data, descriptor)

    return deserialize


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], bad: Malformed) -> None:
    await context.abort_with_status(rpc_status.to_status(bad.status()))


class _CheckedContext:
    """The servicer's context, whose `read()` ends the call at a malformed message."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context

    async def read(self) -> Any:
        message = await self._context.read()
        if isinstance(message, Malformed):
            await _refuse(self._context, message)
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
    async for message in requests:
        if isinstance(message, Malformed):
            await _refuse(context, message)
        yield message


def _guard(behavior: Behavior, request_streaming: bool) -> Behavior:
    """`behavior` that first refuses a malformed request (or, for a stream, any malformed message)."""

    def inputs(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[Any, Any]:
        if request_streaming:
            return _checked(request, context), _CheckedContext(context)
        return request, context

    if inspect.isasyncgenfunction(behavior):

        async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if isinstance(request, Malformed):
                await _refuse(context, request)
            async for response in behavior(*inputs(request, context)):
                yield response

        return streaming

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Malformed):
            await _refuse(context, request)
        result = behavior(*inputs(request, context))
        return await result if inspect.isawaitable(result) else result

    return unary


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class MalformedRequests(grpc.aio.ServerInterceptor):
    """Answers requests that do not parse with INVALID_ARGUMENT naming the field (install it innermost)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, _Resp] | None:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        deserialize = lenient(handler.request_deserializer, _input_type(method, handler.request_deserializer))
        streaming = handler.request_streaming
        return wrap_handler(handler, lambda behavior, _: _guard(behavior, streaming), request_deserializer=deserialize)


__all__ = ["Malformed", "MalformedRequests", "lenient", "locate"]

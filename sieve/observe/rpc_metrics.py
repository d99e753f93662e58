"""A server interceptor that counts every RPC by method and status code and times it.

Installed by `rpc.create_server` on every service. Labels are the full method name (a fixed set: unknown
methods never reach a handler) and the status code name; nothing per caller, device or task.
`on_done(method, code)`, when given, is told the outcome of each call (the intake counts its rejections).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from sieve.observe import metrics

Behavior = Callable[..., Any]
OnDone = Callable[[str, str], None]

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def code_name(context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None) -> str:
    """The status the call ended with: the one set on the context, else OK, or UNKNOWN for an error."""
    code: Any = None
    try:
        code = context.code()
    except Exception:  # an older grpc without ServicerContext.code()
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int) and code in _CODE_NAMES:
        return _CODE_NAMES[code]
    if error is None:
        return "OK"
    return "CANCELLED" if isinstance(error, BaseException) and not isinstance(error, Exception) else "UNKNOWN"


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


def wrap_handler(
    handler: grpc.RpcMethodHandler[_Req, _Resp],
    wrap: Callable[[Behavior, bool], Behavior],
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler[Any, _Resp]:
    """The same handler with its behaviour wrapped (`wrap(behavior, response_streaming)`), and with
    `request_deserializer` instead of its own when one is given."""
    behavior: Behavior | None
    if handler.request_streaming and handler.response_streaming:
        behavior, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        behavior, factory = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        behavior, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        behavior, factory = handler.unary_unary, grpc.unary_unary_rpc_method_handler
    if behavior is None:  # grpc sets the attribute the streaming flags name
        raise TypeError(f"a method handler without the behaviour its streaming flags name: {handler!r}")
    deserializer = handler.request_deserializer if request_deserializer is None else request_deserializer
    return factory(
        wrap(behavior, handler.response_streaming),
        request_deserializer=deserializer,
        response_serializer=handler.response_serializer,
    )


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times each RPC (sieve_grpc_server_handled_total, sieve_grpc_server_handling_seconds)."""

    def __init__(self, on_done: OnDone | None = None) -> None:
        self.on_done = on_done

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, _Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if isinstance(method, bytes):
            method = method.decode()
        return wrap_handler(handler, lambda behavior, streaming: self._wrap(str(method), behavior, streaming))

    def _after(
        self, method: str, began: float, context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None
    ) -> None:
        code = code_name(context, error)
        metrics.RPC_HANDLED.labels(method, code).inc()
        metrics.RPC_SECONDS.labels(method).observe(time.perf_counter() - began)
        if self.on_done is not None:
            self.on_done(method, code)

    def _wrap(self, method: str, behavior: Behavior, response_streaming: bool) -> Behavior:
        if response_streaming and inspect.isasyncgenfunction(behavior):

            async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                began, error = time.perf_counter(), None
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    self._after(method, began, context, error)

            return streaming

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            began, error = time.perf_counter(), None
            try:
                return await behavior(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._after(method, began, context, error)

        return unary


__all__ = ["RpcMetricsInterceptor", "code_name", "wrap_handler"]

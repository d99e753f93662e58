"""Counts Submit / SubmitBatch calls refused before admission: bad input, no valid token, storage away.

Admission refusals (global / device limit) are counted per task where they are decided (`tracing.count_decisions`); this
small interceptor, placed before the auth interceptor, counts the calls that end INVALID_ARGUMENT,
UNAUTHENTICATED or UNAVAILABLE under `sieve_submit_rejections_total{reason}`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from sieve.observe import metrics
from sieve.observe.rpc_metrics import code_name, wrap_handler

_SUBMITS = ("/sieve.v1.IntakeService/Submit", "/sieve.v1.IntakeService/SubmitBatch")
_REASONS = {"INVALID_ARGUMENT": "invalid_argument", "UNAUTHENTICATED": "unauthenticated", "UNAVAILABLE": "unavailable"}


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class RejectionCounter(grpc.aio.ServerInterceptor):
    """Counts refused Submit / SubmitBatch calls by reason."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method not in _SUBMITS:
            return handler

        def wrap(behavior: Callable[..., Awaitable[object]], _streaming: bool) -> Callable[..., Awaitable[object]]:
            async def counted(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> object:
                error: BaseException | None = None
                try:
                    return await behavior(request, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    reason = _REASONS.get(code_name(context, error))
                    if reason:
                        metrics.REJECTIONS.labels(reason).inc()

            return counted

        return wrap_handler(handler, wrap)


__all__ = ["RejectionCounter"]

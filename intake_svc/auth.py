"""Caller authentication: a bearer token in the `authorization` metadata names the caller.

With no SIEVE_API_KEYS configured every caller is "anonymous". Health checks and reflection are open.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

ANONYMOUS = "anonymous"
_OPEN_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")

#: the authenticated caller of the RPC being served
current_caller: contextvars.ContextVar[str] = contextvars.ContextVar("sieve_caller", default=ANONYMOUS)


def _deny(message: str) -> grpc.RpcMethodHandler:
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(deny)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without a known token (UNAUTHENTICATED) and records the caller for the servicer."""

    def __init__(self, callers_by_token: dict[str, str]) -> None:
        self.callers_by_token = callers_by_token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if not self.callers_by_token or handler_call_details.method.startswith(_OPEN_PREFIXES):
            current_caller.set(ANONYMOUS)
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        header = metadata.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return _deny("missing 'authorization: Bearer <token>' metadata")
        caller = self.callers_by_token.get(token.strip())
        if caller is None:
            return _deny("unknown token")
        current_caller.set(caller)
        return await continuation(handler_call_details)

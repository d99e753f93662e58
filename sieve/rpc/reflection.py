"""Server reflection that also answers for method names, so that `grpcurl describe pkg.Service.Method` works.

The stock servicer asks the descriptor pool for the file containing a symbol; protobuf's upb pool knows
services and messages but not methods ("Service.Method"), so grpcurl's `describe` of a method got
"Symbol not found". This servicer answers such a symbol with the file of its service.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer as _AioReflectionServicer


class ReflectionServicer(_AioReflectionServicer):
    """grpc.aio reflection; a method's symbol resolves to its service's file.

    It overrides grpc_reflection's private `_file_containing_symbol` and reads its `_pool`, which the
    types-grpcio-reflection stubs do not declare: hence the narrow `attr-defined` / `misc` ignores.
    """

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        try:
            self._pool.FindFileContainingSymbol(fully_qualified_name)  # type: ignore[attr-defined]
        except KeyError:
            service_name, _, method = fully_qualified_name.rpartition(".")
            try:
                service = self._pool.FindServiceByName(service_name)  # type: ignore[attr-defined]
            except KeyError:
                service = None
            if service is not None and method in service.methods_by_name:
                return super()._file_containing_symbol(request, service_name)  # type: ignore[misc]
        return super()._file_containing_symbol(request, fully_qualified_name)  # type: ignore[misc]


def enable_server_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Like grpc_reflection's, for a grpc.aio server (SERVICE_NAME is added by the caller)."""
    servicer = ReflectionServicer(list(service_names))
    # generated code, left unannotated by the stubs
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


SERVICE_NAME = reflection.SERVICE_NAME

__all__ = ["SERVICE_NAME", "ReflectionServicer", "enable_server_reflection"]

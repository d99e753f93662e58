"""The server shape every service shares: build, start, serve until SIGTERM, stop in order.

Every service's `server.py` calls `create_server` with its servicers and `serve` to run until SIGTERM:
health checking (stock HealthServicer) is always on, reflection when `SIEVE_GRPC_REFLECTION` is, and so is
JobsService (sieve/rpc/jobs.py: ListJobs / RunJob over the service's periodic `jobs`, sieve/jobs.py, which run
with its background loops); every call passes `auth.AuthInterceptor` (credentials and roles); TLS (or mTLS)
when certificates are configured.
Shutdown is ordered: health NOT_SERVING, the service's own `before_stop` (stop taking work, drain),
`server.stop(grace)`, then the background loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sieve.jobs import Jobs
from sieve.observe import telemetry
from sieve.observe.rpc_metrics import RpcMetricsInterceptor
from sieve.rpc import auth
from sieve.rpc import reflection as method_reflection
from sieve.rpc.audit import AuditInterceptor, AuditSink, LogSink
from sieve.rpc.channel import channel_options, server_credentials
from sieve.rpc.jobs import JOBS_SERVICE_NAME, JobsServicer
from sieve.rpc.malformed import MalformedRequests
from sieve.settings import Settings
from sieve.v1 import jobs_pb2_grpc

log = logging.getLogger("sieve.rpc")

Registrar = Callable[[grpc.aio.Server], None]


@dataclass
class Service:
    """What a service puts into the shared server shape."""

    name: str
    #: full names of the gRPC services (for health and reflection)
    service_names: Sequence[str]
    register: Registrar
    #: the service's own interceptors, outside authentication (they see refused calls too)
    interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
    #: where the audit trail of operator calls goes (sieve/rpc/audit.py); None: log lines only
    audit: AuditSink | None = None
    #: runs after health says NOT_SERVING and before the server stops (drain work here)
    before_stop: Callable[[], Awaitable[None]] | None = None
    #: background loops started with the server and cancelled at shutdown (after before_stop)
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    #: the service's periodic jobs (sieve/jobs.py): run with the background loops, shown and run by JobsService
    jobs: Jobs = field(default_factory=Jobs)

    def loops(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """What runs beside the RPCs: the background loops, then the periodic jobs."""
        return [*self.background, self.jobs.run]


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service: Service
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        """Health of every service name of this server (and the server as a whole, ""): SERVING or NOT_SERVING."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in (*self.service.service_names, ""):
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """Ordered, bounded shutdown: NOT_SERVING, drain, stop RPCs, end background loops."""
        await self.set_serving(False)
        if self.service.before_stop is not None:
            try:
                await asyncio.wait_for(self.service.before_stop(), timeout=grace_s)
            except TimeoutError:
                log.warning("%s: drain did not finish within %.1fs", self.service.name, grace_s)
        await self.server.stop(grace_s)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def create_server(service: Service, address: str, settings: Settings, *, serving: bool = True) -> RunningServer:
    """Builds and starts a server for `service` on `address` (port 0 picks one); returns it with its port.
    Health says SERVING at once, or NOT_SERVING with `serving=False` (sieve.rpc.readiness flips it later)."""
    authenticator = auth.load_authenticator(settings.auth_tokens, settings.auth_tokens_file)
    # a server with no service of its own (a worker's: health and JobsService) may start without credentials; then
    # it refuses every JobsService call (no credential matches), unless anonymous callers are allowed
    if service.service_names:
        auth.require_credentials(authenticator, settings.allow_anonymous, service.name)
    guard = auth.AuthInterceptor(
        authenticator, allow_anonymous=settings.allow_anonymous, reflection=settings.grpc_reflection
    )
    # the audit interceptor runs just before the guard: it sees the principal the guard sets, or its refusal
    audit = AuditInterceptor(service.audit or LogSink(), authenticator)
    # the service's own interceptors stand outside authentication (they see every call, refused ones included);
    # innermost: a request that does not parse is INVALID_ARGUMENT naming the field, not UNKNOWN
    interceptors = [
        *telemetry.server_interceptors(),
        RpcMetricsInterceptor(),
        *service.interceptors,
        audit,
        guard,
        MalformedRequests(),
    ]
    # no SO_REUSEPORT: a second server on a taken port must fail to bind, not silently share its connections
    server = grpc.aio.server(interceptors=interceptors, options=[*channel_options(settings), ("grpc.so_reuseport", 0)])
    service.register(server)
    # every server answers for its periodic jobs (the service's, read per call: readiness swaps in the built ones)
    jobs_pb2_grpc.add_JobsServiceServicer_to_server(JobsServicer(service.name, lambda: service.jobs), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if settings.grpc_reflection:
        method_reflection.enable_server_reflection(
            [
                *service.service_names,
                JOBS_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
    credentials = server_credentials(settings)
    port = server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"{service.name}: cannot bind {address}")
    await server.start()
    running = RunningServer(server, port, health_servicer, service)
    await running.set_serving(serving)
    running.tasks = [asyncio.create_task(loop(), name=f"{service.name}-bg") for loop in service.loops()]
    log.info("%s listening on port %d", service.name, port)
    return running


async def serve(running: RunningServer, settings: Settings, *, stop: asyncio.Event | None = None) -> None:
    """Runs until SIGTERM or SIGINT (or `stop` is set), then shuts down in order within the grace period."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(running.server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    log.info("%s shutting down", running.service.name)
    await running.stop(settings.shutdown_grace_s)
    stopper.cancel()
    waiter.cancel()


def run_main(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Runs a service's main coroutine, then flushes its telemetry. (uvloop was measured side by side
    with grpc.aio here and made no difference, so the standard loop it is.)"""
    try:
        asyncio.run(main())
    finally:
        telemetry.shutdown_telemetry()  # the spans of the drained work still go out

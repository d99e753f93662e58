"""gRPC plumbing every service shares: the server shape, rich error statuses, client channels.

Every service's `server.py` calls `create_server` with its servicers and `serve` to run until SIGTERM:
health checking (stock HealthServicer) is always on, reflection when `SIEVE_GRPC_REFLECTION` is; every call
passes `auth.AuthInterceptor` (credentials and roles); TLS (or mTLS) when certificates are configured. Clients
use `channel` (TLS when a CA is configured, the process's bearer token on every call). Shutdown is ordered:
health NOT_SERVING, the service's own `before_stop` (stop taking work, drain), `server.stop(grace)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from sieve import auth, telemetry
from sieve import reflection as method_reflection
from sieve.audit import AuditInterceptor, AuditSink, LogSink
from sieve.malformed import MalformedRequests
from sieve.rpc_metrics import RpcMetricsInterceptor
from sieve.settings import Settings, SettingsError

log = logging.getLogger("sieve.rpc")

Registrar = Callable[[grpc.aio.Server], None]


def channel_options(settings: Settings) -> list[tuple[str, int]]:
    """Message limits and keepalives shared by servers and clients (a dead peer is noticed in seconds)."""
    return [
        ("grpc.max_send_message_length", settings.grpc_max_message_bytes),
        ("grpc.max_receive_message_length", settings.grpc_max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ]


def _read_bytes(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SettingsError(f"{setting}={path}: cannot read it: {exc.strerror}") from None


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials of a server (None: plaintext), requiring client certificates when tls_client_auth."""
    if not settings.tls_cert_file:
        return None
    pair = (_read_bytes(settings.tls_key_file, "SIEVE_TLS_KEY_FILE"),
            _read_bytes(settings.tls_cert_file, "SIEVE_TLS_CERT_FILE"))
    ca = _read_bytes(settings.tls_ca_file, "SIEVE_TLS_CA_FILE") if settings.tls_client_auth else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=settings.tls_client_auth)


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """TLS credentials of a client (None: plaintext): the CA to verify servers by, and this process's
    certificate for servers that require one."""
    if not settings.tls_ca_file:
        return None
    ca = _read_bytes(settings.tls_ca_file, "SIEVE_TLS_CA_FILE")
    if settings.tls_cert_file:
        return grpc.ssl_channel_credentials(ca, _read_bytes(settings.tls_key_file, "SIEVE_TLS_KEY_FILE"),
                                            _read_bytes(settings.tls_cert_file, "SIEVE_TLS_CERT_FILE"))
    return grpc.ssl_channel_credentials(ca)


def channel(address: str, settings: Settings,
            extra_options: Sequence[tuple[str, int | str]] = ()) -> grpc.aio.Channel:
    """A client channel to a Sieve service: TLS when a CA is configured, this process's bearer token on every
    call, tracing interceptors when tracing is on."""
    options: list[tuple[str, int | str]] = [*channel_options(settings), *extra_options]
    if settings.tls_server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
    interceptors = [*auth.bearer_interceptors(auth.client_token(settings.auth_token, settings.auth_token_file)),
                    *telemetry.client_interceptors()]
    credentials = channel_credentials(settings)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


@dataclass
class Service:
    """What a service puts into the shared server shape."""

    name: str
    #: full names of the gRPC services (for health and reflection)
    service_names: Sequence[str]
    register: Registrar
    #: the service's own interceptors, outside authentication (they see refused calls too)
    interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
    #: where the audit trail of operator calls goes (sieve/audit.py); None: log lines only
    audit: AuditSink | None = None
    #: runs after health says NOT_SERVING and before the server stops (drain work here)
    before_stop: Callable[[], Awaitable[None]] | None = None
    #: background loops started with the server and cancelled at shutdown (after before_stop)
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


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


async def create_server(service: Service, address: str, settings: Settings, *,
                        serving: bool = True) -> RunningServer:
    """Builds and starts a server for `service` on `address` (port 0 picks one); returns it with its port.
    Health says SERVING at once, or NOT_SERVING with `serving=False` (sieve.readiness flips it later)."""
    authenticator = auth.load_authenticator(settings.auth_tokens, settings.auth_tokens_file)
    if service.service_names:  # a health-only server (a worker's) has no RPC that needs a credential
        auth.require_credentials(authenticator, settings.allow_anonymous, service.name)
    guard = auth.AuthInterceptor(authenticator, allow_anonymous=settings.allow_anonymous,
                                 reflection=settings.grpc_reflection)
    # the audit interceptor runs just before the guard: it sees the principal the guard sets, or its refusal
    audit = AuditInterceptor(service.audit or LogSink(), authenticator)
    # the service's own interceptors stand outside authentication (they see every call, refused ones included);
    # innermost: a request that does not parse is INVALID_ARGUMENT naming the field, not UNKNOWN
    interceptors = [*telemetry.server_interceptors(), RpcMetricsInterceptor(), *service.interceptors, audit, guard,
                    MalformedRequests()]
    # no SO_REUSEPORT: a second server on a taken port must fail to bind, not silently share its connections
    server = grpc.aio.server(interceptors=interceptors, options=[*channel_options(settings), ("grpc.so_reuseport", 0)])
    service.register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if settings.grpc_reflection:
        method_reflection.enable_server_reflection(
            [*service.service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME], server)
    credentials = server_credentials(settings)
    port = (server.add_insecure_port(address) if credentials is None
            else server.add_secure_port(address, credentials))
    if port == 0:
        raise OSError(f"{service.name}: cannot bind {address}")
    await server.start()
    running = RunningServer(server, port, health_servicer, service)
    await running.set_serving(serving)
    running.tasks = [asyncio.create_task(loop(), name=f"{service.name}-bg") for loop in service.background]
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


def run_main(main: Callable[[], Awaitable[None]]) -> None:
    """Runs a service's main coroutine, then flushes its telemetry. (uvloop was measured side by side
    with grpc.aio here and made no difference, so the standard loop it is.)"""
    try:
        asyncio.run(main())
    finally:
        telemetry.shutdown_telemetry()  # the spans of the drained work still go out


# --- rich errors -----------------------------------------------------------------------------------
def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


def invalid_argument(field_name: str, description: str) -> status_pb2.Status:
    """INVALID_ARGUMENT with a BadRequest detail naming the field."""
    detail = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field=field_name,
                                                                      description=description)])
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


async def abort(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> None:
    """Ends the RPC with a rich status (raises)."""
    await context.abort_with_status(rpc_status.to_status(status))


def retry_delay_of(error: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo delay (seconds) of a refused call, if it carries one."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToMilliseconds() / 1000
    return None


def bad_fields_of(error: grpc.aio.AioRpcError) -> list[str]:
    """The fields named by a BadRequest detail of a refused call."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    fields: list[str] = []
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields += [v.field for v in bad.field_violations]
    return fields



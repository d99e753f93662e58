"""The CLI's connections to the services, and what their errors mean to the person at the terminal.

`Client` opens one channel per service as it is first used (TLS when a CA is configured, the bearer token on
every call) and turns every gRPC error into a `CliError`: a message that names the service and its address,
without a traceback, and the exit code of its kind (`ExitCode`).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from sieve.cli.config import CliConfig, ConfigError, Role
from sieve.v1 import intake_pb2_grpc, jobs_pb2_grpc, lexicon_pb2_grpc, registry_pb2_grpc, scheduler_pb2_grpc

T = TypeVar("T")

#: large enough for a batch of images, as the servers' own limit (SIEVE_GRPC_MAX_MESSAGE_BYTES, 16 MiB)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class ExitCode(enum.IntEnum):
    """How `sieve` ends: scripts tell the kinds of failure apart by these."""

    OK = 0
    #: anything else (a refusal the other codes do not cover, a task that failed, a server error)
    ERROR = 1
    #: the command line, the configuration or a request was wrong (INVALID_ARGUMENT, OUT_OF_RANGE)
    USAGE = 2
    #: no such task, device or dead letter (NOT_FOUND)
    NOT_FOUND = 3
    #: no valid token, or not allowed (UNAUTHENTICATED, PERMISSION_DENIED)
    AUTH = 4
    #: the service cannot be reached or did not answer in time (UNAVAILABLE, DEADLINE_EXCEEDED)
    UNAVAILABLE = 5


class CliError(Exception):
    """A failure to report in one line and end with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.ERROR, status: str = "", details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        #: of a failed call: the gRPC status name ("INVALID_ARGUMENT") and the server's message
        self.status = status
        self.details = details


_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: (ExitCode.USAGE, "refused"),
    grpc.StatusCode.OUT_OF_RANGE: (ExitCode.USAGE, "out of range"),
    grpc.StatusCode.NOT_FOUND: (ExitCode.NOT_FOUND, "not found"),
    grpc.StatusCode.UNAUTHENTICATED: (ExitCode.AUTH, "authentication failed"),
    grpc.StatusCode.PERMISSION_DENIED: (ExitCode.AUTH, "permission denied"),
    grpc.StatusCode.UNAVAILABLE: (ExitCode.UNAVAILABLE, "unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (ExitCode.UNAVAILABLE, "no answer in time"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (ExitCode.ERROR, "over a limit, try again later"),
    grpc.StatusCode.FAILED_PRECONDITION: (ExitCode.ERROR, "not possible now"),
    grpc.StatusCode.ALREADY_EXISTS: (ExitCode.ERROR, "already exists"),
    grpc.StatusCode.UNIMPLEMENTED: (ExitCode.ERROR, "not offered by this server"),
    grpc.StatusCode.CANCELLED: (ExitCode.ERROR, "cancelled"),
}

_HINTS = {
    ExitCode.AUTH: " (give a token with --token, SIEVE_AUTH_TOKEN or the config file's `token`)",
    ExitCode.UNAVAILABLE: " (is it running there? its address: a flag, SIEVE_*_ADDR or the config file)",
}


def error_of(exc: grpc.aio.AioRpcError, service: str, address: str) -> CliError:
    """The CliError of a failed call to `service` at `address`."""
    code, what = _CODES.get(exc.code(), (ExitCode.ERROR, exc.code().name.lower().replace("_", " ")))
    details = (exc.details() or "").strip()
    if code is ExitCode.UNAVAILABLE:
        details = details.splitlines()[0] if details else ""
    hint = "" if exc.code() is grpc.StatusCode.PERMISSION_DENIED else _HINTS.get(code, "")
    return CliError(f"{service} at {address}: {what}: {details}{hint}", code, exc.code().name, details)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it: {exc.strerror}") from None


def channel_credentials(config: CliConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials (None: plaintext): the CA, and this client's certificate and key when both are given."""
    if not config.tls_ca:
        if config.tls_cert or config.tls_key:
            raise ConfigError("--tls-cert / --tls-key need --tls-ca (the CA that signed the servers' certificates)")
        return None
    ca = _read(config.tls_ca, "TLS CA file")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together (this client's certificate and its key)")
    if config.tls_cert:
        return grpc.ssl_channel_credentials(
            ca, _read(config.tls_key, "TLS key file"), _read(config.tls_cert, "TLS certificate file")
        )
    return grpc.ssl_channel_credentials(ca)


class Client:
    """Channels to the intake, scheduler and registry of one command, closed with it (`async with`)."""

    def __init__(self, config: CliConfig, role: Role) -> None:
        self.config = config
        token = config.token_for(role)
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._credentials = channel_credentials(config)
        self._channels: dict[str, grpc.aio.Channel] = {}
        #: services reached at an address of their own (a worker's, for its periodic jobs): name -> address
        self._addresses: dict[str, str] = {}

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for channel in self._channels.values():
            await channel.close()

    def address(self, service: str) -> str:
        if service in self._addresses:
            return self._addresses[service]
        return str(getattr(self.config, service))

    def reach(self, service: str, address: str) -> None:
        """Calls to `service` go to `address` (one this command was given: a worker's health address)."""
        self._addresses[service] = address

    def _channel(self, service: str) -> grpc.aio.Channel:
        if service not in self._channels:
            address = self.address(service)
            options: list[tuple[str, Any]] = [
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.enable_retries", 0),
            ]
            if self.config.tls_server_name:
                options.append(("grpc.ssl_target_name_override", self.config.tls_server_name))
            if self._credentials is None:
                self._channels[service] = grpc.aio.insecure_channel(address, options=options)
            else:
                self._channels[service] = grpc.aio.secure_channel(address, self._credentials, options=options)
        return self._channels[service]

    def intake(self) -> intake_pb2_grpc.IntakeServiceStub:
        return intake_pb2_grpc.IntakeServiceStub(self._channel("intake"))

    def scheduler(self) -> scheduler_pb2_grpc.SchedulerServiceStub:
        return scheduler_pb2_grpc.SchedulerServiceStub(self._channel("scheduler"))

    def registry(self) -> registry_pb2_grpc.RegistryServiceStub:
        return registry_pb2_grpc.RegistryServiceStub(self._channel("registry"))

    def lexicon(self) -> lexicon_pb2_grpc.LexiconServiceStub:
        """LexiconService, which the intake serves."""
        return lexicon_pb2_grpc.LexiconServiceStub(self._channel("intake"))

    def jobs(self, service: str) -> jobs_pb2_grpc.JobsServiceStub:
        """JobsService of `service` (every Sieve server hosts one)."""
        return jobs_pb2_grpc.JobsServiceStub(self._channel(service))

    def options(self, timeout: bool = True) -> dict[str, Any]:
        """The keyword arguments of every call: the token, and the deadline of a unary call."""
        return {"metadata": self.metadata, **({"timeout": self.config.timeout_s} if timeout else {})}

    async def call(self, service: str, pending: Awaitable[T]) -> T:
        """The answer of a unary call to `service`, or its CliError."""
        try:
            return await pending
        except grpc.aio.AioRpcError as exc:
            raise error_of(exc, service, self.address(service)) from None

    async def stream(self, service: str, call: AsyncIterator[T]) -> AsyncIterator[T]:
        """The messages of a server stream from `service`; its failure as a CliError."""
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise error_of(exc, service, self.address(service)) from None


__all__ = ["MAX_MESSAGE_BYTES", "CliError", "Client", "ExitCode", "channel_credentials", "error_of"]

"""Who is calling, and what that caller may do: credentials, roles and the server/client interceptors.

Every RPC of every service needs a credential, except health checks (and reflection where it is on):

- **Credentials** are bearer tokens, sent as `authorization: Bearer <token>` metadata. The services store only
  their SHA-256 hashes, one entry per token: `name:role:sha256hex` (the format is `sieve.credentials`', whose
  names this module re-exports). A name may have several entries (several tokens, so that a new one can be
  rolled out before the old one is removed). A presented token is hashed and compared with every stored hash
  in constant time.
- **Roles**: `client` (submits, reads and cancels its own tasks), `worker` (Pull, Register, Heartbeat, as the
  worker its credential names), `operator` (dead letters, watermark, workers, audit, periodic jobs, the lexicon, every
  cross-tenant read; also every client RPC). `METHOD_ROLES` lists, for every method of every Sieve service, the
  roles allowed to call it; a method missing from it is refused to everyone (a new RPC must be given its roles).
- **Anonymous**: with `SIEVE_ALLOW_ANONYMOUS=true` a call without a credential is served as the anonymous
  principal, which holds every role (a local run, a test). A credential that is presented is still checked.
  Without that switch a service does not start when it has no credentials (`require_credentials`).

The server side is `AuthInterceptor` (UNAUTHENTICATED without a valid credential, PERMISSION_DENIED for a role
that may not call the method; the principal of the call in `current_principal`). The client side is
`bearer_interceptors`, client interceptors adding this process's token (`SIEVE_AUTH_TOKEN` or
`SIEVE_AUTH_TOKEN_FILE`) to every call.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from sieve.credentials import (
    AuthError,
    Credential,
    Role,
    credential_line,
    hash_token,
    new_token,
    parse_credentials,
)
from sieve.v1 import intake_pb2, jobs_pb2, lexicon_pb2, registry_pb2, scheduler_pb2

log = logging.getLogger("sieve.rpc.auth")


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller of one RPC."""

    name: str
    roles: frozenset[Role]
    #: true for the anonymous principal of `SIEVE_ALLOW_ANONYMOUS=true` (holds every role)
    anonymous: bool = False

    @property
    def is_operator(self) -> bool:
        return Role.OPERATOR in self.roles

    def may_act_as_worker(self, worker_id: str) -> bool:
        """A worker credential named N runs as worker id N or any id under "N/" ("cpu-pool/host:pid")."""
        if self.anonymous:
            return True
        return Role.WORKER in self.roles and (worker_id == self.name or worker_id.startswith(self.name + "/"))

    def owns(self, caller: str) -> bool:
        """True when this principal may see a task submitted by `caller` (its own, or any as operator)."""
        return self.is_operator or caller == self.name


ANONYMOUS = Principal("anonymous", frozenset(Role), anonymous=True)

#: the principal of the RPC being served (set by AuthInterceptor)
current_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar("sieve_principal", default=ANONYMOUS)

#: re-checks the credential of the RPC being served against the credentials as they are now (set by
#: AuthInterceptor): a long-lived stream (Pull) asks it again and ends when its token was revoked
current_credential_valid: contextvars.ContextVar[Callable[[], bool]] = contextvars.ContextVar(
    "sieve_credential_valid", default=lambda: True
)

#: peer address of the RPC being served, for the audit log
current_peer: contextvars.ContextVar[str] = contextvars.ContextVar("sieve_peer", default="")


# --- which roles may call what -----------------------------------------------------------------------
_CLIENT = frozenset({Role.CLIENT, Role.OPERATOR})
_WORKER = frozenset({Role.WORKER})
_OPERATOR = frozenset({Role.OPERATOR})


def _methods(service: Any, roles: frozenset[Role], **exceptions: frozenset[Role]) -> dict[str, frozenset[Role]]:
    return {f"/{service.full_name}/{m.name}": exceptions.get(m.name, roles) for m in service.methods}


#: every method of every Sieve service -> the roles that may call it
METHOD_ROLES: dict[str, frozenset[Role]] = {
    **_methods(
        intake_pb2.DESCRIPTOR.services_by_name["IntakeService"],
        _CLIENT,
        AssignDevice=_OPERATOR,
        GetDeviceOwner=_OPERATOR,
    ),
    **_methods(scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"], _OPERATOR, Pull=_WORKER),
    **_methods(registry_pb2.DESCRIPTOR.services_by_name["RegistryService"], _WORKER, ListWorkers=_OPERATOR),
    # every server's periodic jobs (sieve/rpc/jobs.py): seeing and running them is an operator's action
    **_methods(jobs_pb2.DESCRIPTOR.services_by_name["JobsService"], _OPERATOR),
    # the lexicon (served by the intake: intake_svc/lexicon.py): reading and changing it is an operator's action
    **_methods(lexicon_pb2.DESCRIPTOR.services_by_name["LexiconService"], _OPERATOR),
}

#: methods that need no credential: health checks always, reflection when it is on
HEALTH_PREFIX = "/grpc.health.v1."
REFLECTION_PREFIXES = ("/grpc.reflection.v1alpha.", "/grpc.reflection.v1.")


def is_operator_only(method: str) -> bool:
    """Methods only operators may call (every call of one is an operator action, written to the audit log)."""
    return METHOD_ROLES.get(method) == _OPERATOR


def register_methods(roles: dict[str, frozenset[Role]]) -> None:
    """Adds methods of a further service to METHOD_ROLES (a service's own module calls it at import)."""
    METHOD_ROLES.update(roles)


def methods_of(service: Any, roles: Iterable[Role], **exceptions: Iterable[Role]) -> dict[str, frozenset[Role]]:
    """`{"/pkg.Service/Method": roles}` for every method of a service descriptor (with per-method exceptions)."""
    return _methods(service, frozenset(roles), **{k: frozenset(v) for k, v in exceptions.items()})


# --- matching presented tokens ------------------------------------------------------------------------
class Authenticator:
    """The credentials one service accepts; `principal` maps a presented token to its caller.

    Credentials from a file are re-read when the file changes (its mtime and size are looked at no more than
    once a second, and at once when an unknown token arrives, at most 20 times a second): adding a token,
    or removing a revoked one, needs no restart.
    """

    RECHECK_S = 1.0
    MISS_RECHECK_S = 0.05

    def __init__(self, credentials: Sequence[Credential], *, inline: Sequence[Credential] = (), path: str = "") -> None:
        self._inline = list(inline)
        self._credentials = [*self._inline, *credentials]
        self._path = path
        self._stamp: tuple[int, int] | None = self._file_stamp() if path else None
        self._checked = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._credentials) or bool(self._path)

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _refresh(self, miss: bool) -> bool:
        """Re-reads the file when it changed; True when the credentials changed."""
        now = time.monotonic()
        if not self._path or now - self._checked < (self.MISS_RECHECK_S if miss else self.RECHECK_S):
            return False
        self._checked = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        try:
            fresh = parse_credentials(Path(self._path).read_text(), "SIEVE_AUTH_TOKENS_FILE")
        except (OSError, AuthError) as exc:  # keep what was read last; a half-written file is read again later
            log.warning("credentials file %s not reloaded: %s", self._path, exc)
            return False
        self._stamp = stamp
        self._credentials = [*self._inline, *fresh]
        log.info("credentials file %s reloaded: %d entries", self._path, len(fresh))
        return True

    def _match(self, digest: bytes) -> Principal | None:
        name: str | None = None
        roles: set[Role] = set()
        for cred in self._credentials:  # every entry, compared in constant time
            if hmac.compare_digest(cred.sha256, digest):
                name = cred.name
                roles.add(cred.role)
        return None if name is None else Principal(name, frozenset(roles))

    def principal(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode(errors="surrogatepass")).digest()
        self._refresh(miss=False)
        found = self._match(digest)
        if found is None and self._refresh(miss=True):
            found = self._match(digest)
        return found


def _read(path: str, setting: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise AuthError(f"{setting}={path}: cannot read it: {exc.strerror}") from None


def load_authenticator(tokens: str, tokens_file: str) -> Authenticator:
    """Credentials from `SIEVE_AUTH_TOKENS` and the file named by `SIEVE_AUTH_TOKENS_FILE` (both may be set)."""
    inline = parse_credentials(tokens, "SIEVE_AUTH_TOKENS")
    from_file: list[Credential] = []
    if tokens_file:
        from_file = parse_credentials(_read(tokens_file, "SIEVE_AUTH_TOKENS_FILE"), "SIEVE_AUTH_TOKENS_FILE")
    return Authenticator(from_file, inline=inline, path=tokens_file)


def client_token(token: str, token_file: str) -> str:
    """The token this process sends (`SIEVE_AUTH_TOKEN`, else the first line of `SIEVE_AUTH_TOKEN_FILE`)."""
    if token:
        return token.strip()
    if token_file:
        lines = _read(token_file, "SIEVE_AUTH_TOKEN_FILE").split()
        return lines[0] if lines else ""
    return ""


def require_credentials(authenticator: Authenticator, allow_anonymous: bool, service: str) -> None:
    """A server without credentials starts only with SIEVE_ALLOW_ANONYMOUS=true."""
    if not authenticator and not allow_anonymous:
        raise AuthError(
            f"{service}: no credentials configured (SIEVE_AUTH_TOKENS or SIEVE_AUTH_TOKENS_FILE); "
            "set SIEVE_ALLOW_ANONYMOUS=true to run without authentication"
        )


# --- server side ---------------------------------------------------------------------------------------
def refusing_handler(
    code: grpc.StatusCode, message: str | Callable[[], str], streaming_request: bool, streaming_response: bool
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the given shape that ends every call with `code` and `message` (a callable: read per call)."""

    def text() -> str:
        return message() if callable(message) else message

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, text())

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await context.abort(code, text())
        yield  # pragma: no cover  (makes this an async generator)

    if streaming_request and streaming_response:
        return grpc.stream_stream_rpc_method_handler(stream)
    if streaming_request:
        return grpc.stream_unary_rpc_method_handler(unary)
    if streaming_response:
        return grpc.unary_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)


def bearer_of(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of an `authorization: Bearer <token>` entry, or None."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else ""
    return None


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call and checks its role against METHOD_ROLES before the handler runs."""

    def __init__(self, authenticator: Authenticator, *, allow_anonymous: bool, reflection: bool) -> None:
        self.authenticator = authenticator
        self.allow_anonymous = allow_anonymous
        self.open_prefixes = (HEALTH_PREFIX, *(REFLECTION_PREFIXES if reflection else ()))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        method = details.method
        if method.startswith(self.open_prefixes):
            current_principal.set(ANONYMOUS)
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
            return handler
        refusal = self._check(method, bearer_of(details.invocation_metadata))
        if refusal is not None:
            code, message = refusal
            return refusing_handler(code, message, handler.request_streaming, handler.response_streaming)
        return handler

    def _check(self, method: str, token: str | None) -> tuple[grpc.StatusCode, str] | None:
        if token is None and self.allow_anonymous:
            current_principal.set(ANONYMOUS)
            current_credential_valid.set(_always)
            return None
        if token is None:
            return grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization: Bearer <token>' metadata"
        principal = self.authenticator.principal(token) if token else None
        if principal is None:
            return grpc.StatusCode.UNAUTHENTICATED, "unknown or malformed token"
        allowed = METHOD_ROLES.get(method, frozenset())
        if not allowed & principal.roles:
            needs = " or ".join(sorted(r.value for r in allowed)) or "a role no caller has"
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} needs the {needs} role"
        current_principal.set(principal)
        current_credential_valid.set(lambda: self._still_valid(method, token, principal.name))
        return None

    def _still_valid(self, method: str, token: str, name: str) -> bool:
        """True while `token` still names the same caller with a role that may call `method`."""
        principal = self.authenticator.principal(token)
        return (
            principal is not None
            and principal.name == name
            and bool(METHOD_ROLES.get(method, frozenset()) & principal.roles)
        )


def _always() -> bool:
    return True


# --- client side ---------------------------------------------------------------------------------------
def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    if "authorization" not in metadata.keys():  # noqa: SIM118  (Metadata iterates (key, value) pairs)
        metadata.add("authorization", f"Bearer {token}")
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_token(details, self.token), request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_token(details, self.token), request_iterator)


def bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors that send `token` on every call (none when the token is empty)."""
    if not token:
        return []
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]


__all__ = [
    "ANONYMOUS",
    "METHOD_ROLES",
    "AuthError",
    "AuthInterceptor",
    "Authenticator",
    "Credential",
    "Principal",
    "Role",
    "bearer_interceptors",
    "client_token",
    "credential_line",
    "current_credential_valid",
    "current_peer",
    "current_principal",
    "hash_token",
    "load_authenticator",
    "new_token",
    "parse_credentials",
    "require_credentials",
]

"""Client channels and TLS credentials: message limits, keepalives, certificates and the bearer token.

Servers and clients share `channel_options`; `channel` is how every Sieve process dials another (TLS when a CA
is configured, this process's bearer token on every call, tracing interceptors when tracing is on).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from sieve.observe import telemetry
from sieve.rpc import auth
from sieve.settings import Settings, SettingsError


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
    pair = (
        _read_bytes(settings.tls_key_file, "SIEVE_TLS_KEY_FILE"),
        _read_bytes(settings.tls_cert_file, "SIEVE_TLS_CERT_FILE"),
    )
    ca = _read_bytes(settings.tls_ca_file, "SIEVE_TLS_CA_FILE") if settings.tls_client_auth else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=settings.tls_client_auth)


def channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """TLS credentials of a client (None: plaintext): the CA to verify servers by, and this process's
    certificate for servers that require one."""
    if not settings.tls_ca_file:
        return None
    ca = _read_bytes(settings.tls_ca_file, "SIEVE_TLS_CA_FILE")
    if settings.tls_cert_file:
        return grpc.ssl_channel_credentials(
            ca,
            _read_bytes(settings.tls_key_file, "SIEVE_TLS_KEY_FILE"),
            _read_bytes(settings.tls_cert_file, "SIEVE_TLS_CERT_FILE"),
        )
    return grpc.ssl_channel_credentials(ca)


def channel(address: str, settings: Settings, extra_options: Sequence[tuple[str, int | str]] = ()) -> grpc.aio.Channel:
    """A client channel to a Sieve service: TLS when a CA is configured, this process's bearer token on every
    call, tracing interceptors when tracing is on."""
    options: list[tuple[str, int | str]] = [*channel_options(settings), *extra_options]
    if settings.tls_server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls_server_name))
    interceptors = [
        *auth.bearer_interceptors(auth.client_token(settings.auth_token, settings.auth_token_file)),
        *telemetry.client_interceptors(),
    ]
    credentials = channel_credentials(settings)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)

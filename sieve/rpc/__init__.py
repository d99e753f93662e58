"""gRPC plumbing every service shares: the server shape, client channels, rich error statuses, and the
cross-cutting interceptors (authentication, audit, malformed requests, readiness).

`from sieve import rpc` gives the names most callers need; the submodules own them:
`server` (Service, create_server, serve), `channel` (channel, TLS credentials), `status` (rich statuses),
`auth`, `audit`, `malformed`, `reflection`, `readiness`, `devcerts`.
"""

from sieve.rpc.channel import channel, channel_credentials, channel_options, server_credentials
from sieve.rpc.server import Registrar, RunningServer, Service, create_server, run_main, serve
from sieve.rpc.status import (
    abort,
    bad_fields_of,
    invalid_argument,
    plain_status,
    resource_exhausted,
    retry_delay_of,
)

__all__ = [
    "Registrar",
    "RunningServer",
    "Service",
    "abort",
    "bad_fields_of",
    "channel",
    "channel_credentials",
    "channel_options",
    "create_server",
    "invalid_argument",
    "plain_status",
    "resource_exhausted",
    "retry_delay_of",
    "run_main",
    "serve",
    "server_credentials",
]

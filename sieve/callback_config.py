"""Who gets told where, signed with what: the per-caller callback settings (SIEVE_CALLBACK_DEFAULT_URLS,
SIEVE_CALLBACK_SECRETS) read into `CallbackConfig`, and the signature every callback POST carries.

Both settings are whitespace-separated `caller=value` entries; the caller `*` stands for every caller without an
entry of its own. A receiver checks a delivery with `signature(secret, timestamp, body)`: HMAC-SHA256 with the
caller's secret over the X-Sieve-Timestamp header's value, a ".", and the raw body, hex, sent as
`X-Sieve-Signature: sha256=<hex>` (README "Callbacks").
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass

WILDCARD = "*"


class CallbackConfigError(ValueError):
    """A callback setting could not be read; the message names the variable."""


def _entries(variable: str, raw: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for item in raw.split():
        caller, sep, value = item.partition("=")
        if not sep or not caller or not value:
            raise CallbackConfigError(f"{variable}: {item.split('=')[0]!r}... is not a caller=value entry")
        if caller in entries:
            raise CallbackConfigError(f"{variable}: caller {caller!r} appears twice")
        entries[caller] = value
    return entries


@dataclass(frozen=True)
class CallbackConfig:
    """Each caller's default callback URL and signing secret."""

    default_urls: dict[str, str]
    secrets: dict[str, bytes]

    @classmethod
    @functools.lru_cache(maxsize=8)  # a few settings strings per process: each parsed once
    def parse(cls, default_urls: str, secrets: str) -> CallbackConfig:
        urls = _entries("SIEVE_CALLBACK_DEFAULT_URLS", default_urls)
        for caller, url in urls.items():
            if not url.startswith(("http://", "https://")) or len(url) > 2048:
                raise CallbackConfigError(
                    f"SIEVE_CALLBACK_DEFAULT_URLS: the URL of {caller!r} must be http(s), at most 2048 characters"
                )
        keys = {caller: secret.encode() for caller, secret in _entries("SIEVE_CALLBACK_SECRETS", secrets).items()}
        for caller in urls:
            if caller not in keys and WILDCARD not in keys:
                raise CallbackConfigError(
                    f"SIEVE_CALLBACK_DEFAULT_URLS names {caller!r}, which has no SIEVE_CALLBACK_SECRETS entry"
                )
        return cls(urls, keys)

    def default_url(self, caller: str) -> str | None:
        return self.default_urls.get(caller, self.default_urls.get(WILDCARD))

    def secret(self, caller: str) -> bytes | None:
        return self.secrets.get(caller, self.secrets.get(WILDCARD))


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The X-Sieve-Signature value of a body sent at `timestamp` (Unix seconds, as sent)."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, header: str) -> bool:
    """Whether `header` is the signature of this body and timestamp (constant-time)."""
    return hmac.compare_digest(signature(secret, timestamp, body), header)

"""The stored form of Sieve's credentials: roles, `name:role:sha256hex` entries, tokens and their hashes.

No gRPC here: `sieve.settings` checks SIEVE_AUTH_TOKENS with `parse_credentials` when it loads, and
`sieve.rpc.auth` builds the services' authentication on these (it re-exports every name).
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass


class AuthError(ValueError):
    """Credentials could not be read or are missing; the message says which setting is wrong."""


class Role(enum.Enum):
    """What a credential lets its caller do (`sieve.rpc.auth.METHOD_ROLES` maps every method to its roles)."""

    CLIENT = "client"
    WORKER = "worker"
    OPERATOR = "operator"


# --- credentials ---------------------------------------------------------------------------------------
def hash_token(token: str) -> str:
    """The stored form of a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return "sv_" + secrets.token_urlsafe(32)


def credential_line(name: str, role: Role | str, token: str) -> str:
    """The stored entry of a token: `name:role:sha256hex`."""
    return f"{name}:{Role(role).value}:{hash_token(token)}"


@dataclass(frozen=True, slots=True)
class Credential:
    """One stored entry: the caller's name, its role and the SHA-256 of its token."""

    name: str
    role: Role
    sha256: bytes


def parse_credentials(text: str, source: str) -> list[Credential]:
    """Entries `name:role:sha256hex`, separated by commas or new lines; `#` starts a comment.

    `role` is client, worker or operator; the hash is 64 hex digits (`hash_token`, or
    `printf %s TOKEN | sha256sum`). `source` names the setting in error messages.
    """
    found: list[Credential] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        for item in filter(None, (p.strip() for p in line.split(","))):
            parts = item.split(":")
            if len(parts) != 3:
                raise AuthError(f"{source}: entry {item[:40]!r} is not name:role:sha256hex")
            name, role, digest = (p.strip() for p in parts)
            if not name or len(name) > 128 or not name.isprintable() or "/" in name:
                raise AuthError(f"{source}: bad name {name[:40]!r} (1..128 printable characters, no '/')")
            try:
                role_value = Role(role.lower())
            except ValueError:
                raise AuthError(f"{source}: role of {name!r} must be client, worker or operator") from None
            try:
                raw = bytes.fromhex(digest)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise AuthError(f"{source}: the hash of {name!r} must be 64 hex digits (SHA-256 of the token)")
            found.append(Credential(name, role_value, raw))
    return found


__all__ = ["AuthError", "Credential", "Role", "credential_line", "hash_token", "new_token", "parse_credentials"]

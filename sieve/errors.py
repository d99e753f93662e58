"""Sieve's exceptions, and the one mapping from Lua return codes to them."""

from __future__ import annotations

from enum import IntEnum


class SieveError(Exception):
    """Base of every Sieve error."""


class SettingsError(ValueError):
    """A SIEVE_* variable could not be read; the message names it (`sieve.settings` raises it, as do the
    modules that own a setting's format)."""


class ScriptCode(IntEnum):
    """Negative codes returned by the Lua scripts."""

    GLOBAL_LIMIT = -1
    DEVICE_LIMIT = -2
    DEVICE_NOT_READY = -3
    REDIS_NOT_READY = -4
    CALLER_LIMIT = -5
    LOCK_NOT_OWNED = -6


class AdmissionRefused(SieveError):
    """A task was not enqueued because a pending limit would be exceeded."""

    def __init__(self, code: ScriptCode, backlog: int, pending: int, caller_open: int = 0) -> None:
        self.code = code
        self.backlog = backlog
        self.pending = pending
        #: the caller's open tasks (for a CALLER_LIMIT refusal)
        self.caller_open = caller_open
        scope = {ScriptCode.GLOBAL_LIMIT: "global pending limit",
                 ScriptCode.CALLER_LIMIT: "caller pending limit"}.get(code, "device pending limit")
        super().__init__(f"{scope} reached (device backlog {backlog}, global pending {pending})")

    @property
    def is_global(self) -> bool:
        return self.code is ScriptCode.GLOBAL_LIMIT


class RedisNotReady(SieveError):
    """Redis lost its memory and the queues have not been rebuilt from PostgreSQL yet: try again soon."""


class LockNotOwned(SieveError):
    """A device's dispatch lock is held by another token."""


class InvalidInput(SieveError):
    """Input from outside is wrong; `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.description = message
        super().__init__(f"{field}: {message}")


class NotFound(SieveError):
    """The named object does not exist."""

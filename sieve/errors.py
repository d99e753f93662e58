"""Sieve's exceptions, and the one mapping from Lua return codes to them."""

from __future__ import annotations

from enum import IntEnum


class SieveError(Exception):
    """Base of every Sieve error."""


class SettingsError(ValueError):
    """A SIEVE_* variable could not be read; the message names it (`sieve.settings` raises it, as do the
    modules that own a setting's format)."""


class ScriptCode(IntEnum):
    """The status codes the Lua scripts return (a reply of its own, or a reply's first element): the same table
    as `sieve/redis/lua/includes/codes.lua`, which the scripts return by name (a unit test compares the two).
    Callers branch on these names, never on a sign."""

    #: the state change was made
    OK = 1
    #: enqueueMany refused: the global pending limit would be exceeded
    GLOBAL_LIMIT = -1
    #: enqueueMany refused: the device's pending limit would be exceeded
    DEVICE_LIMIT = -2
    #: popBatch: the device is not schedulable (taken by another replica, idle, backing off)
    DEVICE_NOT_READY = -3
    #: enqueueMany refused: Redis lost its memory and the queues are not rebuilt yet
    REDIS_NOT_READY = -4
    #: enqueueMany refused: a caller's limit of open tasks would be exceeded
    CALLER_LIMIT = -5
    #: releaseDevice, deferDevice, deferTypes: another token holds the device's lock
    LOCK_NOT_OWNED = -6
    #: popBatch: the device's lock is already held (nothing claimed)
    LOCK_HELD = -7
    #: recountPending: a device became active since the caller read the active devices
    DEVICES_CHANGED = -8


class AdmissionRefused(SieveError):
    """A task was not enqueued because a pending limit would be exceeded."""

    def __init__(self, code: ScriptCode, backlog: int, pending: int, caller_open: int = 0) -> None:
        self.code = code
        self.backlog = backlog
        self.pending = pending
        #: the caller's open tasks (for a CALLER_LIMIT refusal)
        self.caller_open = caller_open
        scope = {ScriptCode.GLOBAL_LIMIT: "global pending limit", ScriptCode.CALLER_LIMIT: "caller pending limit"}.get(
            code, "device pending limit"
        )
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

"""Lease tokens: what a worker must echo to settle a hand-out.

A token is `<lease number>.<signature>`: the number is the fencing token that never repeats for a task (Redis
leases and the result write check it); the signature makes a token unguessable, so that only the stream a task
was handed to can ack or nack it. `LeaseSigner` signs with HMAC-SHA256 over (task id, lease number, worker id)
under the installation's lease key, kept in Redis (`Keys.lease_key`) and shared by every scheduler replica: any
scheduler process can check a token it did not issue itself. That is what lets a worker that reconnects to a new
scheduler process re-announce the leases it still holds (`WorkerHello.held`) and have them adopted under their
exact token — a token names its worker, so no other worker id can present it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

from redis.asyncio import Redis

log = logging.getLogger("sieve.redis.leases")

#: hex digits of the signature kept in a token (64 bits)
SIGNATURE_HEX = 16
#: keys remembered after the one in Redis changed (a Redis that lost its memory gets a new one)
KEPT_KEYS = 3


def new_token(lease: int) -> str:
    """An unsigned random token (tests, and tools that need a well-formed token)."""
    return f"{lease}.{secrets.token_hex(SIGNATURE_HEX // 2)}"


def lease_number(token: str) -> int:
    """The fencing number of a token (ValueError when it has none)."""
    return int(token.partition(".")[0])


class LeaseSigner:
    """Signs and checks lease tokens under the installation's lease key (read from Redis, made there by the first
    scheduler that needs one). Until Redis answers it signs with a key of its own process, so that dispatching
    never waits for it; tokens signed so can then only be checked by this process."""

    def __init__(self, redis: Redis, key_name: str) -> None:
        self.redis = redis
        self.key_name = key_name
        #: the key tokens are signed with now, first; then earlier ones, still accepted
        self._keys: list[bytes] = []
        self.shared = False

    @property
    def ready(self) -> bool:
        return bool(self._keys)

    async def refresh(self) -> None:
        """Reads the shared key from Redis (making it when there is none); a key of this process when Redis does
        not answer."""
        try:
            value = await self.redis.get(self.key_name)
            if value is None:
                await self.redis.set(self.key_name, secrets.token_hex(32), nx=True)
                value = await self.redis.get(self.key_name)
        except Exception as exc:
            if not self._keys:
                log.warning("lease key not read from Redis (%s): signing with a key of this process", exc)
                self._keys = [secrets.token_bytes(32)]
            return
        key = value.encode() if isinstance(value, str) else bytes(value)
        if not self._keys or self._keys[0] != key:
            self._keys = [key, *(k for k in self._keys if k != key)][:KEPT_KEYS]
        self.shared = True

    async def ensure(self) -> None:
        if not self._keys:
            await self.refresh()

    @staticmethod
    def _signature(key: bytes, task_id: str, lease: int, worker_id: str) -> str:
        message = f"{task_id}|{lease}|{worker_id}".encode()
        return hmac.new(key, message, hashlib.sha256).hexdigest()[:SIGNATURE_HEX]

    def sign(self, task_id: str, lease: int, worker_id: str) -> str:
        """The token of hand-out `lease` of `task_id` to `worker_id`."""
        if not self._keys:
            self._keys = [secrets.token_bytes(32)]
        return f"{lease}.{self._signature(self._keys[0], task_id, lease, worker_id)}"

    def verify(self, task_id: str, worker_id: str, token: str) -> int | None:
        """The lease number of `token` when it is the token of that hand-out to `worker_id`, else None."""
        number, dot, signature = token.partition(".")
        if not dot or not number.isdigit() or len(number) > 12 or len(signature) != SIGNATURE_HEX:
            return None
        lease = int(number)
        for key in self._keys:
            if hmac.compare_digest(self._signature(key, task_id, lease, worker_id), signature):
                return lease
        return None

"""Lease tokens signed for their worker under the installation's lease key in Redis (sieve/redis/leases.py): another
scheduler process checks them, no other worker id or guess passes, and a key Redis lost is still honoured for
the tokens signed with it."""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.leases import LeaseSigner, lease_number
from sieve.settings import Settings


async def test_a_token_is_checked_by_another_process_for_its_task_lease_and_worker_only(
    settings: Settings, redis: Redis
) -> None:
    key = Keys(settings.redis_prefix).lease_key
    issuer, other = LeaseSigner(redis, key), LeaseSigner(redis, key)
    await issuer.ensure()
    await other.ensure()  # a second scheduler process reads the same key
    assert issuer.shared and other.shared
    task = str(uuid.uuid4())
    token = issuer.sign(task, 7, "w1")
    assert lease_number(token) == 7
    assert other.verify(task, "w1", token) == 7
    # not for another worker, another task, another lease number, or any guess
    assert other.verify(task, "w2", token) is None
    assert other.verify(str(uuid.uuid4()), "w1", token) is None
    signature = token.partition(".")[2]
    assert other.verify(task, "w1", f"8.{signature}") is None
    for guess in ("7", "7.", "7.0000000000000000", "x.1234", "", f"7.{signature}0", "9" * 40 + "." + signature):
        assert other.verify(task, "w1", guess) is None, guess


async def test_tokens_signed_before_redis_lost_its_key_are_still_honoured(settings: Settings, redis: Redis) -> None:
    key = Keys(settings.redis_prefix).lease_key
    signer = LeaseSigner(redis, key)
    await signer.ensure()
    task = str(uuid.uuid4())
    old = signer.sign(task, 3, "w1")
    await redis.delete(key)  # Redis lost its memory: the next replica makes a new key
    await signer.refresh()
    new = signer.sign(task, 3, "w1")
    assert new != old
    assert signer.verify(task, "w1", old) == 3 and signer.verify(task, "w1", new) == 3
    fresh = LeaseSigner(redis, key)
    await fresh.ensure()
    assert fresh.verify(task, "w1", new) == 3 and fresh.verify(task, "w1", old) is None

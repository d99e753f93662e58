"""Slot pools against the real Redis: never over-committed, released, renewed, reclaimed after a lease."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.slot_pools import SlotPools
from sieve.settings import Settings


def _pools(redis: Redis, settings: Settings, lease_ms: int = 60_000) -> SlotPools:
    return SlotPools(redis, Keys(settings.redis_prefix), {"video": 18, "avatar": 2}, lease_ms=lease_ms)


async def test_a_pool_grants_up_to_its_maximum_and_no_more(redis: Redis, settings: Settings) -> None:
    pools = _pools(redis, settings)
    granted = [await pools.acquire("avatar", f"h{i}") for i in range(4)]
    assert granted == [True, True, False, False]
    assert (await pools.state("avatar")).in_use == 2


async def test_an_acquire_by_a_current_holder_renews_its_slot_instead_of_taking_a_second(
    redis: Redis, settings: Settings
) -> None:
    pools = _pools(redis, settings)
    assert await pools.acquire("avatar", "h1")
    assert await pools.acquire("avatar", "h1")
    assert (await pools.state("avatar")).in_use == 1


async def test_a_released_slot_is_free_again_and_a_second_release_changes_nothing(
    redis: Redis, settings: Settings
) -> None:
    pools = _pools(redis, settings)
    await pools.acquire("avatar", "a")
    await pools.acquire("avatar", "b")
    assert await pools.release("avatar", "a")
    assert not await pools.release("avatar", "a")
    assert await pools.acquire("avatar", "c")


async def test_many_concurrent_acquirers_on_two_connections_never_over_commit(redis: Redis, settings: Settings) -> None:
    # Given two "replicas" (two clients) racing for 18 video slots with 200 acquirers
    other = Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        a, b = _pools(redis, settings), _pools(other, settings)
        results = await asyncio.gather(*((a if i % 2 else b).acquire("video", f"h{i}") for i in range(200)))
        # Then exactly 18 got one
        assert sum(results) == 18
        assert (await a.state("video")).in_use == 18
    finally:
        await other.aclose()


async def test_renew_extends_live_leases_and_reports_lost_ones(redis: Redis, settings: Settings) -> None:
    pools = _pools(redis, settings, lease_ms=1_000)
    now = int(time.time() * 1000)
    await pools.acquire("avatar", "live", now_ms=now)
    await pools.acquire("avatar", "dead", now_ms=now - 5_000)  # its lease ran out long ago
    assert await pools.renew("avatar", ["live", "dead"], now_ms=now) == ["dead"]


async def test_a_holder_killed_without_release_gets_its_slot_back_within_its_lease(
    redis: Redis, settings: Settings
) -> None:
    # Given a separate process that takes both avatar slots with a 1.5 s lease, then is killed with SIGKILL
    code = (
        "import asyncio\n"
        "from redis.asyncio import Redis\n"
        "from sieve.redis.keys import Keys\n"
        "from sieve.redis.slot_pools import SlotPools\n"
        "async def main():\n"
        f"    r = Redis.from_url({settings.redis_url!r}, decode_responses=True)\n"
        f"    p = SlotPools(r, Keys({settings.redis_prefix!r}), {{'avatar': 2}}, lease_ms=1500)\n"
        "    assert await p.acquire('avatar', 'x1') and await p.acquire('avatar', 'x2')\n"
        "    print('held', flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(os.environ))  # noqa: ASYNC220
    try:
        assert proc.stdout is not None
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == b"held"
        pools = _pools(redis, settings)
        assert not await pools.acquire("avatar", "me")
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        # When its lease runs out, Then the slot is taken by someone else: within the lease (plus a poll)
        while not await pools.acquire("avatar", "me"):
            assert time.monotonic() - killed < 1.5 + 0.5
            await asyncio.sleep(0.05)
        assert time.monotonic() - killed <= 1.5 + 0.2
    finally:
        proc.kill()
        proc.wait()

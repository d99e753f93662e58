"""Fixtures of the Lua script tests (every script of the device queues against the real Redis, through
QueueStore): after every test the counter invariant holds: the global pending counter == the sum of all device
queue lengths == the sum of all device backlogs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.queue_store import QueueStore
from sieve.settings import Settings
from tests.integration.sieve.redis.lua.helpers import assert_counters


@pytest.fixture(autouse=True)
async def _counter_invariant(redis: Redis, settings: Settings) -> AsyncIterator[None]:
    yield
    await assert_counters(redis, settings.redis_prefix)


@pytest.fixture
def store(redis: Redis, settings: Settings) -> QueueStore:
    return QueueStore(redis, settings)


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.redis_prefix)

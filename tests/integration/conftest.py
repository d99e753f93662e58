"""The platform in one test process (tests/support/platform.py): registry, scheduler, intake servers on loopback
ports and one worker, against this test's own Redis prefix and PostgreSQL schema.

The integration modules import the platform helpers and task specs from here; they live in tests/support.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from redis.asyncio import Redis

from sieve.settings import Settings
from tests.support.platform import FINAL, Platform, platform_with, start_platform, wait_final
from tests.support.tasks import PNG, text_spec, tiny_png

__all__ = ["FINAL", "PNG", "Platform", "platform_with", "start_platform", "text_spec", "tiny_png", "wait_final"]


@pytest.fixture
async def platform(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Platform]:
    async for p in start_platform(settings, redis, pg):
        yield p


@pytest.fixture
async def platform_without_workers(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Platform]:
    async for p in start_platform(settings, redis, pg, workers=0):
        yield p

"""The Redis and PostgreSQL the tests run against (SIEVE_TEST_REDIS_URL / SIEVE_TEST_DATABASE_URL, else the local
servers, else embedded ones: `tests/support/embedded_stores.py`), and dropping the schema a test made."""

from __future__ import annotations

import asyncio

import asyncpg

from tests.support.embedded_stores import store_urls

REDIS_URL, DATABASE_URL = store_urls()


async def drop_schema(database_url: str, schema: str, attempts: int = 5) -> None:
    """Drops `schema` and everything in it (nothing when it is not there); tried again when it deadlocks with a
    backend whose client has just been killed and which is still finishing its query."""
    conn = await asyncpg.connect(database_url)
    try:
        for attempt in range(attempts):
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                return
            except asyncpg.DeadlockDetectedError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
    finally:
        await conn.close()

"""The Redis and PostgreSQL the tests run against (SIEVE_TEST_REDIS_URL / SIEVE_TEST_DATABASE_URL, else the local
servers, else embedded ones: `tests/support/embedded_stores.py`), and dropping the schema a test made."""

from __future__ import annotations

import asyncpg

from tests.support.embedded_stores import store_urls

REDIS_URL, DATABASE_URL = store_urls()


async def drop_schema(database_url: str, schema: str) -> None:
    """Drops `schema` and everything in it (nothing when it is not there)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()

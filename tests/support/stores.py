"""The Redis and PostgreSQL the tests run against (SIEVE_TEST_REDIS_URL / SIEVE_TEST_DATABASE_URL, else the local
servers), and dropping the schema a test made."""

from __future__ import annotations

import os

import asyncpg

REDIS_URL = os.environ.get("SIEVE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("SIEVE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


async def drop_schema(database_url: str, schema: str) -> None:
    """Drops `schema` and everything in it (nothing when it is not there)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()

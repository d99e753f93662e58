"""PostgreSQL access shared by the services: the asyncpg pool and the start-up migrations.

Migrations are the numbered SQL files in `migrations/`, applied in order inside one transaction that
holds an advisory lock, so several services starting at once apply each file exactly once. Who applies them
is `SIEVE_DB_MIGRATE_ON_START`: each service when it opens its pool (true, the default: local runs, tests), or a
separate step run with the schema owner's role (`python -m sieve.db.migrate`, sieve/db/migrate.py; false in the
deployment manifests). A service that does not migrate checks that every migration it knows is applied, and
waits for it (`SchemaNotReady`), so its own role needs no right to create or alter anything.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from sieve.settings import Settings

log = logging.getLogger("sieve.db")
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL): no
    pooled connection changes session state (LISTEN has its own connection; locks are per transaction),
    and the query costs a round trip per release. An open transaction is still rolled back by asyncpg."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=_json_dumps, decoder=_json_loads, schema="pg_catalog")


def _json_dumps(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _json_loads(text: str) -> object:
    import json

    return json.loads(text)


class SchemaNotReady(ConnectionError):
    """The schema lacks migrations this code needs (the migration step has not run yet, or this role may not
    read `schema_migrations`). A ConnectionError, so that every start-up retry loop waits for it like for a
    store that does not answer yet."""


async def create_pool(
    settings: Settings,
    *,
    attempts: int = 30,
    delay_s: float = 0.5,
    migrate_first: bool | None = None,
    warm: Warm | None = None,
) -> asyncpg.Pool:
    """Connects (retrying while PostgreSQL starts), applies migrations or checks they are applied, returns the
    pool. `migrate_first` None follows `settings.db_migrate_on_start`; False neither migrates nor checks.

    `warm` prepares a service's hot statements on each new connection; such a pool opens `warm.connections` at
    once (or db_pool_min, when more) and keeps its connections while idle, so that a burst after a quiet spell
    does not pay for new connections and plans on a busy machine."""
    min_size = max(settings.db_pool_min, warm.connections if warm else 0)
    min_size = min(min_size, settings.db_pool_max)

    async def init(conn: asyncpg.Connection) -> None:
        await _init_connection(conn)
        if warm is not None:
            await warm.prepare(conn)

    migrate_now = settings.db_migrate_on_start if migrate_first is None else migrate_first
    check = migrate_first is None and not settings.db_migrate_on_start
    for left in range(attempts - 1, -1, -1):
        try:
            if migrate_now:
                await apply_migrations(settings)
            pool = await asyncpg.create_pool(
                settings.database_url,
                min_size=min_size,
                max_size=settings.db_pool_max,
                max_inactive_connection_lifetime=0.0 if warm else 300.0,
                server_settings={
                    "search_path": settings.database_schema,
                    "application_name": f"sieve:{settings.database_schema}"[:63],
                },
                init=init,
                reset=_keep_session,
            )
            assert pool is not None
            if check:
                try:
                    await check_migrated(pool, settings.database_schema)
                except BaseException:
                    await pool.close()
                    raise
            return pool
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError) as exc:
            if left == 0:
                raise
            log.warning("PostgreSQL not reachable (%s); %d retries left", exc, left)
            await asyncio.sleep(delay_s)
    raise RuntimeError("unreachable")


@dataclass(frozen=True)
class Warm:
    """How a service warms its pool: `connections` opened at once, each prepared by `prepare`."""

    connections: int
    prepare: Callable[[asyncpg.Connection], Awaitable[None]]


def migration_files() -> list[Path]:
    return sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql"))


async def applied_migrations(conn: asyncpg.Connection | asyncpg.Pool, schema: str) -> set[str] | None:
    """The versions recorded in `schema.schema_migrations`, or None when that table does not exist."""
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{_quote_ident(schema)}.schema_migrations")
    if not exists:
        return None
    rows = await conn.fetch(f"SELECT version FROM {_quote_ident(schema)}.schema_migrations")
    return {r["version"] for r in rows}


async def check_migrated(pool: asyncpg.Pool, schema: str) -> None:
    """Raises SchemaNotReady unless every migration file of this code is applied in `schema`."""
    try:
        done = await applied_migrations(pool, schema)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise SchemaNotReady(
            f"schema {schema}: this role may not read schema_migrations ({exc}); grant it with "
            "`python -m sieve.db.migrate --grant SERVICE=ROLE`"
        ) from None
    if done is None:
        raise SchemaNotReady(
            f"schema {schema} is not migrated (no schema_migrations table): run "
            "`python -m sieve.db.migrate` with the owner role, or set SIEVE_DB_MIGRATE_ON_START=true"
        )
    missing = [p.stem for p in migration_files() if p.stem not in done]
    if missing:
        raise SchemaNotReady(
            f"schema {schema} lacks migrations {missing}: run `python -m sieve.db.migrate` with the owner role"
        )


async def apply_migrations(settings: Settings) -> list[str]:
    """Applies every migration not yet applied in the configured schema; returns those applied."""
    conn = await asyncpg.connect(settings.database_url)
    schema = settings.database_schema
    applied: list[str] = []
    try:
        async with conn.transaction():
            # one lock per schema: concurrent starters queue here instead of racing on CREATE
            await conn.execute("SELECT pg_advisory_xact_lock($1)", zlib.crc32(f"sieve:{schema}".encode()))
            # CREATE SCHEMA needs CREATE on the database even when the schema exists: only when it is missing
            if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema):
                await conn.execute(f"CREATE SCHEMA {_quote_ident(schema)}")
            await conn.execute(f"SET LOCAL search_path TO {_quote_ident(schema)}")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for path in migration_files():
                if path.stem in done:
                    continue
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", path.stem)
                applied.append(path.stem)
    finally:
        await conn.close()
    if applied:
        log.info("applied migrations %s in schema %s", applied, schema)
    return applied

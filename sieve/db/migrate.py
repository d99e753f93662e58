"""`python -m sieve.db.migrate`: the schema migrations as a step of their own, run with the schema owner's role.

    python -m sieve.db.migrate [--grant intake=ROLE] [--grant scheduler=ROLE] [--grant worker=ROLE]
    python -m sieve.db.migrate --check          # exit 1 when migrations are pending; changes nothing
    python -m sieve.db.migrate --print-grants --grant worker=ROLE   # the GRANT statements, not applied

It connects with `SIEVE_DATABASE_URL` (the owner/migrator role, deploy/postgres/roles.sql) to the schema
`SIEVE_DATABASE_SCHEMA`, applies every migration not yet applied (sieve/db/__init__.py: one transaction under an
advisory lock), then gives each named service role exactly what that service's SQL needs (`SERVICE_GRANTS`), in
one transaction: USAGE on the schema, no CREATE, and per-table privileges, after revoking what it held before
(so a grant narrowed here is narrowed in the database too). Run it on every deploy, before the services (a
Kubernetes Job, a compose one-shot service); they run with `SIEVE_DB_MIGRATE_ON_START=false` and only check
that the schema is up to date.

Exit status: 0 done, 1 migrations pending (--check), 2 an error (the message on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Mapping, Sequence

import asyncpg

from sieve.db import _quote_ident, applied_migrations, apply_migrations, migration_files
from sieve.settings import Settings, SettingsError

log = logging.getLogger("sieve.db.migrate")

#: service -> table -> privileges: what each service's SQL does (sieve/db/tasks.py, payloads.py, audit.py, reports.py,
#: task_changes.py, callbacks.py, intake_svc/ownership.py, worker_svc/lexicon.py). task_changes and callback_deliveries
#: are written by triggers running as the schema owner (migration 0014): no service inserts. Nothing updates or deletes
#: audit_events; only the intake deletes tasks (a task it recorded but could not queue, with its idempotency key); the
#: lexicon trigger bumps lexicon_version as the worker that seeds the lexicon and as the intake that changes it
#: (LexiconService, sieve/db/lexicon.py). Partition maintenance and retention (sieve/db/retention.py: CREATE / DROP of
#: day partitions) are the owner's: `python -m sieve.db.retention` with the owner role. A table or sequence listed
#: here that this schema does not have (yet) is skipped with a warning.
SERVICE_GRANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "intake": {
        "schema_migrations": ("SELECT",),
        "tasks": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "idempotency_keys": ("SELECT", "INSERT", "DELETE"),
        "results": ("SELECT",),
        "device_owners": ("SELECT", "INSERT", "UPDATE"),
        "audit_events": ("INSERT",),
        "device_reports": ("SELECT", "INSERT"),
        "task_changes": ("SELECT",),
        "task_changes_purged": ("SELECT",),
        "callback_deliveries": ("SELECT",),
        # written by triggers running as the schema owner (migration 0015); GetStats reads them
        "task_stats": ("SELECT",),
        "task_stats_words": ("SELECT",),
        # LexiconService (sieve/db/lexicon.py); the table's trigger bumps lexicon_version as the caller
        "lexicon": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "lexicon_version": ("SELECT", "UPDATE"),
    },
    "scheduler": {
        "schema_migrations": ("SELECT",),
        "tasks": ("SELECT", "UPDATE"),
        "results": ("SELECT",),
        "audit_events": ("SELECT", "INSERT"),
        "callback_deliveries": ("SELECT", "UPDATE"),
        # ListSlotPools' cost per provider and caller (migration 0016)
        "external_jobs": ("SELECT",),
    },
    "worker": {
        "schema_migrations": ("SELECT",),
        "tasks": ("SELECT", "UPDATE"),
        "results": ("SELECT", "INSERT"),
        "lexicon": ("SELECT", "INSERT"),
        "lexicon_version": ("SELECT", "UPDATE"),
        # the external engine's record of its provider jobs (migration 0016)
        "external_jobs": ("SELECT", "INSERT", "UPDATE"),
    },
}
#: service -> sequence -> privileges (nextval needs USAGE)
SEQUENCE_GRANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "intake": {"device_owner_version": ("USAGE",)},
}


def grant_statements(schema: str, service: str, role: str, existing: set[str] | None = None) -> list[str]:
    """The statements that give `role` what `service` needs in `schema`, and nothing more (`existing`: the
    relations the schema has; others are left out)."""
    if service not in SERVICE_GRANTS:
        raise ValueError(f"unknown service {service!r}: one of {', '.join(SERVICE_GRANTS)}")
    s, r = _quote_ident(schema), _quote_ident(role)
    statements = [
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {r}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {r}",
        f"REVOKE CREATE ON SCHEMA {s} FROM {r}",
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
    ]
    for kind, grants in (("TABLE", SERVICE_GRANTS), ("SEQUENCE", SEQUENCE_GRANTS)):
        for name, privileges in grants.get(service, {}).items():
            if existing is not None and name not in existing:
                log.warning("schema %s has no %s %s: %s gets no grant on it", schema, kind.lower(), name, service)
                continue
            statements.append(f"GRANT {', '.join(privileges)} ON {kind} {s}.{_quote_ident(name)} TO {r}")
    return statements


async def relations(conn: asyncpg.Connection, schema: str) -> set[str]:
    """Names of the tables (plain and partitioned) and sequences of `schema`."""
    rows = await conn.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S')",
        schema,
    )
    return {r["relname"] for r in rows}


def parse_grants(items: Sequence[str]) -> dict[str, str]:
    """`["intake=sieve_intake", ...]` -> {"intake": "sieve_intake", ...}."""
    grants: dict[str, str] = {}
    for item in items:
        service, sep, role = item.partition("=")
        service, role = service.strip().lower(), role.strip()
        if not sep or not role or service not in SERVICE_GRANTS:
            raise ValueError(f"--grant {item!r}: expected SERVICE=ROLE with SERVICE one of {', '.join(SERVICE_GRANTS)}")
        grants[service] = role
    return grants


async def apply_grants(settings: Settings, grants: Mapping[str, str]) -> None:
    """Grants each service role its privileges in the configured schema, in one transaction."""
    if not grants:
        return
    conn = await asyncpg.connect(settings.database_url)
    try:
        async with conn.transaction():
            existing = await relations(conn, settings.database_schema)
            for service, role in grants.items():
                for statement in grant_statements(settings.database_schema, service, role, existing):
                    await conn.execute(statement)
    finally:
        await conn.close()
    log.info("granted %s in schema %s", ", ".join(f"{s}={r}" for s, r in grants.items()), settings.database_schema)


async def pending(settings: Settings) -> list[str]:
    """Migrations of this code not applied in the configured schema."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        done = await applied_migrations(conn, settings.database_schema) or set()
    finally:
        await conn.close()
    return [p.stem for p in migration_files() if p.stem not in done]


async def _connectable(settings: Settings, attempts: int, delay_s: float) -> None:
    """Waits while PostgreSQL starts (a Job may start before the database answers)."""
    for left in range(attempts - 1, -1, -1):
        try:
            conn = await asyncpg.connect(settings.database_url, timeout=10)
            await conn.close()
            return
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError) as exc:
            if left == 0:
                raise
            log.warning("PostgreSQL not reachable (%s); %d retries left", exc, left)
            await asyncio.sleep(delay_s)


async def run(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sieve.db.migrate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="SERVICE=ROLE",
        help=f"after migrating, grant ROLE what SERVICE needs ({', '.join(SERVICE_GRANTS)})",
    )
    parser.add_argument("--check", action="store_true", help="apply nothing; exit 1 when migrations are pending")
    parser.add_argument("--print-grants", action="store_true", help="print the GRANT statements and exit")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for PostgreSQL to answer")
    args = parser.parse_args(argv)
    try:
        settings = settings or Settings.from_env()
        grants = parse_grants(args.grant)
        if args.print_grants:
            for service, role in grants.items():
                for statement in grant_statements(settings.database_schema, service, role):
                    print(statement + ";")
            return 0
        await _connectable(settings, attempts=max(1, int(args.wait_s)), delay_s=1.0)
        if args.check:
            missing = await pending(settings)
            print(f"schema {settings.database_schema}: " + (f"pending {missing}" if missing else "up to date"))
            return 1 if missing else 0
        applied = await apply_migrations(settings)
        await apply_grants(settings, grants)
        print(
            f"schema {settings.database_schema}: applied {applied or 'nothing'}"
            + (f"; granted {', '.join(f'{s}={r}' for s, r in grants.items())}" if grants else "")
        )
        return 0
    except (SettingsError, ValueError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        print(f"sieve.db.migrate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(run()))


if __name__ == "__main__":
    main()

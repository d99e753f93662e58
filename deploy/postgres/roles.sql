-- Sieve's PostgreSQL roles, least privilege (deploy/README.md, "Data stores"). Run once per database by an
-- administrator (a superuser, or a role with CREATEROLE that owns the database), with psql; it is idempotent:
--
--   psql "postgresql://ADMIN@HOST/sieve" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql \
--        -v owner_password="$(cat secrets/pg-owner)" -v intake_password="$(cat secrets/pg-intake)" \
--        -v scheduler_password="$(cat secrets/pg-scheduler)" -v worker_password="$(cat secrets/pg-worker)"
--
-- (or set the passwords later with \password). Then, as the owner, migrate and grant each service what it needs:
--
--   SIEVE_DATABASE_URL=postgresql://sieve_owner:...@HOST/sieve python -m sieve.db.migrate \
--        --grant intake=sieve_intake --grant scheduler=sieve_scheduler --grant worker=sieve_worker
--
-- Roles (names are psql variables, defaults below):
--   owner      owns the schema and every table in it; runs the migrations, the grants and retention
--              (python -m sieve.db.migrate, python -m sieve.db.retention). No service runs as it.
--   intake     tasks (SELECT, INSERT, UPDATE, DELETE), results (SELECT), device owners, audit (INSERT only),
--              lexicon (SELECT, INSERT, UPDATE, DELETE: LexiconService)
--   scheduler  tasks (SELECT, UPDATE), audit (SELECT, INSERT)
--   worker     tasks (SELECT, UPDATE), results (SELECT, INSERT), lexicon (SELECT, INSERT)
-- None of the service roles may create anything in the schema, alter or drop a table, or change the audit log:
-- the per-table privileges are given by `python -m sieve.db.migrate --grant` (sieve/db/migrate.py,
-- SERVICE_GRANTS), after each migration, so that they follow the tables of the code being deployed.
-- The registry needs no PostgreSQL role: it keeps its state in Redis.
--
-- Variables: schema (sieve), owner (sieve_owner), intake (sieve_intake), scheduler (sieve_scheduler),
-- worker (sieve_worker), *_password (unset: the password is left as it is), harden_database (true: revoke
-- CONNECT on this database and CREATE on schema public from PUBLIC; set false on a database shared with others).

\if :{?schema} \else \set schema sieve \endif
\if :{?owner} \else \set owner sieve_owner \endif
\if :{?intake} \else \set intake sieve_intake \endif
\if :{?scheduler} \else \set scheduler sieve_scheduler \endif
\if :{?worker} \else \set worker sieve_worker \endif
\if :{?harden_database} \else \set harden_database true \endif

BEGIN;

-- the roles: log in, nothing else (no superuser, no CREATEDB / CREATEROLE, no replication, no RLS bypass)
SELECT format('CREATE ROLE %I', r) FROM unnest(ARRAY[:'owner', :'intake', :'scheduler', :'worker']) AS r
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) \gexec
SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT', r)
FROM unnest(ARRAY[:'owner', :'intake', :'scheduler', :'worker']) AS r \gexec

\if :{?owner_password}
ALTER ROLE :"owner" PASSWORD :'owner_password';
\endif
\if :{?intake_password}
ALTER ROLE :"intake" PASSWORD :'intake_password';
\endif
\if :{?scheduler_password}
ALTER ROLE :"scheduler" PASSWORD :'scheduler_password';
\endif
\if :{?worker_password}
ALTER ROLE :"worker" PASSWORD :'worker_password';
\endif

-- the schema, owned by the owner role: only it may create, alter or drop what is inside
SELECT format('CREATE SCHEMA %I AUTHORIZATION %I', :'schema', :'owner')
WHERE NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :'schema') \gexec
ALTER SCHEMA :"schema" OWNER TO :"owner";
REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;
GRANT USAGE ON SCHEMA :"schema" TO :"intake", :"scheduler", :"worker";

-- every role finds Sieve's tables first, and nothing of another schema shadows them
ALTER ROLE :"owner" SET search_path = :"schema";
ALTER ROLE :"intake" SET search_path = :"schema";
ALTER ROLE :"scheduler" SET search_path = :"schema";
ALTER ROLE :"worker" SET search_path = :"schema";

-- the database: these roles connect; PUBLIC does not, and nobody creates objects in schema public
GRANT CONNECT ON DATABASE :"DBNAME" TO :"owner", :"intake", :"scheduler", :"worker";
\if :harden_database
REVOKE CONNECT, TEMPORARY ON DATABASE :"DBNAME" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
\endif

COMMIT;

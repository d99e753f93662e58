#!/bin/sh
# Runs deploy/postgres/roles.sql at the first start of the compose PostgreSQL volume (docker-entrypoint-initdb.d),
# with the role passwords from the compose secrets (deploy/gen_secrets.py). On a volume made before this, run
# roles.sql by hand (deploy/README.md, "Data stores").
set -eu
psql -v ON_ERROR_STOP=1 -X -q --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v owner_password="$(cat /run/secrets/pg-owner)" \
    -v intake_password="$(cat /run/secrets/pg-intake)" \
    -v scheduler_password="$(cat /run/secrets/pg-scheduler)" \
    -v worker_password="$(cat /run/secrets/pg-worker)" \
    -f /etc/sieve-postgres/roles.sql

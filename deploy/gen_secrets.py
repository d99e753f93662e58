"""Makes every secret a Sieve deployment needs, fresh and random, into one private folder (default deploy/secrets/).

    python3 deploy/gen_secrets.py                       # for deploy/compose.yaml (hosts postgres and redis)
    python3 deploy/gen_secrets.py --out /secure/sieve --pg-host db.internal --redis-host redis.internal --tls

Written (the folder is mode 700; the files 644 inside it, so that the containers' own users can read the
ones mounted into them, while nobody else on this host can reach them through the folder):

- `auth-tokens`: the credentials file (`name:role:sha256hex`, hashes only) of the tokens below; every server
  reads it (SIEVE_AUTH_TOKENS_FILE).
- `token-worker`, `token-operator`, `token-client`: bearer tokens of the credentials `worker` (workers run as
  `worker/<id>`, SIEVE_AUTH_TOKEN_FILE), `operator` (dead letters, the audit log) and `client` (the demo).
- `redis-intake`, `redis-scheduler`, `redis-registry`: passwords of the Redis ACL users (deploy/redis/).
- `pg-admin`, `pg-owner`, `pg-intake`, `pg-scheduler`, `pg-worker`: PostgreSQL passwords (deploy/postgres/).
- `grafana-admin`: Grafana's admin password (compose).
- `intake.env`, `scheduler.env`, `registry.env`, `worker.env`, `migrate.env`: each process's SIEVE_DATABASE_URL /
  SIEVE_REDIS_URL with its own role and user (the migration step's is the owner's): compose `env_file`, or
  `kubectl create secret generic NAME --from-env-file=...`.

A folder that already holds secrets is left alone unless --force (new secrets would lock out running services).
Only the Python standard library is needed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: credential name -> role (the token files are token-<name>)
CREDENTIALS = {"worker": "worker", "operator": "operator", "client": "client"}
REDIS_USERS = ("intake", "scheduler", "registry")
PG_ROLES = ("admin", "owner", "intake", "scheduler", "worker")


def new_token() -> str:
    """A bearer token as sieve.rpc.auth.new_token makes them (256 bits, URL-safe)."""
    return "sv_" + secrets.token_urlsafe(32)


def credential_line(name: str, role: str, token: str) -> str:
    """The stored entry of a token (sieve.rpc.auth.credential_line): name:role:sha256hex."""
    return f"{name}:{role}:{hashlib.sha256(token.encode()).hexdigest()}"


def password() -> str:
    # URL-safe: it goes into redis:// and postgresql:// URLs as it is
    return secrets.token_urlsafe(24)


def make(*, pg_host: str, pg_port: int, database: str, redis_host: str, redis_port: int, tls: bool) -> dict[str, str]:
    """The secrets' file names and contents."""
    files: dict[str, str] = {}
    tokens = {name: new_token() for name in CREDENTIALS}
    files["auth-tokens"] = (
        "# Sieve credentials (name:role:sha256hex); the tokens are in the token-* files beside this one\n"
        + "".join(credential_line(name, CREDENTIALS[name], tok) + "\n" for name, tok in tokens.items())
    )
    for name, tok in tokens.items():
        files[f"token-{name}"] = tok + "\n"
    redis_pw = {user: password() for user in REDIS_USERS}
    pg_pw = {role: password() for role in PG_ROLES}
    for user, pw in redis_pw.items():
        files[f"redis-{user}"] = pw + "\n"
    for role, pw in pg_pw.items():
        files[f"pg-{role}"] = pw + "\n"
    files["grafana-admin"] = password() + "\n"
    scheme = "rediss" if tls else "redis"
    ssl = "?sslmode=verify-full" if tls else ""

    def pg(role: str) -> str:
        return f"postgresql://sieve_{role}:{pg_pw[role]}@{pg_host}:{pg_port}/{database}{ssl}"

    def redis(user: str) -> str:
        return f"{scheme}://sieve-{user}:{redis_pw[user]}@{redis_host}:{redis_port}/0"

    envs = {
        "intake": {"SIEVE_DATABASE_URL": pg("intake"), "SIEVE_REDIS_URL": redis("intake")},
        "scheduler": {"SIEVE_DATABASE_URL": pg("scheduler"), "SIEVE_REDIS_URL": redis("scheduler")},
        "registry": {"SIEVE_REDIS_URL": redis("registry")},
        "worker": {"SIEVE_DATABASE_URL": pg("worker")},
        "migrate": {"SIEVE_DATABASE_URL": pg("owner")},
    }
    for name, values in envs.items():
        files[f"{name}.env"] = "".join(f"{k}={v}\n" for k, v in values.items())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "secrets", help="folder to write (default deploy/secrets)")
    parser.add_argument("--pg-host", default="postgres")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--database", default="sieve")
    parser.add_argument("--redis-host", default="redis")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--tls", action="store_true", help="rediss:// URLs and sslmode=verify-full")
    parser.add_argument("--force", action="store_true", help="replace the secrets of an existing folder")
    args = parser.parse_args(argv)
    out: Path = args.out
    if out.exists() and (out / "auth-tokens").exists() and not args.force:
        print(
            f"{out} already holds secrets; --force replaces them (running services then need the new ones)",
            file=sys.stderr,
        )
        return 1
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    files = make(
        pg_host=args.pg_host,
        pg_port=args.pg_port,
        database=args.database,
        redis_host=args.redis_host,
        redis_port=args.redis_port,
        tls=args.tls,
    )
    for name, content in files.items():
        path = out / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.chmod(path, 0o644)
    (out / ".gitignore").write_text("*\n")
    print(f"wrote {len(files)} secrets to {out} (folder mode 700)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

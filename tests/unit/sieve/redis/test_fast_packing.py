"""The client's hiredis packer sends what redis-py's own packer sends, byte for byte."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from sieve.redis.connection import fast_packing, hiredis_pack_command, redis_client
from sieve.settings import Settings

pytestmark = pytest.mark.skipif(hiredis_pack_command is None, reason="hiredis is not installed")

COMMANDS: list[tuple[object, ...]] = [
    ("SET", "k", "v"),
    ("CONFIG GET", "maxmemory-policy"),  # a name holding a space: sent as two words
    (b"CLIENT SETNAME", b"x"),
    ("HSET", "{p}:meta:AA:BB", "backlog", 3, "weight", 1.5, "wall_ms", 0.000012, "big", 10**20),
    ("RPUSH", "q", "任务|1|3|1700000000000|1800000000000|0|0|0||caller|with|bars"),
    ("SET", "bytes", b"\x00\xff\r\n$*", "mv", memoryview(b"view")),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", *[f"arg{i}" for i in range(3000)], "x" * 10000),
    ("SET", "empty", ""),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_it_packs_every_command_as_redis_py_does(command: tuple[object, ...]) -> None:
    plain = Connection(decode_responses=True)
    fast = fast_packing(Connection)(decode_responses=True)
    assert b"".join(fast.pack_command(*command)) == b"".join(bytes(p) for p in plain.pack_command(*command))


def test_a_pipeline_of_commands_packs_as_redis_py_does() -> None:
    plain, fast = Connection(), fast_packing(Connection)()
    joined = b"".join(fast.pack_commands(COMMANDS))
    assert joined == b"".join(bytes(p) for p in plain.pack_commands(COMMANDS))


def test_each_kind_of_connection_keeps_its_kind_and_the_client_uses_the_fast_one() -> None:
    for kind in (Connection, SSLConnection, UnixDomainSocketConnection):
        fast = fast_packing(kind)
        assert issubclass(fast, kind) and fast is fast_packing(kind)
    for url, kind in (("redis://127.0.0.1:6379/0", Connection), ("unix:///tmp/redis.sock", UnixDomainSocketConnection)):
        client = redis_client(Settings.from_env({}, redis_url=url))
        assert client.connection_pool.connection_class is fast_packing(kind)

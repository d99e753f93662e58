"""Every service as its own process on loopback ports, sharing this test's Redis prefix and schema."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sieve import rpc
from sieve.rpc.auth import credential_line, new_token
from sieve.rpc.devcerts import write_dev_certs
from sieve.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """The service processes of one test. They run with authentication on, as a user gets them: the servers
    read `tokens_file`; `settings` (the test's own client settings) carry the "client" token; each worker
    process gets a worker credential named after its worker id."""

    settings: Settings
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: service name -> its Prometheus address (host:port), for the services started by `cluster`
    metrics: dict[str, str] = field(default_factory=dict)
    #: credential name -> its bearer token ("client", "client-b", "operator", and one per worker id)
    tokens: dict[str, str] = field(default_factory=dict)
    tokens_file: Path | None = None
    #: no credentials at all (SIEVE_ALLOW_ANONYMOUS): workers get no token
    anonymous: bool = False

    @classmethod
    def create(cls, settings: Settings, env: dict[str, str], log_dir: Path, *, security: str = "auth",
               **fields: dict[str, str]) -> Cluster:
        """A cluster whose servers read a fresh credentials file in `log_dir` (with a "client" and an
        "operator" credential); `settings` become the test's client settings. `security` "tls" adds TLS with a
        throw-away CA; "anonymous" runs without credentials (SIEVE_ALLOW_ANONYMOUS; benchmarks compare)."""
        if security == "anonymous":
            env["SIEVE_ALLOW_ANONYMOUS"] = "true"
            return cls(settings.replace(allow_anonymous=True, auth_token=""), env, log_dir, anonymous=True,
                       **fields)  # type: ignore[arg-type]
        tokens_file = log_dir / "credentials"
        tokens_file.write_text("")
        env["SIEVE_AUTH_TOKENS_FILE"] = str(tokens_file)
        if security == "tls":
            certs = write_dev_certs(log_dir / "tls")
            env.update({"SIEVE_TLS_CERT_FILE": str(certs.server_cert), "SIEVE_TLS_KEY_FILE": str(certs.server_key),
                        "SIEVE_TLS_CA_FILE": str(certs.ca)})
            settings = settings.replace(tls_ca_file=str(certs.ca))
        cluster = cls(settings.replace(allow_anonymous=False), env, log_dir, tokens_file=tokens_file, **fields)
        cluster.settings = cluster.settings.replace(auth_token=cluster.credential("client", "client"))
        cluster.credential("operator", "operator")
        return cluster

    def credential(self, name: str, role: str) -> str:
        """The token of credential `name`, created (and added to the servers' file) on first use."""
        if name not in self.tokens:
            assert self.tokens_file is not None
            self.tokens[name] = new_token()
            with self.tokens_file.open("a") as f:
                f.write(credential_line(name, role, self.tokens[name]) + "\n")
        return self.tokens[name]

    def as_caller(self, name: str, role: str = "client") -> Settings:
        """The test's settings with the token of another credential (`operator`, a second client ...)."""
        return self.settings.replace(auth_token=self.credential(name, role))

    @property
    def operator(self) -> Settings:
        return self.as_caller("operator", "operator")

    def start(self, name: str, module: str, **extra_env: str) -> subprocess.Popen[bytes]:
        if module == "worker_svc" and "SIEVE_AUTH_TOKEN" not in extra_env and not self.anonymous:
            worker_id = extra_env.get("SIEVE_WORKER_ID") or name
            extra_env["SIEVE_AUTH_TOKEN"] = self.credential(worker_id.rstrip("/"), "worker")
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env={**self.env, **extra_env},
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def log_of(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    async def wait_healthy(self, address: str, name: str, timeout_s: float = 30) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with rpc.channel(address, self.settings) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_of(name)}")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"{name} not healthy in {timeout_s}s:\n{self.log_of(name)}")
                await asyncio.sleep(0.1)

    def terminate_all(self, timeout_s: float = 20) -> dict[str, int]:
        """SIGTERM in reverse start order (workers first); returns each exit code."""
        codes: dict[str, int] = {}
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                codes[name] = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = -9
        return codes

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of every service process of a test: this process's own, without its SIEVE_*
    variables, plus the test's Redis, schema and addresses (and `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
    env.update({
        "SIEVE_REDIS_URL": settings.redis_url, "SIEVE_REDIS_PREFIX": settings.redis_prefix,
        "SIEVE_DATABASE_URL": settings.database_url, "SIEVE_DATABASE_SCHEMA": settings.database_schema,
        "SIEVE_INTAKE_ADDR": settings.intake_addr, "SIEVE_SCHEDULER_ADDR": settings.scheduler_addr,
        "SIEVE_REGISTRY_ADDR": settings.registry_addr, "SIEVE_LOG_LEVEL": "INFO", "PYTHONPATH": str(ROOT),
        "SIEVE_GRPC_REFLECTION": "true",
    })
    env.update(extra)
    return env


@pytest.fixture
def cluster_env(settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    ports = {name: free_port() for name in ("intake", "scheduler", "registry")}
    settings = settings.replace(intake_addr=f"127.0.0.1:{ports['intake']}",
                                scheduler_addr=f"127.0.0.1:{ports['scheduler']}",
                                registry_addr=f"127.0.0.1:{ports['registry']}")
    # the test's "client" may use every priority (HIGH and CRITICAL are entitlements)
    env = service_env(settings, SIEVE_SHUTDOWN_GRACE_S="10", SIEVE_HOUSEKEEPING_INTERVAL_S="0.5",
                      SIEVE_CALLER_POLICIES="client:priorities=HIGH|CRITICAL")
    metrics = {name: f"127.0.0.1:{free_port()}" for name in ("intake", "scheduler", "registry")}
    env.update({f"SIEVE_{name.upper()}_METRICS_ADDR": addr for name, addr in metrics.items()})
    env["SIEVE_WORKER_METRICS_ADDR"] = "127.0.0.1:0"  # `cluster` gives each worker its own port
    cluster = Cluster.create(settings, env, tmp_path, metrics=metrics)
    yield cluster
    cluster.kill_all()


@pytest.fixture
async def cluster(cluster_env: Cluster, pg: object, redis: object) -> AsyncIterator[Cluster]:
    """Registry, scheduler, intake and two workers, all healthy (pg/redis fixtures clean up after)."""
    c = cluster_env
    s = c.settings
    c.start("registry", "registry_svc")
    await c.wait_healthy(s.registry_addr, "registry")
    c.start("scheduler", "scheduler_svc")
    await c.wait_healthy(s.scheduler_addr, "scheduler")
    c.start("intake", "intake_svc")
    await c.wait_healthy(s.intake_addr, "intake")
    for i in (1, 2):
        port = free_port()
        c.metrics[f"worker-{i}"] = f"127.0.0.1:{free_port()}"
        c.start(f"worker-{i}", "worker_svc", SIEVE_WORKER_ID=f"worker-{i}",
                SIEVE_WORKER_HEALTH_ADDR=f"127.0.0.1:{port}", SIEVE_WORKER_METRICS_ADDR=c.metrics[f"worker-{i}"])
        await c.wait_healthy(f"127.0.0.1:{port}", f"worker-{i}")
    yield c

"""Every service as its own process for a test or a benchmark (started in order by sieve.launch), on loopback
ports of its own, sharing the test's Redis prefix and PostgreSQL schema, with authentication on as a user runs it.

`Cluster` owns a test's service processes and its credentials; `service_env` is the environment they share;
`on_free_ports` puts the three servers of a test's settings on ports nothing uses.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sieve import launch
from sieve.launch import ServiceProcess, Services, StartupError, free_port
from sieve.rpc.auth import credential_line, new_token
from sieve.rpc.devcerts import write_dev_certs
from sieve.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: how long a test waits for a service to serve (s), and how often it asks
HEALTHY_TIMEOUT_S = 30.0
HEALTH_POLL_S = 0.1


def on_free_ports(settings: Settings) -> Settings:
    """`settings` with the intake, scheduler and registry on free loopback ports."""
    ports = {name: free_port() for name in ("intake", "scheduler", "registry")}
    return settings.replace(
        intake_addr=f"127.0.0.1:{ports['intake']}",
        scheduler_addr=f"127.0.0.1:{ports['scheduler']}",
        registry_addr=f"127.0.0.1:{ports['registry']}",
    )


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of every service process of a test: this process's own, without its SIEVE_*
    variables, plus the test's Redis, schema and addresses (and `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
    env.update(
        {
            "SIEVE_REDIS_URL": settings.redis_url,
            "SIEVE_REDIS_PREFIX": settings.redis_prefix,
            "SIEVE_REDIS_SHARDS": str(settings.redis_shards),
            "SIEVE_DATABASE_URL": settings.database_url,
            "SIEVE_DATABASE_SCHEMA": settings.database_schema,
            "SIEVE_INTAKE_ADDR": settings.intake_addr,
            "SIEVE_SCHEDULER_ADDR": settings.scheduler_addr,
            "SIEVE_REGISTRY_ADDR": settings.registry_addr,
            "SIEVE_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT),
            "SIEVE_GRPC_REFLECTION": "true",
        }
    )
    env.update(extra)
    return env


@dataclass(kw_only=True)
class Cluster(Services):
    """The service processes of one test. They run with authentication on, as a user gets them: the servers
    read `tokens_file`; `settings` (the test's own client settings) carry the "client" token; each worker
    process gets a worker credential named after its worker id."""

    settings: Settings
    #: service name -> its Prometheus address (host:port), for the services started with one
    metrics: dict[str, str] = field(default_factory=dict)
    #: credential name -> its bearer token ("client", "client-b", "operator", and one per worker id)
    tokens: dict[str, str] = field(default_factory=dict)
    tokens_file: Path | None = None
    #: no credentials at all (SIEVE_ALLOW_ANONYMOUS): workers get no token
    anonymous: bool = False

    @classmethod
    def create(
        cls,
        settings: Settings,
        env: dict[str, str],
        log_dir: Path,
        *,
        security: str = "auth",
        metrics: dict[str, str] | None = None,
    ) -> Cluster:
        """A cluster whose servers read a fresh credentials file in `log_dir` (with a "client" and an
        "operator" credential); `settings` become the test's client settings. `security` "tls" adds TLS with a
        throw-away CA; "anonymous" runs without credentials (SIEVE_ALLOW_ANONYMOUS; benchmarks compare)."""
        if security == "anonymous":
            env["SIEVE_ALLOW_ANONYMOUS"] = "true"
            return cls(
                env,
                log_dir,
                ROOT,
                settings=settings.replace(allow_anonymous=True, auth_token=""),
                metrics=dict(metrics or {}),
                anonymous=True,
            )
        tokens_file = log_dir / "credentials"
        tokens_file.write_text("")
        env["SIEVE_AUTH_TOKENS_FILE"] = str(tokens_file)
        if security == "tls":
            certs = write_dev_certs(log_dir / "tls")
            env.update(launch.tls_env(certs))
            settings = settings.replace(tls_ca_file=str(certs.ca))
        cluster = cls(
            env,
            log_dir,
            ROOT,
            settings=settings.replace(allow_anonymous=False),
            metrics=dict(metrics or {}),
            tokens_file=tokens_file,
        )
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

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        """Every started process by name (the latest of each name)."""
        return {name: p.proc for name, p in self.processes.items() if p.proc is not None}

    def start(self, name: str, module: str, **extra_env: str) -> ServiceProcess:
        """Starts a service process; a worker gets the token of a worker credential named after its id."""
        if module == launch.WORKER_MODULE and "SIEVE_AUTH_TOKEN" not in extra_env and not self.anonymous:
            worker_id = extra_env.get("SIEVE_WORKER_ID") or name
            extra_env["SIEVE_AUTH_TOKEN"] = self.credential(worker_id.rstrip("/"), "worker")
        return super().start(name, module, **extra_env)

    def log_of(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    async def wait_serving(
        self,
        name: str,
        address: str,
        settings: Settings,
        timeout_s: float = HEALTHY_TIMEOUT_S,
        interval_s: float = HEALTH_POLL_S,
    ) -> None:
        """As Services.wait_serving, failing the test with the end of the service's log."""
        try:
            await super().wait_serving(name, address, settings, timeout_s, interval_s)
        except StartupError as exc:
            raise AssertionError(f"{exc}:\n{self.log_of(name)}") from None

    async def wait_healthy(self, address: str, name: str, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """Waits until process `name` serves at `address` (fails the test when it exits or does not)."""
        await self.wait_serving(name, address, self.settings, timeout_s, HEALTH_POLL_S)

    async def start_in_order(self, env_of: dict[str, dict[str, str]] | None = None) -> None:
        """Registry, scheduler and intake, in order, each healthy before the next starts (`env_of`: extra
        variables of some, by name)."""
        await self.start_servers(self.settings, env_of=env_of, timeout_s=HEALTHY_TIMEOUT_S, interval_s=HEALTH_POLL_S)

    async def add_worker(
        self, name: str, *, metrics: bool = False, timeout_s: float = HEALTHY_TIMEOUT_S, **extra_env: str
    ) -> str:
        """Starts worker `name` (its worker id too) on a free health port, and with a free metrics port of its
        own when `metrics`; returns its health address once it serves there."""
        health = f"127.0.0.1:{free_port()}"
        metrics_addr = None
        if metrics:
            metrics_addr = self.metrics[name] = f"127.0.0.1:{free_port()}"
        self.start_worker(name, health, metrics_addr, **extra_env)
        await self.wait_healthy(health, name, timeout_s)
        return health

    async def start_all(self, workers: int, **worker_env: str) -> None:
        """The servers in order, then `workers` workers (worker-1, worker-2 ...), each with its metrics port."""
        await self.start_in_order()
        for i in range(1, workers + 1):
            await self.add_worker(f"worker-{i}", metrics=True, **worker_env)

    def terminate_all(self, timeout_s: float = 20) -> dict[str, int]:
        """SIGTERM in stop order (workers first); returns each exit code (-9: killed after `timeout_s`)."""
        return {s.name: s.code for s in self.stop(timeout_s)}

    def kill_all(self) -> None:
        self.kill()

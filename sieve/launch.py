"""Starting Sieve's services as processes on one machine, in order, and stopping them in the reverse order.

Owns the start order and the readiness waits: the registry first, then the scheduler (it rebuilds Redis from
PostgreSQL before it serves), then the intake, each waited for until it answers gRPC health SERVING; then the
workers (they register with the registry and pull from the scheduler), each with its own health and metrics
address. Stopping goes the other way, one role at a time: SIGTERM to every worker, wait, then the intake, the
scheduler, the registry; whatever has not exited when the wait ends is killed.

Every process runs `python -m <service>` with the environment it is given, its output in `<log_dir>/<name>.log`.
Used by `deploy/run_local.py` (the one-machine run) and by the test harness (`tests/support/cluster.py`).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sieve import rpc
from sieve.rpc.devcerts import DevCerts
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc

#: how long a service may take to answer SERVING (s), and how often it is asked
READY_TIMEOUT_S = 60.0
POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class Server:
    """One of the three gRPC servers: its process name, its module, and the Settings field of its address."""

    name: str
    module: str
    address_field: str

    def address(self, settings: Settings) -> str:
        return str(getattr(settings, self.address_field))


#: the servers in start order
SERVERS = (
    Server("registry", "registry_svc", "registry_addr"),
    Server("scheduler", "scheduler_svc", "scheduler_addr"),
    Server("intake", "intake_svc", "intake_addr"),
)
WORKER_MODULE = "worker_svc"
#: the roles in stop order (by module): workers first, the registry last
STOP_ORDER = (WORKER_MODULE, "intake_svc", "scheduler_svc", "registry_svc")


class StartupError(RuntimeError):
    """A service did not become ready; the message names it."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def address_in_use(address: str) -> bool:
    """True when something already accepts connections on host:port."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def tls_env(certs: DevCerts) -> dict[str, str]:
    """The variables that make a service serve TLS with `certs` (and trust their CA as a client)."""
    return {
        "SIEVE_TLS_CERT_FILE": str(certs.server_cert),
        "SIEVE_TLS_KEY_FILE": str(certs.server_key),
        "SIEVE_TLS_CA_FILE": str(certs.ca),
    }


def worker_env(
    worker_id: str, health_addr: str, metrics_addr: str | None = None, token: str | None = None
) -> dict[str, str]:
    """The variables that make one worker process: its id, health address, metrics address and token."""
    env = {"SIEVE_WORKER_ID": worker_id, "SIEVE_WORKER_HEALTH_ADDR": health_addr}
    if metrics_addr is not None:
        env["SIEVE_WORKER_METRICS_ADDR"] = metrics_addr
    if token is not None:
        env["SIEVE_AUTH_TOKEN"] = token
    return env


@dataclass
class ServiceProcess:
    """One service process (`python -m <module>`) and its log file."""

    name: str
    module: str
    env: dict[str, str]
    log_path: Path
    cwd: Path
    #: its own session: a Ctrl-C at the terminal reaches only the launcher, which stops the services in order
    own_session: bool = False
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115  (closed in close_log)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=self.own_session,
        )

    def exited(self) -> int | None:
        """Its exit code, None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int) -> str:
        """The last `lines` lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        return "\n".join(text[-lines:]) or "(log is empty)"

    def close_log(self) -> None:
        if self.log_file is not None:
            self.log_file.close()


@dataclass(frozen=True, slots=True)
class Stopped:
    """How one process ended: its exit code, and whether it had to be killed."""

    name: str
    code: int
    killed: bool


async def serving(address: str, settings: Settings, timeout_s: float = 1.0) -> bool:
    """True when the server at `address` answers gRPC health SERVING (dialled as `settings` say)."""
    async with rpc.channel(address, settings) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(  # type: ignore[attr-defined]  # grpc-stubs' HealthStub declares no methods
                health_pb2.HealthCheckRequest(service=""),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def wait_serving(
    process: ServiceProcess,
    address: str,
    settings: Settings,
    timeout_s: float = READY_TIMEOUT_S,
    interval_s: float = POLL_S,
) -> None:
    """Waits until `process` answers SERVING on grpc.health.v1 at `address`; StartupError when it exits first
    or does not within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        code = process.exited()
        if code is not None:
            raise StartupError(f"{process.name} exited with code {code} while starting")
        if await serving(address, settings):
            return
        if loop.time() > deadline:
            raise StartupError(
                f"{process.name} did not answer gRPC health SERVING on {address} within {timeout_s:.0f}s"
            )
        await asyncio.sleep(interval_s)


async def wait_registered(
    process: ServiceProcess,
    worker_id: str,
    settings: Settings,
    timeout_s: float = READY_TIMEOUT_S,
    interval_s: float = POLL_S,
) -> bool:
    """Waits until the registry at `settings.registry_addr` lists `worker_id` (`settings` carry a token that may
    list workers); False, at once, when that registry has no ListWorkers. StartupError when the worker exits
    first or is not listed within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with rpc.channel(settings.registry_addr, settings) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        while loop.time() < deadline:
            code = process.exited()
            if code is not None:
                raise StartupError(f"{process.name} exited with code {code} while starting")
            try:
                reply = await stub.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=2.0)
                if any(w.worker_id == worker_id for w in reply.workers):
                    return True
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return False
            await asyncio.sleep(interval_s)
    raise StartupError(f"{process.name} did not register as {worker_id} within {timeout_s:.0f}s")


@dataclass
class Services:
    """The service processes of one run: what they share (environment, log folder, working directory), and
    their start and stop in order. `processes` holds the latest process of each name, in start order."""

    env: dict[str, str]
    log_dir: Path
    cwd: Path
    own_session: bool = False
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    def start(self, name: str, module: str, **extra_env: str) -> ServiceProcess:
        """Starts `python -m module` as process `name`, with the shared environment and `extra_env`."""
        process = ServiceProcess(
            name, module, {**self.env, **extra_env}, self.log_dir / f"{name}.log", self.cwd, self.own_session
        )
        self.processes[name] = process
        process.start()
        return process

    def start_worker(
        self,
        worker_id: str,
        health_addr: str,
        metrics_addr: str | None = None,
        token: str | None = None,
        **extra_env: str,
    ) -> ServiceProcess:
        """Starts a worker process named after its id (not waited for)."""
        return self.start(
            worker_id, WORKER_MODULE, **{**worker_env(worker_id, health_addr, metrics_addr, token), **extra_env}
        )

    async def wait_serving(
        self,
        name: str,
        address: str,
        settings: Settings,
        timeout_s: float = READY_TIMEOUT_S,
        interval_s: float = POLL_S,
    ) -> None:
        await wait_serving(self.processes[name], address, settings, timeout_s, interval_s)

    async def start_servers(
        self,
        settings: Settings,
        *,
        env_of: Mapping[str, Mapping[str, str]] | None = None,
        announce: Callable[[Server, str], None] | None = None,
        timeout_s: float = READY_TIMEOUT_S,
        interval_s: float = POLL_S,
    ) -> None:
        """Registry, scheduler and intake at the addresses `settings` name, each started once the one before
        serves; `env_of` adds variables to some (by name), `announce(server, address)` runs before each start."""
        for server in SERVERS:
            address = server.address(settings)
            if announce is not None:
                announce(server, address)
            self.start(server.name, server.module, **(env_of or {}).get(server.name, {}))
            await self.wait_serving(server.name, address, settings, timeout_s, interval_s)

    def stop(self, timeout_s: float, report: Callable[[Stopped], None] | None = None) -> list[Stopped]:
        """SIGTERM one role at a time (STOP_ORDER; a module not named there goes first), each role given
        `timeout_s` to exit before what is left of it is killed; `report` hears of each process as it ends."""
        rank = {module: i for i, module in enumerate(STOP_ORDER)}
        started = [p for p in self.processes.values() if p.proc is not None]
        stopped: list[Stopped] = []
        for i in range(-1, len(STOP_ORDER)):
            stopped += _stop_together([p for p in started if rank.get(p.module, -1) == i], timeout_s, report)
        return stopped

    def kill(self) -> None:
        """SIGKILL every process still running (the end of a test, whatever happened)."""
        for process in self.processes.values():
            if process.proc is not None and process.proc.poll() is None:
                process.proc.kill()
                process.proc.wait()
            process.close_log()


def _stop_together(
    group: list[ServiceProcess], timeout_s: float, report: Callable[[Stopped], None] | None
) -> list[Stopped]:
    """SIGTERM to every process of `group` at once, then each waited for until one deadline, killed after it."""
    for process in group:
        if process.proc is not None and process.proc.poll() is None:
            process.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    stopped: list[Stopped] = []
    for process in group:
        assert process.proc is not None
        killed = False
        try:
            process.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.proc.kill()
            process.proc.wait()
            killed = True
        process.close_log()
        stopped.append(Stopped(process.name, process.proc.returncode, killed))
        if report is not None:
            report(stopped[-1])
    return stopped

"""The one command that runs all of Sieve on one machine, runs the demo against it, and stops it again.

    python deploy/run_local.py [--workers N] [--demo-tasks 400] [--demo-devices 40] [--tls] [--keep-running]

Owns the local start-up: Redis and PostgreSQL come from `deploy/embedded.py` (the ones named by
SIEVE_REDIS_URL / SIEVE_DATABASE_URL, else the local servers on 6379 / 5432, else embedded ones kept in
`.sieve-data/`); then `registry_svc`, `scheduler_svc`, `intake_svc` and N `worker_svc` processes start, each
waited for (gRPC health SERVING; workers also until the registry lists them; 60 s each). Authentication is
on, as everywhere: each run makes fresh tokens (a client, an operator, one per worker), gives the servers
only their hashes (`.sieve-data/credentials`) and prints the client and operator tokens; reflection is on for
grpcurl. `--tls` makes a throw-away CA (`.sieve-data/tls/`) and runs every server with TLS. Every
child's output goes to `.sieve-data/logs/<name>.log`; when one fails to start, the last 30 lines of its log
are printed. Then `deploy/demo.py` runs and its summary is printed. Without --keep-running everything is
stopped (SIGTERM, at most 15 s, then SIGKILL) and the exit codes are reported; with it, everything runs until
Ctrl-C or SIGTERM. Exit status 0 only when the demo succeeded and every service stopped cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the repository's `sieve` package importable
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo  # noqa: E402  (deploy/demo.py, beside this file)
import embedded  # noqa: E402  (deploy/embedded.py)
import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from sieve.rpc.auth import credential_line, new_token  # noqa: E402
from sieve.rpc.devcerts import DevCerts, write_dev_certs  # noqa: E402
from sieve.settings import Settings  # noqa: E402
from sieve.v1 import registry_pb2, registry_pb2_grpc  # noqa: E402

DATA_DIR = REPO / ".sieve-data"
LOG_DIR = DATA_DIR / "logs"
CREDENTIALS = DATA_DIR / "credentials"
TLS_DIR = DATA_DIR / "tls"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 30


class StartupError(RuntimeError):
    """A service did not become ready; the message names it."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived."""


@dataclass
class Child:
    """One service process and its log."""

    name: str
    module: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        # Own session: a Ctrl-C at the terminal reaches only this runner, which stops children in order.
        self.proc = subprocess.Popen([sys.executable, "-m", self.module], cwd=REPO, env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        return "\n".join(text[-lines:]) or "(log is empty)"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def address_in_use(address: str) -> bool:
    """True when something already accepts connections on host:port."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_metrics_addr(base: str, index: int) -> str:
    """Worker `index`'s metrics address: the configured one with its port moved up by index (0 stays 0)."""
    host, _, port = base.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return base
    return f"{host}:{int(port) + index}"


@dataclass
class Credentials:
    """The tokens of one local run; the servers get only their hashes, in `CREDENTIALS`."""

    client: str
    operator: str
    workers: dict[str, str]

    @classmethod
    def fresh(cls, worker_ids: Sequence[str]) -> Credentials:
        made = cls(new_token(), new_token(), {w: new_token() for w in worker_ids})
        lines = [credential_line("local-client", "client", made.client),
                 credential_line("local-operator", "operator", made.operator),
                 *(credential_line(w, "worker", t) for w, t in made.workers.items())]
        CREDENTIALS.write_text("\n".join(lines) + "\n")
        os.chmod(CREDENTIALS, 0o600)
        return made


def child_env(redis_url: str, database_url: str, certs: DevCerts | None = None) -> dict[str, str]:
    """The environment every service gets: ours plus the chosen Redis/PostgreSQL, the run's credentials file,
    reflection on, and the TLS files when `certs` are given."""
    env = dict(os.environ)
    env["SIEVE_REDIS_URL"] = redis_url
    env["SIEVE_DATABASE_URL"] = database_url
    env["SIEVE_AUTH_TOKENS_FILE"] = str(CREDENTIALS)
    env["SIEVE_GRPC_REFLECTION"] = "true"
    if certs is not None:
        env.update({"SIEVE_TLS_CERT_FILE": str(certs.server_cert), "SIEVE_TLS_KEY_FILE": str(certs.server_key),
                    "SIEVE_TLS_CA_FILE": str(certs.ca)})
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.pop("SIEVE_FORCE_EMBEDDED", None)
    return env


def _sync_channel(address: str, settings: Settings) -> grpc.Channel:
    if not settings.tls_ca_file:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(Path(settings.tls_ca_file).read_bytes()))


def _health_once(address: str, settings: Settings) -> bool:
    with _sync_channel(address, settings) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                             timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def wait_serving(child: Child, address: str, settings: Settings, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Waits until `child` answers SERVING on grpc.health.v1 at `address`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = child.exited()
        if code is not None:
            raise StartupError(f"{child.name} exited with code {code} while starting")
        if _health_once(address, settings):
            return
        time.sleep(0.25)
    raise StartupError(
        f"{child.name} did not answer gRPC health SERVING on {address} within {timeout_s:.0f}s")


def wait_registered(child: Child, worker_id: str, settings: Settings, operator_token: str,
                    timeout_s: float = READY_TIMEOUT_S) -> None:
    """Waits until the registry lists `worker_id` (a worker serves no gRPC of its own)."""
    deadline = time.monotonic() + timeout_s
    metadata = [("authorization", f"Bearer {operator_token}")]
    with _sync_channel(settings.registry_addr, settings) as channel:
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        while time.monotonic() < deadline:
            code = child.exited()
            if code is not None:
                raise StartupError(f"{child.name} exited with code {code} while starting")
            try:
                reply = stub.ListWorkers(registry_pb2.ListWorkersRequest(), timeout=2.0, metadata=metadata)
                if any(w.worker_id == worker_id for w in reply.workers):
                    return
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
                    print(f"  (registry has no ListWorkers; assuming {child.name} is up)")
                    return
            time.sleep(0.25)
    raise StartupError(f"{child.name} did not register as {worker_id} within {timeout_s:.0f}s")


def stop_children(children: Sequence[Child], timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM each group (workers first, registry last), waits, SIGKILLs stragglers; True when all clean."""
    clean = True
    order = ["worker", "intake", "scheduler", "registry"]
    groups = [[c for c in children if c.name.startswith(prefix)] for prefix in order]
    for group in groups:
        running = [c for c in group if c.proc is not None and c.proc.poll() is None]
        for c in running:
            c.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        for c in group:
            if c.proc is None:
                continue
            how = "exited"
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
                how = f"KILLED after {timeout_s:.0f}s"
                clean = False
            code = c.proc.returncode
            if code != 0 and how == "exited":
                clean = False
            print(f"  {c.name:<12} {how}, exit code {code}")
            if c.log_file is not None:
                c.log_file.close()
    return clean


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run every Sieve service on this machine and run the demo.")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--demo-tasks", type=int, default=400, help="tasks the demo submits (0: no demo)")
    parser.add_argument("--demo-devices", type=int, default=40, help="devices the demo spreads them over")
    parser.add_argument("--demo-timeout", type=float, default=120.0,
                        help="seconds the demo waits for results")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the demo")
    parser.add_argument("--keep-running", action="store_true", help="after the demo, run until Ctrl-C")
    parser.add_argument("--tls", action="store_true",
                        help="serve TLS with a throw-away CA made in .sieve-data/tls (grpcurl: -cacert ca.pem)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # keep progress and errors in order when piped to a file
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    signal.signal(signal.SIGTERM, _on_sigterm)
    children: list[Child] = []
    ok = False
    try:
        print(f"data and logs in {DATA_DIR}")
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        redis_url = embedded.ensure_redis(DATA_DIR)
        print(f"redis:      {redis_url}")
        database_url = embedded.ensure_postgres(DATA_DIR)
        print(f"postgresql: {database_url}")
        if embedded.started():
            print(f"  (embedded, started here: {', '.join(embedded.started())})")

        worker_ids = [f"worker-{i}" for i in range(args.workers)]
        credentials = Credentials.fresh(worker_ids)
        certs = write_dev_certs(TLS_DIR) if args.tls else None
        env = child_env(redis_url, database_url, certs)
        settings = Settings.from_env(env)
        servers = [("registry", "registry_svc", settings.registry_addr),
                   ("scheduler", "scheduler_svc", settings.scheduler_addr),
                   ("intake", "intake_svc", settings.intake_addr)]
        busy = [f"{addr} ({name})" for name, _, addr in servers if address_in_use(addr)]
        if busy:
            raise StartupError(f"already in use: {', '.join(busy)}; stop what runs there or set "
                               "SIEVE_REGISTRY_ADDR / SIEVE_SCHEDULER_ADDR / SIEVE_INTAKE_ADDR")

        for name, module, addr in servers:
            child = Child(name, module, env, LOG_DIR / f"{name}.log")
            children.append(child)
            print(f"starting {name:<10} ({module}) on {addr}")
            child.start()
            wait_serving(child, addr, settings)
        workers: list[tuple[Child, str]] = []
        for i, worker_id in enumerate(worker_ids):
            health_addr = f"127.0.0.1:{free_port()}"
            metrics_addr = worker_metrics_addr(settings.worker_metrics_addr, i)
            child = Child(worker_id, "worker_svc",
                          {**env, "SIEVE_WORKER_ID": worker_id, "SIEVE_AUTH_TOKEN": credentials.workers[worker_id],
                           "SIEVE_WORKER_HEALTH_ADDR": health_addr,
                           "SIEVE_WORKER_METRICS_ADDR": metrics_addr},
                          LOG_DIR / f"{worker_id}.log")
            children.append(child)
            workers.append((child, health_addr))
            print(f"starting {worker_id:<10} (worker_svc), health on {health_addr}, metrics on {metrics_addr}")
            child.start()
        for child, health_addr in workers:
            wait_serving(child, health_addr, settings)
            wait_registered(child, child.name, settings, credentials.operator)
        print(f"all services ready: {len(servers)} servers, {args.workers} workers")
        print("tokens of this run (the servers hold only their SHA-256 hashes, in "
              f"{CREDENTIALS.relative_to(REPO)}); for grpcurl:")
        print(f"  export SIEVE_CLIENT_TOKEN={credentials.client} SIEVE_OPERATOR_TOKEN={credentials.operator}")
        if certs is not None:
            print(f"TLS on: CA {certs.ca} (grpcurl -cacert {certs.ca} instead of -plaintext)")
        print(f"metrics: intake {settings.intake_metrics_addr}, scheduler {settings.scheduler_metrics_addr}, "
              f"registry {settings.registry_metrics_addr} (/metrics)")
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_TRACES_EXPORTER"):
            print(f"traces: {env.get('OTEL_EXPORTER_OTLP_ENDPOINT') or env.get('OTEL_TRACES_EXPORTER')}")

        ok = True
        if args.demo_tasks > 0:
            print(f"demo: {args.demo_tasks} tasks over {args.demo_devices} devices -> {settings.intake_addr}")
            client = settings.replace(auth_token=credentials.client)
            report = asyncio.run(demo.run_demo(client, args.demo_tasks, args.demo_devices,
                                               args.demo_timeout, args.seed))
            demo.print_summary(report)
            ok = report.ok

        if args.keep_running:
            print(f"running; intake {settings.intake_addr}; logs in {LOG_DIR}. "
                  "Ctrl-C stops everything.")
            while True:
                for child in children:
                    if child.exited() is not None:
                        raise StartupError(f"{child.name} exited with code {child.exited()}")
                time.sleep(1.0)
    except StartupError as exc:
        ok = False
        print(f"FAILED: {exc}", file=sys.stderr)
        for child in children:
            if child.name in str(exc) or child.exited() not in (None, 0):
                print(f"--- last {LOG_TAIL_LINES} lines of {child.log_path} ---\n{child.tail()}\n---",
                      file=sys.stderr)
    except embedded.EmbeddedError as exc:
        ok = False
        print(f"FAILED: {exc}", file=sys.stderr)
    except (KeyboardInterrupt, Interrupted):
        print("\ninterrupted; stopping")
    except Exception as exc:
        ok = False
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if children:
            print("stopping services")
            if not stop_children(children):
                ok = False
        stopped = embedded.started()
        embedded.stop_all()
        if stopped:
            print(f"stopped embedded {', '.join(stopped)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

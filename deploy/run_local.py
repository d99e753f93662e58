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
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the repository's `sieve` package importable
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo  # noqa: E402  (deploy/demo.py, beside this file)
import embedded  # noqa: E402  (deploy/embedded.py)

from sieve import launch  # noqa: E402
from sieve.launch import Services, StartupError, Stopped, address_in_use  # noqa: E402
from sieve.rpc.auth import credential_line, new_token  # noqa: E402
from sieve.rpc.devcerts import DevCerts, write_dev_certs  # noqa: E402
from sieve.settings import Settings  # noqa: E402

DATA_DIR = REPO / ".sieve-data"
LOG_DIR = DATA_DIR / "logs"
CREDENTIALS = DATA_DIR / "credentials"
TLS_DIR = DATA_DIR / "tls"
READY_TIMEOUT_S = launch.READY_TIMEOUT_S
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 30


class Interrupted(Exception):
    """Ctrl-C or SIGTERM arrived."""


@dataclass
class Outcome:
    """What the run has shown so far: True once every service is ready, then the demo's verdict."""

    ok: bool = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


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
        lines = [
            credential_line("local-client", "client", made.client),
            credential_line("local-operator", "operator", made.operator),
            *(credential_line(w, "worker", t) for w, t in made.workers.items()),
        ]
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
        env.update(launch.tls_env(certs))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.pop("SIEVE_FORCE_EMBEDDED", None)
    return env


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run every Sieve service on this machine and run the demo.")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--demo-tasks", type=int, default=400, help="tasks the demo submits (0: no demo)")
    parser.add_argument("--demo-devices", type=int, default=40, help="devices the demo spreads them over")
    parser.add_argument("--demo-timeout", type=float, default=120.0, help="seconds the demo waits for results")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the demo")
    parser.add_argument("--keep-running", action="store_true", help="after the demo, run until Ctrl-C")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="serve TLS with a throw-away CA made in .sieve-data/tls (grpcurl: -cacert ca.pem)",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


def stores() -> tuple[str, str]:
    """The Redis and PostgreSQL URLs of this run (embedded servers started when there are none)."""
    redis_url = embedded.ensure_redis(DATA_DIR)
    print(f"redis:      {redis_url}")
    database_url = embedded.ensure_postgres(DATA_DIR)
    print(f"postgresql: {database_url}")
    if embedded.started():
        print(f"  (embedded, started here: {', '.join(embedded.started())})")
    return redis_url, database_url


def refuse_busy_addresses(settings: Settings) -> None:
    busy = [
        f"{server.address(settings)} ({server.name})"
        for server in launch.SERVERS
        if address_in_use(server.address(settings))
    ]
    if busy:
        raise StartupError(
            f"already in use: {', '.join(busy)}; stop what runs there or set "
            "SIEVE_REGISTRY_ADDR / SIEVE_SCHEDULER_ADDR / SIEVE_INTAKE_ADDR"
        )


async def start_services(
    services: Services, settings: Settings, credentials: Credentials, worker_ids: Sequence[str]
) -> None:
    """The servers in order, then every worker; each waited for (gRPC health SERVING; a worker also until the
    registry lists it, as a worker serves no gRPC of its own)."""

    def announce(server: launch.Server, address: str) -> None:
        print(f"starting {server.name:<10} ({server.module}) on {address}")

    await services.start_servers(settings, announce=announce, timeout_s=READY_TIMEOUT_S)
    workers: list[tuple[launch.ServiceProcess, str]] = []
    for i, worker_id in enumerate(worker_ids):
        health_addr = f"127.0.0.1:{launch.free_port()}"
        metrics_addr = worker_metrics_addr(settings.worker_metrics_addr, i)
        print(f"starting {worker_id:<10} (worker_svc), health on {health_addr}, metrics on {metrics_addr}")
        workers.append(
            (services.start_worker(worker_id, health_addr, metrics_addr, credentials.workers[worker_id]), health_addr)
        )
    operator = settings.replace(auth_token=credentials.operator)
    for process, health_addr in workers:
        await launch.wait_serving(process, health_addr, settings, READY_TIMEOUT_S)
        if not await launch.wait_registered(process, process.name, operator, READY_TIMEOUT_S):
            print(f"  (registry has no ListWorkers; assuming {process.name} is up)")


def print_ready(
    settings: Settings, credentials: Credentials, certs: DevCerts | None, env: dict[str, str], workers: int
) -> None:
    print(f"all services ready: {len(launch.SERVERS)} servers, {workers} workers")
    print(
        "tokens of this run (the servers hold only their SHA-256 hashes, in "
        f"{CREDENTIALS.relative_to(REPO)}); for grpcurl:"
    )
    print(f"  export SIEVE_CLIENT_TOKEN={credentials.client} SIEVE_OPERATOR_TOKEN={credentials.operator}")
    if certs is not None:
        print(f"TLS on: CA {certs.ca} (grpcurl -cacert {certs.ca} instead of -plaintext)")
    print(
        f"metrics: intake {settings.intake_metrics_addr}, scheduler {settings.scheduler_metrics_addr}, "
        f"registry {settings.registry_metrics_addr} (/metrics)"
    )
    if settings.console_addr.strip():  # the scheduler's web console (README "Web console")
        print(f"console: http://{settings.console_addr}/?token={credentials.operator}")
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_TRACES_EXPORTER"):
        print(f"traces: {env.get('OTEL_EXPORTER_OTLP_ENDPOINT') or env.get('OTEL_TRACES_EXPORTER')}")


def run_demo(args: argparse.Namespace, settings: Settings, credentials: Credentials) -> bool:
    print(f"demo: {args.demo_tasks} tasks over {args.demo_devices} devices -> {settings.intake_addr}")
    client = settings.replace(auth_token=credentials.client)
    report = asyncio.run(demo.run_demo(client, args.demo_tasks, args.demo_devices, args.demo_timeout, args.seed))
    demo.print_summary(report)
    return bool(report.ok)


def keep_running(settings: Settings, services: Services) -> None:
    """Until Ctrl-C or SIGTERM; StartupError when a service exits meanwhile."""
    print(f"running; intake {settings.intake_addr}; logs in {LOG_DIR}. Ctrl-C stops everything.")
    while True:
        for process in services.processes.values():
            if process.exited() is not None:
                raise StartupError(f"{process.name} exited with code {process.exited()}")
        time.sleep(1.0)


def run(args: argparse.Namespace, services: Services, outcome: Outcome) -> None:
    """Stores, credentials, every service, then the demo (and the wait, with --keep-running)."""
    print(f"data and logs in {DATA_DIR}")
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    redis_url, database_url = stores()
    worker_ids = [f"worker-{i}" for i in range(args.workers)]
    credentials = Credentials.fresh(worker_ids)
    certs = write_dev_certs(TLS_DIR) if args.tls else None
    services.env.update(child_env(redis_url, database_url, certs))
    settings = Settings.from_env(services.env)
    refuse_busy_addresses(settings)
    asyncio.run(start_services(services, settings, credentials, worker_ids))
    print_ready(settings, credentials, certs, services.env, args.workers)
    outcome.ok = True
    if args.demo_tasks > 0:
        outcome.ok = run_demo(args, settings, credentials)
    if args.keep_running:
        keep_running(settings, services)


def print_failure(exc: Exception, services: Services) -> None:
    """What went wrong; for a service that did not start, the end of its log (and of any that exited)."""
    if isinstance(exc, StartupError):
        print(f"FAILED: {exc}", file=sys.stderr)
        for process in services.processes.values():
            if process.name in str(exc) or process.exited() not in (None, 0):
                print(
                    f"--- last {LOG_TAIL_LINES} lines of {process.log_path} ---\n{process.tail(LOG_TAIL_LINES)}\n---",
                    file=sys.stderr,
                )
    elif isinstance(exc, embedded.EmbeddedError):
        print(f"FAILED: {exc}", file=sys.stderr)
    else:
        print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)


def print_stopped(stopped: Stopped) -> None:
    how = f"KILLED after {STOP_TIMEOUT_S:.0f}s" if stopped.killed else "exited"
    print(f"  {stopped.name:<12} {how}, exit code {stopped.code}")


def shut_down(services: Services) -> bool:
    """Every service stopped in order, then the embedded stores; True when every service exited with 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    clean = True
    if services.processes:
        print("stopping services")
        stopped = services.stop(STOP_TIMEOUT_S, report=print_stopped)
        clean = all(s.code == 0 and not s.killed for s in stopped)
    started = embedded.started()
    embedded.stop_all()
    if started:
        print(f"stopped embedded {', '.join(started)}")
    return clean


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # keep progress and errors in order when piped to a file
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Every service in a session of its own: a Ctrl-C at the terminal reaches only this runner, which stops
    # them in order.
    services = Services({}, LOG_DIR, REPO, own_session=True)
    outcome = Outcome()
    try:
        run(args, services, outcome)
    except (KeyboardInterrupt, Interrupted):
        print("\ninterrupted; stopping")
    except Exception as exc:
        outcome.ok = False
        print_failure(exc, services)
    finally:
        clean = shut_down(services)
    return 0 if outcome.ok and clean else 1


if __name__ == "__main__":
    sys.exit(main())

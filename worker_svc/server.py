"""The worker process: `build` starts a `WorkerApp` (worker_svc/app.py), `main` runs it until SIGTERM.

`python -m worker_svc` calls `run`. A worker serves gRPC health and its periodic jobs (JobsService) only (on
worker_health_addr); its work goes over the Pull stream it opens to the scheduler. SIGTERM: no new credits,
in-flight tasks finish and are acked, the stream closes, then the process exits.
"""

from __future__ import annotations

from sieve import rpc
from sieve.observe.logs import setup_logging
from sieve.observe.metrics import REGISTRY, start_metrics_server
from sieve.observe.telemetry import setup_telemetry
from sieve.rpc.auth import AuthError, client_token
from sieve.rpc.readiness import Built, Readiness, Stores
from sieve.settings import Settings
from worker_svc.app import WorkerApp
from worker_svc.cpu_priority import lower_cpu_priority
from worker_svc.external.app import ExternalApp
from worker_svc.metrics import WorkerCollector


async def build(settings: Settings, stores: Stores) -> WorkerApp | ExternalApp:
    """A started worker on these stores (PostgreSQL only): lexicon and OCR engine loaded, registry and Pull
    loops running (they retry on their own); with SIEVE_WORKER_ROLE=external the external engine (PostgreSQL and
    Redis: its slot pools) instead. A failed start closes what was started and raises."""
    app: WorkerApp | ExternalApp
    if settings.worker_role == "external":
        app = ExternalApp(settings, stores.pool, stores.redis)
    else:
        app = WorkerApp(settings, stores.pool)
    try:
        await app.start()
    except BaseException:
        await app.close()
        raise
    return app


async def main() -> None:
    settings = Settings.from_env()
    # every thread there is now, and those started later (they inherit it), runs at the worker's nice value
    lower_cpu_priority(settings.worker_nice)
    setup_logging("sieve-worker", settings.log_level)
    # a worker's credential is the token it calls the scheduler and registry with: none, no start
    if not settings.allow_anonymous and not client_token(settings.auth_token, settings.auth_token_file):
        raise AuthError(
            "sieve-worker: no credential to call the scheduler and registry with (SIEVE_AUTH_TOKEN or "
            "SIEVE_AUTH_TOKEN_FILE); set SIEVE_ALLOW_ANONYMOUS=true to run without authentication"
        )
    setup_telemetry("sieve-worker", settings)
    start_metrics_server(settings.worker_metrics_addr)

    async def build_step(stores: Stores) -> Built:
        app = await build(settings, stores)
        if isinstance(app, WorkerApp):
            REGISTRY.register(WorkerCollector(app))
        return Built(app.service, close=app.close)

    # the health server listens at once (NOT_SERVING) and serves once PostgreSQL answers (sieve/rpc/readiness.py)
    external = settings.worker_role == "external"  # the engine's slot pools are in Redis
    readiness = Readiness(settings, "sieve-worker", [], build_step, redis=external, postgres=True)
    await readiness.run(settings.worker_health_addr)


def run() -> None:
    rpc.run_main(main)

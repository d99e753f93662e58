"""Start in any order: a service listens at once and serves when its stores are there.

A service whose Redis or PostgreSQL is not reachable yet (or any more) does not exit: `Readiness` starts its
gRPC server first with health NOT_SERVING, then a loop connects the stores with capped, jittered backoff
(0.5 s doubling to SIEVE_STORE_RETRY_MAX_S, one log line per attempt naming the store and the error), builds
the service on them once (`build`), runs its start-up step (`Built.before_serving`: the scheduler's rebuild of
Redis from PostgreSQL) and turns health SERVING. Afterwards it probes the stores every
SIEVE_STORE_PROBE_INTERVAL_S (PING on Redis, SELECT 1 on PostgreSQL, each within PROBE_TIMEOUT_S); a failed
probe turns health NOT_SERVING and the loop waits for the stores again, running `before_serving` once more
before SERVING (after a Redis restart the scheduler rebuilds it). No restart is needed at any point. The
health name `liveness` stays SERVING meanwhile (for liveness probes: waiting is not dead).

RPCs that arrive while the service is not serving get UNAVAILABLE with the reason (the servicers may not
exist yet): the service's handlers are registered with a guard (`_Routes`) instead of the gRPC server, and
its interceptors and audit sink are reached through forwarding ones. Redis connections are checked for
`maxmemory-policy noeviction` (sieve.redis.connection.EvictionCheck) on every connect.

Errors of reaching a store are waited out (refused or timed-out connections, a store starting up or shutting
down, a missing role or database an init job may still create, the eviction policy), and so is any error of
`before_serving` (idempotent; logged with its stack); any other error of the build (a failed migration, an OCR
engine that does not load, bad settings) ends the process as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from sieve import rpc
from sieve.backoff import Backoff
from sieve.db import Warm, create_pool
from sieve.redis.connection import EvictionCheck, EvictionPolicyError, ping, probe_client, redis_client, redis_location
from sieve.rpc.audit import AuditSink, LogSink
from sieve.rpc.auth import refusing_handler
from sieve.settings import Settings

log = logging.getLogger("sieve.rpc.readiness")

#: first wait between two tries to reach the stores (doubling up to settings.store_retry_max_s)
RETRY_BASE_S = 0.5
#: longest a connect, a check or a probe of one store may take
PROBE_TIMEOUT_S = 3.0
#: a health service name that is SERVING while the process runs, stores or not (Kubernetes liveness and
#: startup probes ask for it; readiness asks for "", which is SERVING only while the service serves)
LIVENESS = "liveness"

#: errors that mean "the store is not there (yet)": waited out, never fatal
STORE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # refused, reset, unreachable, DNS not resolvable yet; TimeoutError is one too
    RedisConnectionError,  # includes BusyLoadingError (Redis loading its data) and AuthenticationError
    RedisTimeoutError,
    RedisClusterException,  # a cluster client that no node answers
    EvictionPolicyError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,  # a pooled connection closed under us
    # a pooled connection the server ended in the middle of an operation ("cannot switch to state 12; another
    # operation (2) is in progress"): that connection is done for, not the store
    asyncpg.InternalClientError,
    asyncpg.OperatorInterventionError,  # starting up, shutting down, terminated by an admin
    asyncpg.InvalidAuthorizationSpecificationError,  # the role (or its password) is not created yet
    asyncpg.InvalidCatalogNameError,  # the database is not created yet
    asyncpg.TooManyConnectionsError,
)


def postgres_location(url: str) -> str:
    """Where a PostgreSQL URL points, without its credentials (for log lines)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or ''}"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().rstrip(".")
    if isinstance(exc, TimeoutError) and not text:
        text = f"no answer within {PROBE_TIMEOUT_S:g} s"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class StoreUnavailable(Exception):
    """One store could not be used; the message names it and says why."""

    def __init__(self, store: str, cause: BaseException) -> None:
        self.store = store
        self.cause = cause
        super().__init__(str(cause) if isinstance(cause, EvictionPolicyError) else f"{store}: {_describe(cause)}")

    @property
    def kind(self) -> str:
        """ "Redis", "PostgreSQL" or "start-up step": what callers are told (not where it is, nor the error)."""
        return self.store.split(" at ", 1)[0]


#: what `Readiness` waits out while it starts: a store that failed, or one of the errors it raises directly
NOT_READY_YET: tuple[type[BaseException], ...] = (StoreUnavailable, *STORE_ERRORS)


class Stores:
    """The store clients of one process, created by `Readiness` (Redis lazily, PostgreSQL once reachable)."""

    def __init__(self) -> None:
        self._redis: Redis | None = None
        self._pool: asyncpg.Pool | None = None

    @classmethod
    def of(cls, redis: Redis | None = None, pool: asyncpg.Pool | None = None) -> Stores:
        """Stores around clients made elsewhere (tests, and processes that run several services in one loop)."""
        stores = cls()
        stores._redis, stores._pool = redis, pool
        return stores

    @property
    def redis(self) -> Redis:
        assert self._redis is not None, "this service was not configured with Redis"
        return self._redis

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "this service was not configured with PostgreSQL"
        return self._pool


@dataclass
class Built:
    """What a service's build step hands back."""

    service: rpc.Service
    #: runs before every turn to SERVING (the first one and after each recovery); idempotent
    before_serving: Callable[[], Awaitable[object]] | None = None
    #: runs at shutdown after the server stopped (the worker closes its parts here)
    close: Callable[[], Awaitable[None]] | None = None


Build = Callable[[Stores], Awaitable[Built]]


def _method_shapes(service_names: Sequence[str]) -> dict[str, tuple[bool, bool]]:
    """ "/pkg.Service/Method" -> (client streaming, server streaming), from the default descriptor pool."""
    shapes: dict[str, tuple[bool, bool]] = {}
    pool = descriptor_pool.Default()  # type: ignore[no-untyped-call]  # types-protobuf leaves it unannotated
    for name in service_names:
        try:
            service = pool.FindServiceByName(name)
        except KeyError:
            continue
        for method in service.methods:
            shapes[f"/{name}/{method.name}"] = (method.client_streaming, method.server_streaming)
    return shapes


def _unavailable(
    message: Callable[[], str], streaming_request: bool, streaming_response: bool
) -> grpc.RpcMethodHandler[Any, Any]:
    return refusing_handler(grpc.StatusCode.UNAVAILABLE, message, streaming_request, streaming_response)


class _Capture:
    """Stands in for the gRPC server while a built service registers its handlers."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service_name: str, handlers: dict[str, Any]) -> None:
        """The same handlers as the generic ones (which `_Routes` consults per call)."""


class _Routes(grpc.GenericRpcHandler):
    """The one handler the gRPC server knows for the service's methods: the built service's handlers while
    serving, UNAVAILABLE (with the reason) before it is built and while its stores are away."""

    def __init__(self, readiness: Readiness, service_names: Sequence[str]) -> None:
        self.readiness = readiness
        self.shapes = _method_shapes(service_names)
        self.prefixes = tuple(f"/{name}/" for name in service_names)
        self.handlers: list[grpc.GenericRpcHandler] = []
        self._refusals = {method: _unavailable(readiness.refusal, *shape) for method, shape in self.shapes.items()}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        if not method.startswith(self.prefixes):
            return None
        if self.readiness.serving:
            for handler in self.handlers:
                found = handler.service(handler_call_details)
                if found is not None:
                    return found
            return None
        return self._refusals.get(method)


class _Interceptors(grpc.aio.ServerInterceptor):
    """The built service's own interceptors, in their place in the server's chain (none before it is built)."""

    def __init__(self) -> None:
        self.chain: Sequence[grpc.aio.ServerInterceptor] = ()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        chain = self.chain

        async def step(i: int, d: grpc.HandlerCallDetails) -> Any:
            if i == len(chain):
                return await continuation(d)
            return await chain[i].intercept_service(lambda nd: step(i + 1, nd), d)

        return await step(0, details)


class _Sink:
    """The built service's audit sink (log lines before it is built, or when it has none)."""

    def __init__(self) -> None:
        self.target: AuditSink | None = None
        self.fallback = LogSink()

    async def record(self, events: Sequence[Any]) -> None:
        await (self.target or self.fallback).record(events)


class Readiness:
    """Owns one service's way from started to SERVING and back: its store clients, the server's health, the
    guard in front of its handlers, and the loop that connects, builds, probes and recovers."""

    def __init__(
        self,
        settings: Settings,
        name: str,
        service_names: Sequence[str],
        build: Build,
        *,
        redis: bool,
        postgres: bool,
        warm: Warm | None = None,
    ) -> None:
        self.settings = settings
        #: how the service's PostgreSQL pool is warmed (sieve.db.create_pool)
        self.warm = warm
        self.name = name
        self.service_names = list(service_names)
        self.build = build
        self.needs_redis = redis
        self.needs_postgres = postgres
        self.stores = Stores()
        self.built: Built | None = None
        #: whether health says SERVING (the guard lets calls through)
        self.serving = False
        #: why the service is not serving (log lines), and what it waits for (UNAVAILABLE messages to callers,
        #: which learn neither the stores' addresses nor their errors)
        self.reason = "starting"
        self.waiting_for = "its start"
        #: the error that ended the loop (the process exits with it)
        self.error: BaseException | None = None
        #: how many times the service turned SERVING, and the monotonic time it last did
        self.ready_count = 0
        self.ready_at: float | None = None
        self.retry_max_s = max(RETRY_BASE_S, settings.store_retry_max_s)
        self.probe_interval_s = max(0.1, settings.store_probe_interval_s)
        self._routes = _Routes(self, self.service_names)
        self._interceptors = _Interceptors()
        self._sink = _Sink()
        self._eviction = EvictionCheck(settings)
        self._check_redis: Redis | None = None
        self._running: rpc.RunningServer | None = None
        #: the service `front` handed to the server (its JobsService serves the built service's jobs once built)
        self._front: rpc.Service | None = None
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False
        self._background_started = False
        self.stop_requested = asyncio.Event()
        self._changed = asyncio.Event()

    # --- the server shape -------------------------------------------------------------------------
    def front(self) -> rpc.Service:
        """The service to hand to `rpc.create_server(..., serving=False)`: the guard, the forwarding
        interceptors and audit sink, and a drain that first stops this loop. Its periodic jobs become the built
        service's once it is built (ListJobs answers before that too: no jobs yet)."""
        self._front = rpc.Service(
            name=self.name,
            service_names=self.service_names,
            register=lambda server: server.add_generic_rpc_handlers((self._routes,)),
            interceptors=[self._interceptors],
            audit=self._sink,
            before_stop=self._before_stop,
        )
        return self._front

    def attach(self, running: rpc.RunningServer) -> None:
        """Starts the loop on a server created from `front()`."""
        self._running = running
        self._loop = asyncio.create_task(self._run(), name=f"{self.name}-readiness")
        running.tasks.append(self._loop)

    async def run(self, address: str) -> None:
        """The whole life of a service process: listen on `address` (NOT_SERVING), get ready, serve until
        SIGTERM, shut down in order, close the stores; re-raises the error that ended the loop, if any."""
        running = await rpc.create_server(self.front(), address, self.settings, serving=False)
        self.attach(running)
        try:
            await rpc.serve(running, self.settings, stop=self.stop_requested)
        finally:
            await self.close()
        if self.error is not None:
            raise self.error

    async def wait_serving(self, serving: bool = True, timeout_s: float | None = None) -> None:
        """Until the service is (or is not) serving."""
        async with asyncio.timeout(timeout_s):
            while self.serving != serving:
                self._changed.clear()
                await self._changed.wait()

    def refusal(self) -> str:
        return f"{self.name} is not ready (waiting for {self.waiting_for}); retry later"

    # --- the loop -----------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            if self._running is not None:
                await self._running.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
            while True:
                await self._until_ready()
                await self._set_serving(True)
                await self._watch()
                await self._set_serving(False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s cannot start: %s", self.name, _describe(exc))
            self.error = exc
            self.stop_requested.set()

    async def _set_serving(self, serving: bool) -> None:
        if self._stopping:
            return
        self.serving = serving
        if serving:
            self.ready_count += 1
            self.ready_at = time.monotonic()
        if self._running is not None:
            await self._running.set_serving(serving)
        self._changed.set()

    async def _until_ready(self) -> None:
        """Connects (and builds, and prepares) until it all works, waiting out store errors."""
        backoff = Backoff(base_s=RETRY_BASE_S, max_s=self.retry_max_s)
        started = time.monotonic()
        while True:
            try:
                await self._connect()
                if self.built is None:
                    await self._build()
                assert self.built is not None
                if self.built.before_serving is not None:
                    try:
                        await self.built.before_serving()
                    except STORE_ERRORS as exc:
                        raise StoreUnavailable("start-up step", exc) from exc
                    except Exception as exc:  # idempotent: tried again (an OOM refusal of a full Redis, ...)
                        log.exception("%s: start-up step failed", self.name)
                        raise StoreUnavailable("start-up step", exc) from exc
                self._start_background()
            except NOT_READY_YET as exc:
                self.reason = str(exc) if isinstance(exc, StoreUnavailable) else f"start-up: {_describe(exc)}"
                self.waiting_for = exc.kind if isinstance(exc, StoreUnavailable) else "its start"
                delay = backoff.next()
                policy = isinstance(getattr(exc, "cause", exc), EvictionPolicyError)
                log.log(
                    logging.ERROR if policy else logging.WARNING,
                    "%s not ready (attempt %d, %.1f s waiting): %s; next try in %.1f s",
                    self.name,
                    backoff.failures,
                    time.monotonic() - started,
                    self.reason,
                    delay,
                    extra={"attempt": backoff.failures},
                )
                await asyncio.sleep(delay)
                continue
            waited = time.monotonic() - started
            log.info("%s ready after %d attempt(s), %.1f s: serving", self.name, backoff.failures + 1, waited)
            self.reason = "serving"
            return

    async def _build(self) -> None:
        built = await self.build(self.stores)
        # a library imported while building must not take over the ordered shutdown (PaddlePaddle installs a
        # SIGTERM handler of its own that dumps and kills the process): the loop's handlers go back in place
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        capture = _Capture()
        built.service.register(capture)  # type: ignore[arg-type]
        self._routes.handlers = capture.handlers
        self._interceptors.chain = tuple(built.service.interceptors)
        self._sink.target = built.service.audit
        if self._front is not None:
            self._front.jobs = built.service.jobs
        self.built = built

    def _start_background(self) -> None:
        """The built service's loops and periodic jobs, once, after its first start-up step (the scheduler
        dispatches only from a rebuilt Redis)."""
        if self._background_started or self.built is None or self._running is None:
            return
        self._background_started = True
        for loop in self.built.service.loops():
            self._running.tasks.append(asyncio.create_task(loop(), name=f"{self.name}-bg"))

    async def _connect(self) -> None:
        """Each store answers (Redis: PING and its eviction policy; PostgreSQL: a pool, migrated, SELECT 1)."""
        if self.needs_redis:
            where = f"Redis at {redis_location(self.settings.redis_url)}"
            try:
                if self.stores._redis is None:
                    self.stores._redis = redis_client(self.settings)
                client = self._checker()
                await asyncio.wait_for(ping(client), PROBE_TIMEOUT_S)
                await asyncio.wait_for(self._eviction.check(client), PROBE_TIMEOUT_S)
            except STORE_ERRORS as exc:
                raise StoreUnavailable(where, exc) from exc
        if self.needs_postgres:
            where = f"PostgreSQL at {postgres_location(self.settings.database_url)}"
            try:
                if self.stores._pool is None:
                    # asyncpg.connect's own timeout (60 s) is longer than a try should take
                    self.stores._pool = await asyncio.wait_for(
                        create_pool(self.settings, attempts=1, warm=self.warm), 60.0
                    )
                else:
                    await self._select_one(self.stores._pool)
            except STORE_ERRORS as exc:
                raise StoreUnavailable(where, exc) from exc

    def _checker(self) -> Redis:
        """A client of its own for checks and probes: no retries inside redis-py, short timeouts (the service's
        client keeps its retries for real work)."""
        if self._check_redis is None:
            self._check_redis = probe_client(self.settings, PROBE_TIMEOUT_S)
        return self._check_redis

    @staticmethod
    async def _select_one(pool: asyncpg.Pool) -> None:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")

    async def _watch(self) -> None:
        """Probes the stores until one fails twice in a row (then returns): the second probe, at once, tells a
        connection the server ended (replaced by then) from a store that is gone."""
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self._probe()
            except StoreUnavailable:
                try:
                    await self._probe()
                except StoreUnavailable as exc:
                    self.reason = str(exc)
                    self.waiting_for = exc.kind
                    log.warning("%s lost a store: %s; NOT_SERVING until it is back", self.name, self.reason)
                    return

    async def _probe(self) -> None:
        """PING on Redis, SELECT 1 on PostgreSQL; StoreUnavailable naming the one that failed."""
        if self.needs_redis:
            try:
                await asyncio.wait_for(ping(self._checker()), PROBE_TIMEOUT_S)
            except STORE_ERRORS as exc:
                raise StoreUnavailable(f"Redis at {redis_location(self.settings.redis_url)}", exc) from exc
        if self.needs_postgres:
            try:
                await self._select_one(self.stores.pool)
            except STORE_ERRORS as exc:
                raise StoreUnavailable(f"PostgreSQL at {postgres_location(self.settings.database_url)}", exc) from exc

    # --- shutdown ---------------------------------------------------------------------------------------
    async def _before_stop(self) -> None:
        """Health stays NOT_SERVING from here on; then the built service drains."""
        self._stopping = True
        if self._loop is not None and not self._loop.done():
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        if self.built is not None and self.built.service.before_stop is not None:
            await self.built.service.before_stop()

    async def close(self) -> None:
        """Closes what the service built and the store clients (after the server stopped)."""
        self._stopping = True
        if self._loop is not None and not self._loop.done():
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        if self.built is not None and self.built.close is not None:
            with contextlib.suppress(Exception):
                await self.built.close()
        if self.stores._pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.stores._pool.close(), 5)
        for client in (self.stores._redis, self._check_redis):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()


__all__ = ["LIVENESS", "STORE_ERRORS", "Build", "Built", "Readiness", "StoreUnavailable", "Stores", "postgres_location"]

"""The external engine's process parts (SIEVE_WORKER_ROLE=external), started and stopped in order.

Start-up: one `SafeHttpClient` whose allow-list is the configured providers' hosts, a handler per provider, the
engine and its tick loop, registry registration and heartbeats (task type EXTERNAL), and the Pull stream, whose
credits are the engine's `credit_limit` (the free slots of its providers' first pools) and whose hand-outs run and
settle one by one. Drain (SIEVE_SHUTDOWN_GRACE_S): no new credits; jobs in flight keep being polled until they
end or the grace is over — what is still running then is left to the next engine, which resumes it (its provider
job ids are in PostgreSQL, its slots come back with their leases).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg
from redis.asyncio import Redis

from sieve import rpc
from sieve.db.external_jobs import ExternalJobStore
from sieve.db.tasks import TaskStore, type_value
from sieve.jobs import Jobs
from sieve.outbound.client import SafeHttpClient
from sieve.outbound.policy import policy_for
from sieve.redis.keys import Keys
from sieve.redis.slot_pools import SlotPools
from sieve.settings import Settings
from worker_svc.external.engine import ExternalEngine
from worker_svc.external.handlers import handler_for
from worker_svc.pressure import Pressure
from worker_svc.puller import Puller
from worker_svc.registration import RegistryClient
from worker_svc.resources import ResourceSampler

log = logging.getLogger("sieve.worker.external")


def provider_client(settings: Settings) -> SafeHttpClient:
    """Outbound requests to the configured providers only (their hosts are the allow-list), within the outbound
    policy's private-net exceptions."""
    config = settings.external
    policy = policy_for(",".join(config.hosts), settings.outbound_allow_private_nets)
    return SafeHttpClient(
        policy,
        timeout_s=settings.external_request_timeout_s,
        max_bytes=settings.external_max_result_bytes,
        max_redirects=3,
    )


class ExternalApp:
    """One engine process: `start`, `drain`, `close` like a worker's (worker_svc/app.py)."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, redis: Redis) -> None:
        self.settings = settings
        self.worker_id = settings.effective_worker_id
        self.task_types = [type_value("EXTERNAL")]
        self.http = provider_client(settings)
        config = settings.external
        self.pools = SlotPools(
            redis, Keys(settings.redis_prefix), config.pools, lease_ms=int(settings.external_slot_lease_s * 1000)
        )
        self.engine = ExternalEngine(
            settings,
            self.worker_id,
            TaskStore(pool),
            ExternalJobStore(pool),
            self.pools,
            {name: handler_for(p, self.http) for name, p in config.providers.items()},
        )
        self.sampler = ResourceSampler(settings)
        self.concurrency = settings.worker_concurrency or settings.max_worker_concurrency
        self.puller = Puller(
            settings,
            self.worker_id,
            self.task_types,
            False,
            self.concurrency,
            self.engine,
            Pressure(self.sampler, settings),
            credit_limit=self.engine.credit_limit,
            one_per_batch=True,
        )
        self.engine.on_slot_freed = self.puller.offer_credits
        self.registry = RegistryClient(
            settings, self.sampler, self.task_types, lambda: self.puller.in_use, concurrency=lambda: self.concurrency
        )
        self.stop_event = asyncio.Event()
        self._ticking = asyncio.Event()  # set: the tick loop stops
        self._background: list[asyncio.Task[None]] = []
        self._pulling: asyncio.Task[None] | None = None
        self.jobs = Jobs(replica=self.worker_id)
        self.service = rpc.Service(
            name="sieve-worker", service_names=[], register=lambda server: None, before_stop=self.drain, jobs=self.jobs
        )

    async def start(self) -> None:
        self._background = [
            asyncio.create_task(self.engine.run(self._ticking)),
            asyncio.create_task(self.registry.run(self.stop_event)),
            asyncio.create_task(self.jobs.run()),
        ]
        self._pulling = asyncio.create_task(self.puller.run(self.stop_event))
        log.info(
            "external engine %s ready: providers %s, pools %s, tick %gs",
            self.worker_id,
            sorted(self.settings.external.providers),
            self.settings.external.pools,
            self.settings.external_tick_s,
        )

    async def drain(self) -> None:
        """No new credits; jobs in flight go on until they end (bounded by the server's grace)."""
        self.stop_event.set()
        if self._pulling is not None:
            await self._pulling

    async def close(self) -> None:
        self.stop_event.set()
        self._ticking.set()
        self.puller.cancel_running()
        tasks = [*self._background, *([self._pulling] if self._pulling else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.http.close()

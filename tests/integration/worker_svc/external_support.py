"""The platform with external engines and a real provider on loopback, for the external-job tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from redis.asyncio import Redis

from sieve.redis.keys import Keys
from sieve.redis.slot_pools import SlotPools
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.support.platform import FINAL, Platform, start_platform
from tests.support.provider import Provider
from worker_svc.external.app import ExternalApp
from worker_svc.server import build as build_worker

#: the engine's timers in these tests: a tick of 0.2 s (the default is 10 s), a short rest
FAST: dict[str, object] = {
    "external_tick_s": 0.2,
    "external_tick_rest_s": 0.02,
    "external_slot_lease_s": 5.0,
    # the engine's watermark must not hold it back on a busy test machine
    "test_hooks": True,
    "fixed_resources": "cpu=10,memory=20,gpu_memory=0",
}


def providers_json(providers: dict[str, tuple[Provider, dict[str, Any]]]) -> str:
    """SIEVE_EXTERNAL_PROVIDERS for providers on loopback: name -> (server, its settings)."""
    return json.dumps(
        {
            name: {"base_url": server.url, "poll_interval_s": 0.2, "timeout_s": 60, **extra}
            for name, (server, extra) in providers.items()
        }
    )


@dataclass
class ExternalPlatform:
    platform: Platform
    redis: Redis
    engines: list[ExternalApp] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.platform.settings

    def pools(self) -> SlotPools:
        return SlotPools(self.redis, Keys(self.settings.redis_prefix), self.settings.external.pools)

    async def add_engine(self, name: str, **overrides: object) -> ExternalApp:
        app = await build_worker(
            self.settings.replace(worker_role="external", worker_id=name, **overrides),
            Stores.of(pool=self.platform.pg, redis=self.redis),
        )
        assert isinstance(app, ExternalApp)
        self.engines.append(app)
        return app

    async def submit(self, specs: Sequence[intake_pb2.TaskSpec]) -> list[str]:
        ids: list[str] = []
        for i in range(0, len(specs), 500):
            reply = await self.platform.intake.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs[i : i + 500]))
            assert all(item.code == 0 for item in reply.items), [i.message for i in reply.items if i.code][:3]
            ids.extend(item.task.task_id for item in reply.items)
        return ids

    async def wait_all_final(self, ids: Sequence[str], timeout_s: float) -> dict[str, types_pb2.Task]:
        """Every task's final state (what is not final by the deadline is returned as it is)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        left = set(ids)
        final: dict[str, types_pb2.Task] = {}
        while left and asyncio.get_running_loop().time() < deadline:
            rows = await self.platform.pg.fetch(
                "SELECT id::text FROM tasks WHERE id = ANY($1::uuid[]) AND status = ANY($2::text[])",
                list(left),
                ["SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED", "DEAD_LETTERED"],
            )
            left -= {r["id"] for r in rows}
            if left:
                await asyncio.sleep(0.1)
        for task_id in ids:
            final[task_id] = (await self.platform.intake.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
        assert all(t.status in FINAL for t in final.values()) or left, "a task is final in PG but not in GetTask"
        return final


def job_spec(device: str, provider: str, **input_: Any) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(
        device_id=device,
        type=types_pb2.TASK_TYPE_EXTERNAL,
        external=intake_pb2.ExternalJob(provider=provider, input_json=json.dumps(input_)),
    )


@asynccontextmanager
async def external_platform(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, providers: str, **overrides: object
) -> AsyncIterator[ExternalPlatform]:
    """The platform (no detection worker) whose settings name these providers, with no engine yet."""
    changed = settings.replace(
        external_providers=providers, outbound_allow_private_nets="127.0.0.0/8", **{**FAST, **overrides}
    )
    servers = start_platform(changed, redis, pg, workers=0)
    ext = ExternalPlatform(await anext(servers), redis)
    try:
        yield ext
    finally:
        for engine in ext.engines:
            await engine.close()
        with contextlib.suppress(StopAsyncIteration):
            await anext(servers)

"""One worker's parts, started and stopped in order.

Start-up: the lexicon from PostgreSQL, the OCR engine when the worker takes OCR_IMAGE tasks (its mode decides
`gpu_available` and the default concurrency), then the group-commit writers, the lexicon watch, registry
registration and heartbeats, the periodic jobs (sieve/jobs.py: `lexicon-check`, and `ocr-health` on an OCR worker,
worker_svc/ocr/health.py; JobsService on the worker's health server shows and runs them), and the Pull stream to
the scheduler. When OCR falls back from GPU to CPU mode, the worker stops announcing a GPU and registers its
resources again. Drain (SIGTERM): no new credits, in-flight tasks finish and are acked, the stream closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import asyncpg

from sieve import rpc
from sieve.db.tasks import TaskStore, type_value
from sieve.jobs import Jobs
from sieve.settings import Settings
from worker_svc.lexicon import Lexicon
from worker_svc.pressure import Pressure
from worker_svc.puller import Puller
from worker_svc.registration import RegistryClient
from worker_svc.resources import ResourceSampler
from worker_svc.runner import BatchRunner
from worker_svc.tracing import ObservedRunner

if TYPE_CHECKING:  # the OCR modules need the `ocr` extra: imported only by workers that take OCR_IMAGE
    from worker_svc.ocr.mode import EngineMode
    from worker_svc.ocr.runtime import ModeSwitch, OcrRuntime

log = logging.getLogger("sieve.worker")

#: slots of a text worker when SIEVE_WORKER_CONCURRENCY is 0: matching is quick, the wait is I/O
DEFAULT_TEXT_CONCURRENCY = 200


class WorkerApp:
    """One worker process's parts and their order: the lexicon, the OCR runtime (OCR_IMAGE workers only), the
    `BatchRunner` and its group commits, the `Puller` (slots, credits, the Pull stream), the `RegistryClient`
    (registration, heartbeats); `start` brings them up, `drain` lets in-flight work finish, `close` stops all.

    Its `service` has no RPCs of its own: the worker serves gRPC health and its periodic `jobs` (JobsService) only,
    and the server's drain step (`before_stop`) is the worker's `drain`. The worker starts and stops its jobs
    itself, with its other loops (the server's second start of them does nothing)."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings = settings
        self.worker_id = settings.effective_worker_id
        self.task_types = [type_value(t) for t in settings.worker_types]
        self.lexicon = Lexicon(pool, settings)
        #: OCR engine and pipeline, only on a worker that takes OCR_IMAGE tasks (loaded in start)
        self.ocr = _ocr_runtime(settings) if "OCR_IMAGE" in settings.worker_types else None
        self.runner = BatchRunner(TaskStore(pool), self.lexicon, self.worker_id, settings, ocr=self.ocr)
        self.sampler = ResourceSampler(settings)
        self.concurrency = settings.worker_concurrency or DEFAULT_TEXT_CONCURRENCY
        self.puller = Puller(
            settings,
            self.worker_id,
            self.task_types,
            self.sampler.gpu_present,
            self.concurrency,
            ObservedRunner(self.runner, self.worker_id),
            Pressure(self.sampler, settings),
        )
        self.puller.holds = self.runner.holds  # a hung OCR thread keeps its slot until it returns
        self.registry = RegistryClient(
            settings,
            self.sampler,
            self.task_types,
            lambda: self.puller.in_use,
            gpu_available=self._ocr_gpu if self.ocr else None,
            concurrency=lambda: self.puller.concurrency,
        )
        self.stop_event = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._pulling: asyncio.Task[None] | None = None
        self.jobs = Jobs(replica=self.worker_id)
        self._register_jobs()
        self.service = rpc.Service(
            name="sieve-worker", service_names=[], register=lambda server: None, before_stop=self.drain, jobs=self.jobs
        )

    def _register_jobs(self) -> None:
        settings = self.settings
        self.jobs.register(
            "lexicon-check",
            settings.lexicon_check_interval_s,
            self.lexicon.check,
            "reloads the lexicon when its version row in PostgreSQL moved (also run on each NOTIFY sieve_lexicon)",
            jitter=0.1,
        )
        if self.ocr is not None and settings.ocr_health_interval_s > 0:
            ocr = self.ocr
            self.jobs.register(
                "ocr-health",
                settings.ocr_health_interval_s,
                lambda: _probe(ocr),
                "the OCR engine reads a small built-in image of known text, on its own thread, like a task",
                first_run_s=settings.ocr_health_interval_s,
                jitter=0.1,
                timeout_s=settings.ocr_timeout_s,
            )
        if self.ocr is not None and settings.ocr_model_check_interval_s > 0:
            self.jobs.register(
                "model-check",
                settings.ocr_model_check_interval_s,
                self.ocr.check_models,
                "the OCR model files on disk against those loaded: changed files fail it until a restart loads them",
                first_run_s=settings.ocr_model_check_interval_s,
                jitter=0.1,
            )

    async def start(self) -> None:
        await self.lexicon.start()
        if self.ocr is not None:
            await self._start_ocr(self.ocr)
        self._background = [
            asyncio.create_task(c)
            for c in (
                *(writer.run() for writer in self.runner.writers),
                self.lexicon.watch(changed=lambda: self.jobs.trigger("lexicon-check")),
                self.registry.run(self.stop_event),
                self.jobs.run(),
            )
        ]
        self._pulling = asyncio.create_task(self.puller.run(self.stop_event))
        log.info("worker %s ready: types %s, %d slots", self.worker_id, self.settings.worker_types, self.concurrency)

    async def _start_ocr(self, ocr: OcrRuntime) -> None:
        """Loads the engine (off the event loop); its mode sets the GPU flag and the default slots."""
        await ocr.start()
        self.puller.gpu = ocr.gpu
        if not self.settings.worker_concurrency:
            self.concurrency = self.puller.concurrency = ocr.default_concurrency()
        ocr.add_mode_listener(self._ocr_mode_changed)

    def _ocr_gpu(self) -> bool:
        return self.ocr is not None and self.ocr.gpu

    def _ocr_mode_changed(self, switch: ModeSwitch, mode: EngineMode) -> None:
        log.warning("worker %s: OCR now in %s mode; registering again", self.worker_id, mode.name)
        self.puller.gpu = mode.gpu
        self.puller.announce()  # the scheduler routes GPU work elsewhere from now on
        self.registry.register_again()

    async def drain(self) -> None:
        """No new credits; in-flight tasks finish and are acked; the stream closes."""
        self.stop_event.set()
        if self._pulling is not None:
            await self._pulling

    async def close(self) -> None:
        self.stop_event.set()
        tasks = [*self._background, *([self._pulling] if self._pulling else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.ocr is not None:
            await self.ocr.close()


async def _probe(ocr: OcrRuntime) -> str:
    from worker_svc.ocr.health import probe

    return await probe(ocr)


def _ocr_runtime(settings: Settings) -> OcrRuntime:
    from worker_svc.ocr.runtime import OcrRuntime

    return OcrRuntime(settings)

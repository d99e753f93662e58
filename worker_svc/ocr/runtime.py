"""The worker's OCR state: the current engine and mode, the executors, and the GPU -> CPU fallback.

`OcrRuntime.start` prepares the environment and the models, detects the mode and loads the engine, all off
the event loop. Afterwards the event loop only awaits: `decode` runs on a small decode pool (so images
of a batch are decoded while another is recognised), `recognise` on the engine's own thread, `fetch`
is asynchronous I/O.

Fallback: a GPU that fails must not fail every OCR task from then on. When an inference in GPU mode fails with a
GPU failure (`faults.is_gpu_failure`: CUDA out of memory or another CUDA error), the runtime switches to CPU
mode once — builds the CPU engine,
drops the GPU one, records a `ModeSwitch`, logs it, and tells its listeners (the worker re-registers its
resources with the registry and stops announcing a GPU) — then the failed inference is retried once in
CPU mode. Tasks that failed concurrently on the GPU find the switch done and just retry. A failure of
the retry is the task's failure: nothing is retried twice.

Abandoned inferences: a task whose caller stops waiting (its execution timeout) while its inference runs cannot
stop that inference — the engine thread finishes it. The runtime keeps such jobs (`abandoned`) until their
thread returns; meanwhile the engine's one thread is taken, so `recognise` refuses new work at once with
`EngineBusy` (the caller hands the task back, uncounted) rather than queueing it behind work nobody waits for.
A job still waiting for the thread when its caller stops waiting is simply dropped from the queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sieve.settings import Settings
from worker_svc.ocr.config import cache_dir, check_settings, cpu_count, prepare_environment
from worker_svc.ocr.engine import EngineOptions, LoadedEngine, Recognised, load_engine, release_engine
from worker_svc.ocr.faults import FaultHook, is_gpu_failure
from worker_svc.ocr.fetch import Fetcher
from worker_svc.ocr.images import Decoded, decode_image
from worker_svc.ocr.mode import EngineMode, cpu_mode, default_concurrency, detect_mode
from worker_svc.ocr.models import ModelDirs, fingerprint, prepare_models

log = logging.getLogger("sieve.worker.ocr")

ENGINE_NAMES = {"rapidocr": "rapidocr-3 onnxruntime", "paddle": "paddleocr-3 paddle_static"}


@dataclass(frozen=True, slots=True)
class ModeSwitch:
    """One switch of the engine from GPU to CPU mode."""

    from_mode: str
    to_mode: str
    reason: str
    at: str
    rebuild_s: float

    def as_json(self) -> dict[str, Any]:
        return {
            "from": self.from_mode,
            "to": self.to_mode,
            "reason": self.reason,
            "at": self.at,
            "rebuild_s": round(self.rebuild_s, 3),
        }


@dataclass(frozen=True, slots=True)
class Inference:
    """An image's recognition, the mode it ran in, the wait for the engine, and the switch it caused."""

    result: Recognised
    mode: EngineMode
    wait_ms: float
    switch: ModeSwitch | None = None
    #: the error of the failed GPU attempt when the result comes from the CPU retry
    first_error: str | None = None


ModeListener = Callable[[ModeSwitch, EngineMode], None]


class EngineBusy(Exception):
    """The engine's thread is held by an abandoned inference that has not returned."""


@dataclass(slots=True)
class Progress:
    """How far one task's OCR got (fetch, decode, queued: waiting for the engine thread, inference, match), and
    — once its caller stopped waiting while its inference ran — the future of that still-running job."""

    stage: str = "start"
    lingering: asyncio.Future[object] | None = field(default=None)


class OcrRuntime:
    """One worker's OCR: build with the settings, `await start()`, then `decode`/`fetch`/`recognise`."""

    def __init__(self, settings: Settings) -> None:
        check_settings(settings)
        self.settings = settings
        self.fault = FaultHook(settings.ocr_fault)
        self.fetcher = Fetcher(settings)
        self.options = EngineOptions.from_settings(settings)
        self.models: ModelDirs | None = None
        #: the model files' fingerprint when they were loaded (`check_models` compares)
        self.models_fingerprint = ""
        self._mode: EngineMode | None = None
        self._loaded: LoadedEngine | None = None
        self.mode_reason = ""
        self.generation = 0
        self.switches: list[ModeSwitch] = []
        self._listeners: list[ModeListener] = []
        self._switch_lock = asyncio.Lock()
        #: inferences whose caller stopped waiting and whose thread has not returned
        self.abandoned: set[Future[object]] = set()
        threads = settings.ocr_decode_threads or max(1, min(2, cpu_count()))
        self._decode_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sieve-ocr-decode")

    # --- state --------------------------------------------------------------------------------------
    @property
    def mode(self) -> EngineMode:
        if self._mode is None:
            raise RuntimeError("OcrRuntime.start() has not run")
        return self._mode

    @property
    def started(self) -> bool:
        return self._loaded is not None

    @property
    def gpu(self) -> bool:
        """Whether the worker runs OCR on a GPU now (what it registers as gpu_available)."""
        return self._mode is not None and self._mode.gpu

    def default_concurrency(self) -> int:
        return default_concurrency(self.mode)

    def add_mode_listener(self, listener: ModeListener) -> None:
        """`listener(switch, new_mode)` is called on the event loop after each switch to CPU mode."""
        self._listeners.append(listener)

    @property
    def engine_name(self) -> str:
        """What runs the models: "rapidocr-3 onnxruntime" or "paddleocr-3 paddle_static"."""
        return ENGINE_NAMES.get(self.settings.ocr_engine, self.settings.ocr_engine)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine_name, "orientation": self.options.orient, **self.mode.describe()}
        if self.models is not None:
            out["models"] = self.models.describe()
        return out

    # --- life ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Environment, models, mode and engine; seconds of work, none of it on the event loop."""
        if self.started:
            return
        settings = self.settings
        cache = await asyncio.to_thread(cache_dir, settings)
        prepare_environment(settings, cache)
        self.models = await asyncio.to_thread(prepare_models, settings, cache)
        self.models_fingerprint = await asyncio.to_thread(fingerprint, self.models)
        mode, self.mode_reason = await asyncio.to_thread(detect_mode, settings)
        self._loaded = await asyncio.to_thread(load_engine, self.models, mode, self.options)
        self._mode = mode
        log.info("OCR ready in %s mode (%s): %s", mode.name, self.mode_reason, self.describe())

    async def check_models(self) -> str:
        """The model update check (a periodic job): the files on disk against those loaded. Changed files (a package
        upgrade, a new model in a configured folder) are an error until the worker is restarted to load them —
        the engine is never swapped under running tasks."""
        if self.models is None:
            return "OCR not started"
        now = await asyncio.to_thread(fingerprint, self.models)
        if now != self.models_fingerprint:
            raise RuntimeError(
                f"model files changed on disk since they were loaded ({self.models_fingerprint} -> {now}): restart "
                "the worker to load them"
            )
        return f"models unchanged ({now}: {self.models.det_name}, {self.models.rec_name})"

    async def close(self) -> None:
        """Stops the decode pool and the fetcher; the engine stays loaded for the process."""
        await self.fetcher.close()
        self._decode_pool.shutdown(wait=False, cancel_futures=True)

    # --- work ---------------------------------------------------------------------------------------
    async def decode(self, data: bytes) -> Decoded:
        """Header checks and decode on the decode pool; BadImage when unusable."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decode_pool, decode_image, data, self.settings.ocr_max_image_pixels)

    async def fetch(self, url: str) -> tuple[bytes, float]:
        return await self.fetcher.fetch(url)

    @property
    def wedged(self) -> bool:
        """An abandoned inference still holds the engine thread."""
        return bool(self.abandoned)

    async def recognise(self, pixels: Any, progress: Progress | None = None) -> Inference:
        """Text lines of decoded pixels, on the engine thread; falls back to CPU once on a GPU failure.
        EngineBusy while an abandoned inference holds the thread."""
        if self.abandoned:
            raise EngineBusy(f"the OCR engine is held by {len(self.abandoned)} abandoned inference(s)")
        loaded, mode, generation = self._loaded, self.mode, self.generation
        assert loaded is not None
        try:
            result, wait_ms = await self._run(loaded, mode, pixels, progress)
            return Inference(result, mode, wait_ms)
        except Exception as exc:
            if not (mode.gpu and is_gpu_failure(exc)):
                raise
            first_error = f"{type(exc).__name__}: {exc}"
            switch = await self._fall_back(first_error, generation)
        loaded, mode = self._loaded, self.mode
        assert loaded is not None
        result, wait_ms = await self._run(loaded, mode, pixels, progress)  # the one retry; a failure is final
        return Inference(result, mode, wait_ms, switch, first_error)

    async def _run(
        self, loaded: LoadedEngine, mode: EngineMode, pixels: Any, progress: Progress | None = None
    ) -> tuple[Recognised, float]:
        submitted = time.perf_counter()

        def infer() -> tuple[Recognised, float]:
            if progress is not None:
                progress.stage = "inference"
            wait_ms = (time.perf_counter() - submitted) * 1000
            self.fault.before_inference(mode)
            return loaded.engine.recognise(pixels), wait_ms

        if progress is not None:
            progress.stage = "queued"
        job = loaded.executor.submit(infer)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            if not job.cancel() and not job.done():  # running: it cannot be stopped, only waited for
                self._abandon(job, progress)
            raise

    def _abandon(self, job: Future[Any], progress: Progress | None) -> None:
        loop = asyncio.get_running_loop()
        self.abandoned.add(job)
        lingering = asyncio.wrap_future(job, loop=loop)

        def returned(f: asyncio.Future[Any]) -> None:
            self.abandoned.discard(job)
            if not f.cancelled():
                f.exception()  # retrieved: asyncio does not log it as never retrieved

        lingering.add_done_callback(returned)
        if progress is not None:
            progress.lingering = lingering
        log.warning("OCR: an inference was abandoned while running; the engine thread stays busy until it returns")

    async def _fall_back(self, reason: str, generation: int) -> ModeSwitch:
        async with self._switch_lock:
            if self.generation != generation and self.switches:  # another task switched meanwhile
                return self.switches[-1]
            old_loaded, old_mode = self._loaded, self.mode
            assert old_loaded is not None and self.models is not None
            new_mode = cpu_mode(self.settings)
            log.warning("OCR: GPU failure in %s mode (%s); rebuilding the engine in CPU mode", old_mode.name, reason)
            began = time.perf_counter()
            loaded = await asyncio.to_thread(load_engine, self.models, new_mode, self.options)
            self._loaded, self._mode = loaded, new_mode
            self.generation += 1
            if old_loaded is not loaded:
                release_engine(old_loaded)
            switch = ModeSwitch(
                old_mode.name, new_mode.name, reason, datetime.now(UTC).isoformat(), time.perf_counter() - began
            )
            self.switches.append(switch)
            log.warning(
                "OCR engine switched from %s to %s mode in %.1fs after: %s",
                switch.from_mode,
                switch.to_mode,
                switch.rebuild_s,
                reason,
            )
            for listener in self._listeners:
                try:
                    listener(switch, new_mode)
                except Exception:
                    log.exception("OCR mode listener failed")
            return switch

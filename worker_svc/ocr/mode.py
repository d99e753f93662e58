"""GPU or CPU mode of the OCR engine, detected once at worker start (the same worker image runs on hosts with
and without a GPU; the mode decides the engine build, its batch sizes and the worker's default slots).

GPU mode — PaddlePaddle built with CUDA *and* a device present (CUDA device count, NVML as the driver's
word): device `gpu:0`, recognition batch 4, no oneDNN. CPU mode — the fast static engine
(`paddle_static`, run mode `mkldnn`, `enable_new_ir` off, which the legacy PP-OCRv4 `.pdmodel` files
need), recognition batch 2, `SIEVE_OCR_CPU_THREADS` threads. `SIEVE_OCR_DEVICE` forces one mode.

With the test fault hook `gpu_oom_once` the worker starts in *simulated* GPU mode: it reports GPU mode
(and registers `gpu_available`) but builds the CPU engine, since there is no device to build on.

`default_concurrency` is the number of tasks an OCR worker holds at once when SIEVE_WORKER_CONCURRENCY
is 0: enough for the engine never to wait for the next image (decode, fetch and the database round trips
overlap with recognition), not so many that tasks sit long in one worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from sieve.settings import Settings
from worker_svc.ocr.config import MAX_DEFAULT_CPU_THREADS, cpu_count

log = logging.getLogger("sieve.worker.ocr")

GPU_REC_BATCH = 4
CPU_REC_BATCH = 2
#: tasks held per core by a CPU OCR worker; at least CPU_MIN_CONCURRENCY
CPU_TASKS_PER_CORE = 4
CPU_MIN_CONCURRENCY = 4
GPU_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class EngineMode:
    """How the engine is built: the mode a worker reports, and the real build parameters."""

    #: "gpu" or "cpu": what the worker reports and routes on
    name: str
    #: PaddleX device string of the real build ("gpu:0" or "cpu")
    device: str
    rec_batch_size: int
    mkldnn: bool
    cpu_threads: int
    #: GPU mode reported without a GPU (test fault hook only); the build is the CPU one
    simulated: bool = False

    @property
    def gpu(self) -> bool:
        return self.name == "gpu"

    def engine_config(self, new_ir: bool = False) -> dict[str, Any]:
        """PaddleX `engine_config` of the `paddle_static` engine for this build.

        `new_ir` stays off for legacy `inference.pdmodel` files (the new IR cannot run them, see
        shared/notes/ocr-offline.md) and is turned on for models saved as `inference.json` (PIR).
        """
        if self.device.startswith("gpu"):
            return {"run_mode": "paddle", "enable_new_ir": new_ir}
        config: dict[str, Any] = {"cpu_threads": self.cpu_threads, "enable_new_ir": new_ir}
        config["run_mode"] = "mkldnn" if self.mkldnn else "paddle"
        return config

    def build_key(self) -> tuple[str, int, bool, int]:
        """What identifies a built engine (simulated GPU mode shares the CPU build)."""
        return self.device, self.rec_batch_size, self.mkldnn, self.cpu_threads

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.name,
            "device": self.device,
            "rec_batch_size": self.rec_batch_size,
            "mkldnn": self.mkldnn,
        }
        if not self.device.startswith("gpu"):
            out["cpu_threads"] = self.cpu_threads
        if self.simulated:
            out["simulated"] = True
        return out


def cpu_threads(settings: Settings) -> int:
    return settings.ocr_cpu_threads or min(cpu_count(), MAX_DEFAULT_CPU_THREADS)


def cpu_mode(settings: Settings) -> EngineMode:
    # oneDNN is PaddlePaddle's CPU path; onnxruntime's CPU provider has its own kernels
    return EngineMode("cpu", "cpu", CPU_REC_BATCH, settings.ocr_engine == "paddle", cpu_threads(settings))


def gpu_mode(settings: Settings) -> EngineMode:
    return EngineMode("gpu", "gpu:0", GPU_REC_BATCH, False, cpu_threads(settings))


def simulated_gpu_mode(settings: Settings) -> EngineMode:
    cpu = cpu_mode(settings)
    return replace(cpu, name="gpu", simulated=True)


def cuda_present(engine: str = "paddle") -> tuple[bool, str]:
    """Whether the engine's runtime can run on a GPU here, and why (imports paddle, or onnxruntime)."""
    if engine == "rapidocr":
        return _onnxruntime_cuda()
    import paddle

    if not paddle.is_compiled_with_cuda():
        return False, "paddle is built without CUDA"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as exc:  # a broken driver reads as "no GPU"
        return False, f"CUDA device query failed: {exc}"
    if count < 1:
        return False, "paddle has CUDA but sees no device"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            nvml_count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        if nvml_count < 1:
            return False, "NVML sees no device"
    except Exception as exc:
        log.info("NVML unavailable (%s); trusting paddle's %d CUDA device(s)", exc, count)
    return True, f"{count} CUDA device(s)"


def _onnxruntime_cuda() -> tuple[bool, str]:
    """onnxruntime with the CUDA provider (the onnxruntime-gpu build) and a device NVML sees."""
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return False, "onnxruntime has no CUDA provider (the onnxruntime-gpu build is not installed)"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:
        return False, f"onnxruntime has CUDA but NVML sees no driver: {exc}"
    if count < 1:
        return False, "NVML sees no device"
    return True, f"{count} CUDA device(s) (onnxruntime)"


def detect_mode(settings: Settings) -> tuple[EngineMode, str]:
    """The mode to start in, and why."""
    if settings.ocr_fault == "gpu_oom_once":
        return simulated_gpu_mode(settings), "SIEVE_OCR_FAULT=gpu_oom_once: simulated GPU mode"
    if settings.ocr_device == "cpu":
        return cpu_mode(settings), "SIEVE_OCR_DEVICE=cpu"
    present, why = cuda_present(settings.ocr_engine)
    if settings.ocr_device == "gpu":
        if not present:
            raise RuntimeError(f"SIEVE_OCR_DEVICE=gpu but no usable GPU: {why}")
        return gpu_mode(settings), "SIEVE_OCR_DEVICE=gpu"
    return (gpu_mode(settings) if present else cpu_mode(settings)), why


def default_concurrency(mode: EngineMode, cores: int | None = None) -> int:
    """Tasks an OCR worker holds when SIEVE_WORKER_CONCURRENCY is 0."""
    if mode.gpu:
        return GPU_CONCURRENCY
    return max(CPU_MIN_CONCURRENCY, CPU_TASKS_PER_CORE * (cores or cpu_count()))

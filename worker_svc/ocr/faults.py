"""The test-only fault hook of the OCR engine, and what counts as a GPU failure.

`FaultHook` is built from `SIEVE_OCR_FAULT` (empty in production: it does nothing) and is called on the
engine thread right before each inference. It raises exactly what PaddlePaddle raises when CUDA runs out
of memory — Python `MemoryError` with Paddle's "(ResourceExhausted) Out of memory error on GPU 0" text —
so the fallback path under test is the one a real GPU takes. "hang_once" / "hang" block the engine thread instead,
as a wedged inference does (the execution timeout's path: the worker stops waiting, the thread keeps its slot).

`is_gpu_failure` decides which errors of an inference in GPU mode switch the worker to CPU: `MemoryError`,
and errors whose text names CUDA, cuDNN, cuBLAS, an out-of-memory or a failed allocation (older Paddle
raises `RuntimeError`/`OSError` with such text; onnxruntime "Failed to allocate").
"""

from __future__ import annotations

import threading

from worker_svc.ocr.mode import EngineMode

INJECTED_OOM = (
    "(ResourceExhausted) Out of memory error on GPU 0. Cannot allocate 1.000000GB memory on GPU 0, "
    "0.000000B memory has been allocated and available memory is only 0.000000B. "
    "[injected by SIEVE_OCR_FAULT]"
)

_GPU_FAILURE_TEXT = ("out of memory", "resourceexhausted", "cuda", "cudnn", "cublas", "failed to allocate", "cudaerror")


def is_gpu_failure(exc: BaseException) -> bool:
    """True for errors that mean the GPU (not the input) failed: CUDA out-of-memory or CUDA errors."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError | OSError | SystemError):
        text = str(exc).lower()
        return any(marker in text for marker in _GPU_FAILURE_TEXT)
    return False


#: longest an injected hang lasts (a hung inference in a test process returns at the latest then)
HANG_S = 3600.0


class FaultHook:
    """Raises (or hangs in) the configured injected failure; thread-safe, cheap when off. A hang ("hang_once",
    "hang") blocks the engine thread the way a wedged inference does, until `release()` or HANG_S."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.fired = 0
        self._lock = threading.Lock()
        self._released = threading.Event()

    def release(self) -> None:
        """Lets every hung inference return (tests)."""
        self._released.set()

    def before_inference(self, mode: EngineMode) -> None:
        if not self.spec:
            return
        with self._lock:
            if self.spec == "gpu_oom_once" and mode.gpu and self.fired == 0:
                self.fired += 1
                raise MemoryError(INJECTED_OOM)
            if self.spec == "oom_always":
                self.fired += 1
                raise MemoryError(INJECTED_OOM)
            hang = self.spec == "hang" or (self.spec == "hang_once" and self.fired == 0)
            if hang:
                self.fired += 1
        if hang:
            self._released.wait(HANG_S)

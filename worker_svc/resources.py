"""The worker's own resource readings: CPU and memory from psutil, GPUs from NVML (seed 4.1–4.2).

`ResourceSampler.sample` gives the `Resources` a worker registers and heartbeats with, and from which it
decides to hold back credits (`over_watermark`, the shared `sieve.workers.availability` check).

A host without a GPU, without the NVIDIA driver, or whose NVML calls fail reads as "no GPU" (zeros), never
as an error. Tests fix the percentages with `SIEVE_FIXED_RESOURCES`: either the readings themselves,
"cpu=90,memory=20,gpu_memory=0,gpu_util=0" (any subset), or "file:/path" naming a file holding them,
read again on every sample so that a test can change the readings of a running worker (an empty file
fixes nothing).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from sieve.settings import Settings
from sieve.v1 import registry_pb2
from sieve.workers import availability

log = logging.getLogger("sieve.worker.resources")

FIXED_RESOURCES_VAR = "SIEVE_FIXED_RESOURCES"
#: The readings SIEVE_FIXED_RESOURCES may fix, all percentages 0..100.
FIXED_KEYS = ("cpu", "memory", "gpu_memory", "gpu_util")
_FILE_PREFIX = "file:"


def parse_fixed_resources(text: str) -> dict[str, float]:
    """Parses "cpu=90,memory=20,gpu_memory=0" strictly; ValueError naming SIEVE_FIXED_RESOURCES.

    Keys are those of FIXED_KEYS, each at most once; values are numbers from 0 to 100. Blank text fixes
    nothing.
    """
    fixed: dict[str, float] = {}
    if not text.strip():
        return fixed
    for item in (p.strip() for p in text.strip().split(",")):
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not sep or not key or not raw:
            raise ValueError(f"{FIXED_RESOURCES_VAR}: entry {item!r} is not name=percent")
        if key not in FIXED_KEYS:
            raise ValueError(f"{FIXED_RESOURCES_VAR}: unknown reading {key!r} (expected one of "
                             f"{', '.join(FIXED_KEYS)})")
        if key in fixed:
            raise ValueError(f"{FIXED_RESOURCES_VAR}: {key} is given twice")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{FIXED_RESOURCES_VAR}: {key}={raw!r} is not a number") from None
        if not math.isfinite(value) or not 0 <= value <= 100:
            raise ValueError(f"{FIXED_RESOURCES_VAR}: {key}={raw!r} is not a percentage from 0 to 100")
        fixed[key] = value
    return fixed


def over_watermark(resources: registry_pb2.Resources, settings: Settings) -> list[str]:
    """Why this worker should not take more work now (empty: it may); the registry's own check."""
    return availability(resources, settings)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return psutil.cpu_count(logical=True) or 1


class _Gpus:
    """NVML, initialised once; every failure reads as "no GPU"."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.names: list[str] = []
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no library, no driver, no device: no GPU
            log.info("no GPU: NVML unavailable (%s)", exc)
            return
        self._nvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self._handles]
        except pynvml.NVMLError as exc:
            log.warning("no GPU: NVML device query failed (%s)", exc)
            self.close()
            return
        log.info("GPUs: %s", ", ".join(self.names) or "none")

    def fill(self, out: registry_pb2.Resources) -> None:
        """Adds the GPU readings to `out` (leaves them zero when there is no GPU or NVML fails)."""
        if self._nvml is None or not self._handles:
            return
        pynvml = self._nvml
        try:
            memories = [pynvml.nvmlDeviceGetMemoryInfo(h) for h in self._handles]
            utils = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
        except pynvml.NVMLError as exc:
            log.warning("GPU readings failed (%s); reporting no GPU for this sample", exc)
            return
        out.gpu_available = True
        out.gpu_count = len(self._handles)
        out.gpu_names.extend(self.names)
        out.gpu_memory_total_bytes = sum(int(m.total) for m in memories)
        # The fullest device decides: CUDA runs out of memory per device, not in aggregate.
        out.gpu_memory_percent = max(100.0 * m.used / m.total if m.total else 0.0 for m in memories)
        out.gpu_util_percent = sum(float(u) for u in utils) / len(utils)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)
        self._nvml = None
        self._handles = []


def _text(name: str | bytes) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else name


class ResourceSampler:
    """Samples this host's resources; construct once per worker process (primes psutil's CPU counter)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._fixed_source = settings.fixed_resources.strip()
        self._fixed()  # a bad SIEVE_FIXED_RESOURCES fails at start, not at the first heartbeat
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement window
        self._cpu_count = _cpu_count()
        self._gpus = _Gpus()

    @property
    def gpu_present(self) -> bool:
        return bool(self._gpus.names)

    def _fixed(self) -> Mapping[str, float]:
        source = self._fixed_source
        if not source:
            return {}
        if source.startswith(_FILE_PREFIX):
            path = Path(source.removeprefix(_FILE_PREFIX))
            try:
                text = path.read_text()
            except OSError as exc:
                raise ValueError(f"{FIXED_RESOURCES_VAR}: cannot read {path}: {exc}") from None
            return parse_fixed_resources(text)
        return parse_fixed_resources(source)

    def sample(self, active_tasks: int) -> registry_pb2.Resources:
        """Fresh readings (CPU % since the previous sample), with fixed readings applied."""
        memory = psutil.virtual_memory()
        out = registry_pb2.Resources(
            cpu_count=self._cpu_count,
            cpu_percent=float(psutil.cpu_percent(interval=None)),
            memory_total_bytes=int(memory.total),
            memory_available_bytes=int(memory.available),
            memory_percent=float(memory.percent),
            active_tasks=max(0, active_tasks),
        )
        self._gpus.fill(out)
        fixed = self._fixed()
        if "cpu" in fixed:
            out.cpu_percent = fixed["cpu"]
        if "memory" in fixed:
            out.memory_percent = fixed["memory"]
            out.memory_available_bytes = int(out.memory_total_bytes * (100.0 - fixed["memory"]) / 100.0)
        if "gpu_memory" in fixed:
            out.gpu_memory_percent = fixed["gpu_memory"]
        if "gpu_util" in fixed:
            out.gpu_util_percent = fixed["gpu_util"]
        return out

    def close(self) -> None:
        """Releases NVML."""
        self._gpus.close()


__all__ = ["FIXED_KEYS", "ResourceSampler", "over_watermark", "parse_fixed_resources"]

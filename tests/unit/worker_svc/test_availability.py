"""Unit tests of worker availability (sieve.redis.worker_records.availability), the worker's resource sampler
(worker_svc.resources: real readings, fixed readings, NVML absent or present)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sieve.redis.worker_records import WorkerRecord, availability
from sieve.settings import Settings
from sieve.v1 import registry_pb2, types_pb2
from worker_svc.resources import ResourceSampler, over_watermark, parse_fixed_resources


def _record(cpu: float = 10.0, memory: float = 20.0, gpu_memory: float = 0.0) -> WorkerRecord:
    moment = datetime(2026, 6, 18, 10, 0, tzinfo=UTC)
    return WorkerRecord(
        worker_id="w1",
        hostname="worker-01",
        pid=12345,
        task_types=(types_pb2.TASK_TYPE_TEXT,),
        gpu_available=gpu_memory > 0,
        gpu_count=1 if gpu_memory > 0 else 0,
        gpu_names=(),
        gpu_memory_total_bytes=0,
        gpu_util_percent=0.0,
        gpu_memory_percent=gpu_memory,
        cpu_count=16,
        cpu_percent=cpu,
        memory_total_bytes=33559728128,
        memory_available_bytes=12559728128,
        memory_percent=memory,
        active_tasks=0,
        registered_at=moment,
        last_heartbeat=moment,
    )


# --- availability ---------------------------------------------------------------------------------
def test_a_worker_under_every_watermark_is_available() -> None:
    # Given readings below the 75 % defaults
    record = _record(cpu=74.9, memory=50.0, gpu_memory=10.0)

    # When its availability is checked
    reasons = availability(record, Settings())

    # Then there is no reason against it
    assert reasons == []


@pytest.mark.parametrize(
    ("readings", "reason"),
    [
        ({"cpu": 90.0}, "cpu 90.0% >= 75.0%"),
        ({"memory": 90.0}, "memory 90.0% >= 75.0%"),
        ({"gpu_memory": 80.5}, "gpu memory 80.5% >= 75.0%"),
        ({"cpu": 75.0}, "cpu 75.0% >= 75.0%"),
    ],
)
def test_each_reading_at_or_over_its_watermark_makes_a_worker_unavailable_with_a_reason(
    readings: dict[str, float], reason: str
) -> None:
    # Given one reading at or above its watermark
    record = _record(**readings)

    # When its availability is checked
    reasons = availability(record, Settings())

    # Then that reading, and only that one, is the reason
    assert reasons == [reason]


def test_every_reading_over_its_watermark_gives_one_reason_each() -> None:
    record = _record(cpu=99.0, memory=80.0, gpu_memory=76.0)

    assert availability(record, Settings()) == [
        "cpu 99.0% >= 75.0%",
        "memory 80.0% >= 75.0%",
        "gpu memory 76.0% >= 75.0%",
    ]


def test_the_watermarks_come_from_the_settings() -> None:
    # Given watermarks of 50 % and a worker at 60 % CPU
    settings = Settings(cpu_watermark_pct=50.0, memory_watermark_pct=95.0, gpu_memory_watermark_pct=50.0)

    # Then CPU is over its watermark and memory (90 %) is not
    assert availability(_record(cpu=60.0, memory=90.0), settings) == ["cpu 60.0% >= 50.0%"]


def test_the_worker_and_the_registry_judge_the_same_readings_alike() -> None:
    # Given the same readings as the worker sends them and as the registry stores them
    record = _record(cpu=20.0, memory=88.0)
    resources = record.resources()

    # Then the worker's own check and the registry's availability agree
    assert over_watermark(resources, Settings()) == availability(record, Settings()) == ["memory 88.0% >= 75.0%"]


def test_a_record_carries_its_reasons_into_its_proto() -> None:
    # Given a stored hash of a worker over the memory watermark
    data = {
        "hostname": "h",
        "pid": "7",
        "task_types": "TEXT,OCR_IMAGE",
        "cpu_percent": "5.0",
        "memory_percent": "90.0",
        "gpu_names": '["NVIDIA A10, rev 1"]',
        "gpu_available": "1",
        "registered_at": "2026-06-18T10:00:00+00:00",
        "last_heartbeat": "2026-06-18T10:00:15+00:00",
    }

    # When it is parsed and turned into a WorkerInfo
    info = WorkerRecord.from_hash("w9", data, Settings()).to_proto()

    # Then it is unavailable, says why, and keeps every field
    assert not info.available
    assert list(info.unavailable_reasons) == ["memory 90.0% >= 75.0%"]
    assert list(info.task_types) == [types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE]
    assert list(info.resources.gpu_names) == ["NVIDIA A10, rev 1"]
    assert info.pid == 7
    assert info.last_heartbeat.ToDatetime(tzinfo=UTC) == datetime(2026, 6, 18, 10, 0, 15, tzinfo=UTC)


# --- fixed readings -------------------------------------------------------------------------------
def test_fixed_readings_are_parsed_as_percentages() -> None:
    assert parse_fixed_resources("cpu=90, memory=20,gpu_memory=0") == {
        "cpu": 90.0,
        "memory": 20.0,
        "gpu_memory": 0.0,
    }
    assert parse_fixed_resources("gpu_util=12.5") == {"gpu_util": 12.5}
    assert parse_fixed_resources("  ") == {}


@pytest.mark.parametrize(
    "text",
    [
        "cpu",
        "cpu=",
        "=90",
        "cpu=ninety",
        "cpu=101",
        "cpu=-1",
        "cpu=nan",
        "disk=10",
        "cpu=1,cpu=2",
        "cpu=10,,memory=20",
        "cpu=10;memory=20",
    ],
)
def test_a_malformed_fixed_reading_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match="SIEVE_FIXED_RESOURCES"):
        parse_fixed_resources(text)


def test_a_sampler_with_malformed_fixed_readings_fails_at_start() -> None:
    with pytest.raises(ValueError, match="SIEVE_FIXED_RESOURCES"):
        ResourceSampler(Settings(fixed_resources="cpu=lots"))


def test_fixed_readings_override_the_real_ones() -> None:
    # Given a sampler whose CPU and memory readings are fixed
    sampler = ResourceSampler(Settings(fixed_resources="cpu=90,memory=20"))

    # When it samples
    resources = sampler.sample(active_tasks=2)

    # Then the fixed readings are reported, the rest is real, and the worker is over the CPU watermark
    assert resources.cpu_percent == 90.0
    assert resources.memory_percent == 20.0
    assert resources.memory_total_bytes > 0
    assert resources.active_tasks == 2
    assert over_watermark(resources, Settings()) == ["cpu 90.0% >= 75.0%"]


def test_fixed_readings_in_a_file_are_read_again_on_every_sample(tmp_path: Path) -> None:
    # Given fixed readings kept in a file
    path = tmp_path / "resources"
    path.write_text("cpu=90,memory=20")
    sampler = ResourceSampler(Settings(fixed_resources=f"file:{path}"))
    assert sampler.sample(0).cpu_percent == 90.0

    # When the file changes
    path.write_text("cpu=10,memory=95\n")

    # Then the next sample reports the new readings
    resources = sampler.sample(0)
    assert (resources.cpu_percent, resources.memory_percent) == (10.0, 95.0)
    assert over_watermark(resources, Settings()) == ["memory 95.0% >= 75.0%"]

    # And when the file turns malformed, sampling says so
    path.write_text("cpu=oops")
    with pytest.raises(ValueError, match="SIEVE_FIXED_RESOURCES"):
        sampler.sample(0)


def test_a_missing_fixed_readings_file_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SIEVE_FIXED_RESOURCES"):
        ResourceSampler(Settings(fixed_resources=f"file:{tmp_path / 'absent'}"))


# --- real readings --------------------------------------------------------------------------------
def test_the_real_sampler_returns_sane_readings() -> None:
    # Given a sampler of this host
    sampler = ResourceSampler(Settings())

    # When it samples twice
    sampler.sample(0)
    resources = sampler.sample(active_tasks=1)

    # Then the readings make sense, with or without a GPU
    assert resources.cpu_count >= 1
    assert 0.0 <= resources.cpu_percent <= 100.0
    assert resources.memory_total_bytes > 0
    assert 0 < resources.memory_available_bytes <= resources.memory_total_bytes
    assert 0.0 <= resources.memory_percent <= 100.0
    assert resources.active_tasks == 1
    if resources.gpu_available:
        assert resources.gpu_count == len(resources.gpu_names) >= 1
        assert resources.gpu_memory_total_bytes > 0
    else:
        assert resources.gpu_count == resources.gpu_memory_total_bytes == 0
        assert list(resources.gpu_names) == []
    sampler.close()


def test_a_host_without_nvml_reads_as_no_gpu_without_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given NVML that cannot load (no driver)
    import pynvml

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)

    # When the sampler starts and samples
    sampler = ResourceSampler(Settings())
    resources = sampler.sample(0)

    # Then there is no GPU, and every GPU reading is zero
    assert not sampler.gpu_present
    assert not resources.gpu_available
    assert resources.gpu_count == 0
    assert resources.gpu_memory_percent == resources.gpu_util_percent == 0.0


class _FakeNvml:
    """Two GPUs: the second one nearly full."""

    def __init__(self) -> None:
        self.memories = [SimpleNamespace(total=100, used=50), SimpleNamespace(total=300, used=270)]
        self.utils = [SimpleNamespace(gpu=20), SimpleNamespace(gpu=60)]
        self.fail_readings = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import pynvml

        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: f"GPU {h}" if h else b"GPU 0")
        monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", self._memory)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: self.utils[h])

    def _memory(self, handle: int) -> Any:
        import pynvml

        if self.fail_readings:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.memories[handle]


def test_gpu_readings_come_from_nvml_and_the_fullest_gpu_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two GPUs, the second at 90 % memory
    nvml = _FakeNvml()
    nvml.install(monkeypatch)

    # When the sampler samples (CPU and memory fixed low: this host's own load must not decide)
    sampler = ResourceSampler(Settings(fixed_resources="cpu=10,memory=10"))
    resources = sampler.sample(0)

    # Then both GPUs are reported and the worker is over the GPU-memory watermark
    assert resources.gpu_available
    assert resources.gpu_count == 2
    assert list(resources.gpu_names) == ["GPU 0", "GPU 1"]
    assert resources.gpu_memory_total_bytes == 400
    assert resources.gpu_memory_percent == pytest.approx(90.0)
    assert resources.gpu_util_percent == pytest.approx(40.0)
    assert over_watermark(resources, Settings()) == ["gpu memory 90.0% >= 75.0%"]

    # And when NVML fails later, the sample reads as no GPU instead of failing
    nvml.fail_readings = True
    assert not sampler.sample(0).gpu_available


def test_a_sampled_reading_is_a_registry_resources_message() -> None:
    assert isinstance(ResourceSampler(Settings()).sample(0), registry_pb2.Resources)

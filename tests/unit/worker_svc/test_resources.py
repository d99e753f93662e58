"""The worker's readings come from its own limits: a cgroup v2 or v1 hierarchy (laid out in a directory as the
kernel does, and a real one where this machine lets a test create it) gives the container's CPU quota and
memory limit, not the host's; the worker's own CPU and GPU memory are told apart from everyone else's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sieve.redis.worker_records import availability
from sieve.settings import Settings
from sieve.v1 import registry_pb2
from worker_svc.resources import ResourceSampler, detect_cgroups

ROOT = Path(__file__).resolve().parents[3]
GIB = 1024**3
MIB = 1024**2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_layout(root: Path, own: str = "/kubepods/pod1/ctr") -> Path:
    """/proc/self/{cgroup,mountinfo} and /sys/fs/cgroup of a cgroup v2 host, as the kernel shows them."""
    _write(root / "proc/self/cgroup", f"0::{own}\n")
    _write(
        root / "proc/self/mountinfo",
        "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
        "30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n",
    )
    cg = root / "sys/fs/cgroup"
    _write(cg / "cgroup.controllers", "cpuset cpu io memory hugetlb pids\n")
    leaf = cg / own.lstrip("/")
    for directory in (leaf, *[p for p in leaf.parents if cg in p.parents]):
        _write(directory / "cpu.max", "max 100000\n")
        _write(directory / "memory.max", "max\n")
    return leaf


def v2_usage(directory: Path, cpu_s: float, current: int, inactive_file: int) -> None:
    _write(directory / "cpu.stat", f"usage_usec {int(cpu_s * 1e6)}\nuser_usec 1\nsystem_usec 1\n")
    _write(directory / "memory.current", f"{current}\n")
    _write(directory / "memory.stat", f"anon 1\nfile 2\ninactive_file {inactive_file}\nactive_file 3\n")


def test_a_cgroup_v2_container_reads_its_quota_and_memory_limit_not_the_hosts(tmp_path: Path) -> None:
    # Given a container limited to 1.5 CPUs and 1 GiB (on a host with more of both)
    leaf = v2_layout(tmp_path)
    _write(leaf / "cpu.max", "150000 100000\n")
    _write(leaf / "memory.max", f"{GIB}\n")
    v2_usage(leaf, cpu_s=10.0, current=600 * MIB, inactive_file=100 * MIB)
    clock = Clock()
    sampler = ResourceSampler(Settings(), fs_root=tmp_path, clock=clock)

    # When a second passes in which the container used 0.9 s of CPU
    clock.now += 1.0
    v2_usage(leaf, cpu_s=10.9, current=600 * MIB, inactive_file=100 * MIB)
    out = sampler.sample(0)

    # Then CPU is 60 % of the quota and memory the working set (page cache left out) of the limit
    assert out.scope == "cpu=cgroup v2,memory=cgroup v2"
    assert out.cpu_percent == pytest.approx(60.0, abs=0.5)
    assert out.cpu_own_percent < 5  # this test's process hardly ran in that (simulated) second
    assert out.cpu_count == 2
    assert out.memory_total_bytes == GIB
    assert out.memory_available_bytes == GIB - 500 * MIB
    assert out.memory_percent == pytest.approx(100 * 500 / 1024)


def test_the_tightest_limit_on_the_way_up_decides_and_its_usage_is_read(tmp_path: Path) -> None:
    # Given a pod limited to 0.5 CPU and 512 MiB, and a container inside it with no limit of its own
    leaf = v2_layout(tmp_path)
    pod = leaf.parent
    _write(pod / "cpu.max", "50000 100000\n")
    _write(pod / "memory.max", f"{512 * MIB}\n")
    v2_usage(pod, cpu_s=1.0, current=400 * MIB, inactive_file=0)
    v2_usage(leaf, cpu_s=0.0, current=1, inactive_file=0)
    cgroups = detect_cgroups(tmp_path, host_cores=8, host_memory_bytes=64 * GIB)

    # Then the pod's limits apply, read where they are set
    assert cgroups.cpu is not None and cgroups.cpu.cores == 0.5 and cgroups.cpu.directory == pod
    assert cgroups.memory is not None and cgroups.memory.limit_bytes == 512 * MIB
    assert cgroups.memory.used_bytes() == 400 * MIB


def test_no_limit_or_a_limit_no_tighter_than_the_host_reads_the_host(tmp_path: Path) -> None:
    leaf = v2_layout(tmp_path)
    assert detect_cgroups(tmp_path, host_cores=2, host_memory_bytes=8 * GIB).cpu is None
    # a quota of 4 CPUs on a host of 2, a memory limit above the host's memory: no tighter than the host
    _write(leaf / "cpu.max", "400000 100000\n")
    _write(leaf / "memory.max", f"{4096 * GIB}\n")
    cgroups = detect_cgroups(tmp_path, host_cores=2, host_memory_bytes=8 * GIB)
    assert cgroups.cpu is None and cgroups.memory is None
    sampler = ResourceSampler(Settings(), fs_root=tmp_path)
    assert sampler.scope == "cpu=host,memory=host"


def test_inside_a_cgroup_namespace_the_mounts_root_is_the_containers_own(tmp_path: Path) -> None:
    # /proc/self/cgroup says "/" and the container's files sit at the mount point itself
    v2_layout(tmp_path, own="/")
    cg = tmp_path / "sys/fs/cgroup"
    _write(cg / "cpu.max", "100000 100000\n")
    _write(cg / "memory.max", f"{2 * GIB}\n")
    cgroups = detect_cgroups(tmp_path, host_cores=4, host_memory_bytes=32 * GIB)
    assert cgroups.cpu is not None and cgroups.cpu.cores == 1.0 and cgroups.cpu.directory == cg
    assert cgroups.memory is not None and cgroups.memory.limit_bytes == 2 * GIB


def test_a_v2_hierarchy_without_the_cpu_and_memory_controllers_is_not_used(tmp_path: Path) -> None:
    leaf = v2_layout(tmp_path)
    _write(tmp_path / "sys/fs/cgroup/cgroup.controllers", "hugetlb\n")
    _write(leaf / "cpu.max", "50000 100000\n")
    assert detect_cgroups(tmp_path, host_cores=2, host_memory_bytes=8 * GIB).cpu is None


def test_a_cgroup_v1_container_reads_cfs_quota_cpuacct_and_the_memory_controller(tmp_path: Path) -> None:
    # Given cgroup v1 with cpu,cpuacct co-mounted and the memory controller, a docker container inside
    _write(tmp_path / "proc/self/cgroup", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/x\n")
    _write(
        tmp_path / "proc/self/mountinfo",
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
    )
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/abc"
    memory = tmp_path / "sys/fs/cgroup/memory/docker/abc"
    _write(cpu / "cpu.cfs_quota_us", "50000\n")
    _write(cpu / "cpu.cfs_period_us", "100000\n")
    _write(cpu / "cpuacct.usage", str(int(5e9)))
    _write(memory / "memory.limit_in_bytes", f"{256 * MIB}\n")
    _write(memory / "memory.usage_in_bytes", f"{200 * MIB}\n")
    _write(memory / "memory.stat", f"cache 5\ninactive_file 1\ntotal_inactive_file {72 * MIB}\n")
    for parent in (tmp_path / "sys/fs/cgroup/cpu,cpuacct", tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker"):
        _write(parent / "cpu.cfs_quota_us", "-1\n")
        _write(parent / "cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    clock = Clock()
    sampler = ResourceSampler(Settings(), fs_root=tmp_path, clock=clock)

    # When half a second passes with 0.4 s of CPU used by the container
    clock.now += 0.5
    _write(cpu / "cpuacct.usage", str(int(5.4e9)))
    out = sampler.sample(0)

    # Then CPU is of the 0.5-CPU quota (0.4 / (0.5 x 0.5) -> capped at 100 %), memory of the 256 MiB limit
    assert out.scope == "cpu=cgroup v1,memory=cgroup v1"
    assert out.cpu_percent == 100.0
    assert out.memory_total_bytes == 256 * MIB
    assert out.memory_percent == pytest.approx(50.0)


def test_the_cpu_reading_covers_the_last_second_however_often_it_is_taken(tmp_path: Path) -> None:
    leaf = v2_layout(tmp_path)
    _write(leaf / "cpu.max", "100000 100000\n")
    v2_usage(leaf, 0.0, 1, 0)
    clock = Clock()
    sampler = ResourceSampler(Settings(), fs_root=tmp_path, clock=clock)
    used = 0.0
    # 2 s fully busy, sampled every 0.25 s, then idle: the reading drops to 0 within about a second
    readings = []
    for step in range(16):
        clock.now += 0.25
        used += 0.25 if step < 8 else 0.0
        v2_usage(leaf, used, 1, 0)
        readings.append(sampler.sample(0).cpu_percent)
    assert readings[7] == pytest.approx(100.0)
    assert readings[8] == pytest.approx(75.0)  # the window still holds 0.75 s of the busy time
    assert readings[12] == pytest.approx(0.0)


# --- the watermarks leave the worker's own share out -------------------------------------------
def test_cpu_the_worker_used_itself_is_not_overload() -> None:
    # Given a domain at 95 % CPU of which 80 points are this worker's own process tree
    mine = registry_pb2.Resources(cpu_percent=95.0, cpu_own_percent=80.0, memory_percent=20.0)
    # Then it is available: the other processes use 15 %
    assert availability(mine, Settings()) == []
    # And when others use 80 % beside its 10 %, it is not, and the reason says whose CPU it is
    busy = registry_pb2.Resources(cpu_percent=90.0, cpu_own_percent=10.0)
    assert availability(busy, Settings()) == ["cpu 80.0% besides this worker's 10.0% >= 75.0%"]


def test_memory_counts_whole_and_gpu_memory_without_the_workers_own() -> None:
    readings = registry_pb2.Resources(memory_percent=80.0, gpu_memory_percent=90.0, gpu_memory_own_percent=70.0)
    assert availability(readings, Settings()) == ["memory 80.0% >= 75.0%"]


def test_the_real_sampler_counts_its_own_busy_thread_as_its_own() -> None:
    sampler = ResourceSampler(Settings())
    sampler.sample(0)
    import time

    until = time.monotonic() + 1.1
    while time.monotonic() < until:
        pass
    out = sampler.sample(0)
    # one busy thread on this host's cores: the worker's own share is what it caused (at least a good part of a
    # core, however busy the rest of the machine keeps it)
    assert out.cpu_own_percent >= 100.0 / len(os.sched_getaffinity(0)) * 0.3
    assert out.cpu_own_percent <= out.cpu_percent + 1e-9


def test_a_child_process_the_worker_just_started_counts_as_its_own_at_once() -> None:
    # Given a sampler that listed this process's children a moment ago (none then)
    settings = Settings(cpu_watermark_pct=30.0)
    sampler = ResourceSampler(settings)
    sampler.sample(0)
    # When the worker starts a child that burns a core (long before the next periodic listing, 5 s away)
    burn = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        import time

        out = sampler.sample(0)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            time.sleep(0.25)
            out = sampler.sample(0)
    finally:
        child.kill()
        child.wait()
    # Then its CPU is the worker's own (a good part of a core, however busy the rest of this machine keeps it):
    # others' share reading high made the sampler look for children again
    assert out.cpu_own_percent >= 100.0 / len(os.sched_getaffinity(0)) * 0.3, out


class _FakeNvml:
    """Two GPUs; on the first this process holds most of the memory, on the second another process does."""

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import pynvml

        me, other = os.getpid(), 999_999
        memories = [SimpleNamespace(total=100, used=80), SimpleNamespace(total=100, used=50)]
        processes = [
            [SimpleNamespace(pid=me, usedGpuMemory=70), SimpleNamespace(pid=other, usedGpuMemory=10)],
            [SimpleNamespace(pid=other, usedGpuMemory=50)],
        ]
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: f"GPU {h}")
        monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: memories[h])
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=10))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: processes[h])
        monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda h: [])


def test_gpu_memory_the_worker_holds_itself_is_told_apart_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeNvml().install(monkeypatch)
    out = ResourceSampler(Settings(fixed_resources="cpu=10,memory=10")).sample(0)
    # the second GPU decides: others hold 50 % there, against 10 % on the first
    assert (out.gpu_memory_percent, out.gpu_memory_own_percent) == (50.0, 0.0)
    assert availability(out, Settings()) == []
    assert availability(out, Settings(gpu_memory_watermark_pct=40)) == ["gpu memory 50.0% >= 40.0%"]


# --- a real cgroup ----------------------------------------------------------------------------------
CHILD = r"""
import json, os, subprocess, sys, time
for path in sys.argv[2:]:
    with open(path, "w") as f:
        f.write(str(os.getpid()))
from sieve.settings import Settings
from worker_svc.resources import ResourceSampler
from sieve.redis.worker_records import availability
sampler = ResourceSampler(Settings())
burner = None
if sys.argv[1] == "outside":
    # not a descendant of this process (a child counts as the worker's own), in this cgroup all the same
    from tests.cpu_burner import start_detached_burner
    burner = start_detached_burner(10)
end = time.monotonic() + 1.6
next_sample = 0.0
while time.monotonic() < end:
    if sys.argv[1] != "own":  # "own" burns in this process; "outside" idles while the burner burns
        time.sleep(0.05)
    if time.monotonic() >= next_sample:
        sampler.sample(0)
        next_sample = time.monotonic() + 0.25
out = sampler.sample(0)
if burner is not None:
    from tests.cpu_burner import stop_burner
    stop_burner(burner)
print(json.dumps({"scope": out.scope, "cpu": out.cpu_percent, "own": out.cpu_own_percent,
                  "memory_total": out.memory_total_bytes, "reasons": availability(out, Settings())}))
"""


def _own_cgroup_dir(mount: Path, controller: str) -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            candidate = mount / path.lstrip("/")
            return candidate if candidate.is_dir() else mount
    return mount


@pytest.fixture
def real_v1_cgroup() -> Iterator[tuple[list[Path], int]]:
    """A cgroup v1 child (cpu quota 0.5 CPU, memory limit 256 MiB) of this process's own cgroups, where this
    machine lets a test create one; yields the files a process writes its pid to, and the memory limit."""
    mounts = {c: Path(f"/sys/fs/cgroup/{c}") for c in ("cpu", "cpuacct", "memory")}
    if not all((m / "cgroup.procs").exists() for m in mounts.values()):
        pytest.skip("no cgroup v1 cpu, cpuacct and memory controllers mounted here")
    name = f"sieve-test-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    try:
        for controller, mount in mounts.items():
            directory = _own_cgroup_dir(mount, controller) / name
            directory.mkdir()
            made.append(directory)
    except OSError as exc:
        for directory in made:
            directory.rmdir()
        pytest.skip(f"cannot create a cgroup here: {exc}")
    limit = 256 * MIB
    try:
        (made[0] / "cpu.cfs_period_us").write_text("100000")
        (made[0] / "cpu.cfs_quota_us").write_text("50000")
        (made[2] / "memory.limit_in_bytes").write_text(str(limit))
        yield [d / "cgroup.procs" for d in made], limit
    finally:
        for directory in made:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except OSError:  # its last process is still exiting
                    import time

                    time.sleep(0.1)


def _run_child(mode: str, procs: list[Path]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, *map(str, procs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_in_a_real_cgroup_the_readings_are_of_its_quota_and_limit(real_v1_cgroup: tuple[list[Path], int]) -> None:
    procs, limit = real_v1_cgroup
    # Given a process inside a cgroup of 0.5 CPU and 256 MiB that burns CPU itself
    own = _run_child("own", procs)
    # Then its readings are of the cgroup: the limit as total memory, CPU of the quota, all of it its own
    assert own["scope"] == "cpu=cgroup v1,memory=cgroup v1"
    assert own["memory_total"] == limit
    assert own["cpu"] >= 50, own  # 0.5 CPU busy is ~100 % of the quota (less when this machine is busy)
    assert own["own"] >= own["cpu"] - 15, own
    assert own["reasons"] == []  # its own work is not overload

    # When another process in the same cgroup burns the CPU while this one idles
    outside = _run_child("outside", procs)
    # Then that is overload: the worker would hold back
    assert outside["cpu"] >= 50 and outside["own"] < 20, outside
    assert any(r.startswith("cpu ") for r in outside["reasons"]), outside

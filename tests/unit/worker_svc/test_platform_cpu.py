"""The platform's own CPU is not overload: the other Sieve services and workers and the Redis and PostgreSQL servers
beside a worker (`SIEVE_CPU_PLATFORM_PROCESSES`) are told apart from everyone else's load — real processes, started
detached (not the worker's descendants), found by name or command line; in a cgroup with a quota only those in it
count."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sieve.errors import SettingsError
from sieve.redis.worker_records import availability, watermark_levels
from sieve.settings import Settings
from sieve.v1 import registry_pb2
from worker_svc.pressure import Pressure
from worker_svc.resources import (
    CgroupCpu,
    ResourceSampler,
    _PlatformProcesses,
    detect_cgroups,
    platform_process,
    proc_stat,
)

GIB = 1024**3
CORES = len(os.sched_getaffinity(0))
#: one core of this machine, in percent of all of it
CORE_PCT = 100.0 / CORES
_BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def start_detached(seconds: float, *argv_tail: str) -> int:
    """A process burning one core for at most `seconds`, command line `python -c <code> *argv_tail`, started by
    a launcher in a new session that exits at once: re-parented away, not a descendant of this process."""
    launch = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {_BURN.format(seconds=seconds)!r}, *{list(argv_tail)!r}],\n"
        "    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid)\n"
    )
    done = subprocess.run([sys.executable, "-c", launch], capture_output=True, text=True, check=True, timeout=30)
    return int(done.stdout.strip())


@contextlib.contextmanager
def burning(*argv_tail: str, seconds: float = 20.0) -> Iterator[int]:
    pid = start_detached(seconds, *argv_tail)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- the setting ---------------------------------------------------------------------------------
def test_the_setting_lists_names_and_command_line_markers_and_empty_turns_it_off() -> None:
    default = Settings().platform_processes
    for expected in (("-m", "worker_svc"), ("-m", "scheduler_svc"), ("-m", "intake_svc"), ("-m", "registry_svc")):
        assert expected in default
    assert {("redis-server",), ("postgres",), ("deploy/run_local.py",)} <= set(default)
    env = {"SIEVE_CPU_PLATFORM_PROCESSES": " postgres , -m  my_svc,,postgres "}
    assert Settings.from_env(env).platform_processes == (("postgres",), ("-m", "my_svc"))
    assert Settings.from_env({"SIEVE_CPU_PLATFORM_PROCESSES": ""}).platform_processes == ()
    for bad in ("-m", "redis,-m ,postgres", "a\tb\x01"):
        with pytest.raises(SettingsError, match="SIEVE_CPU_PLATFORM_PROCESSES"):
            Settings.from_env({"SIEVE_CPU_PLATFORM_PROCESSES": bad})


def test_a_process_matches_by_its_name_or_its_command_line() -> None:
    markers = Settings().platform_processes
    assert platform_process(markers, "postgres", ["postgres: 15/main: checkpointer ", "", ""])
    assert platform_process(markers, "redis-server", ["redis-server 127.0.0.1:6379"])
    assert platform_process(markers, "valkey-server", [])  # a name alone (no command line read yet)
    assert platform_process(markers, "python3", ["/srv/.venv/bin/python3", "-m", "worker_svc"])
    assert platform_process(markers, "python", ["python", "-X", "dev", "-m", "scheduler_svc"])
    assert platform_process(markers, "python", ["python", "/srv/sieve/deploy/run_local.py", "--workers", "2"])
    assert platform_process(markers, "python", ["python", "deploy/run_local.py"])
    # not: another module, a script merely named alike, a word inside an argument, a client with a database URL
    assert not platform_process(markers, "python", ["python", "-m", "worker_svc_tools"])
    assert not platform_process(markers, "python", ["python", "-m", "pytest", "tests/worker_svc"])
    assert not platform_process(markers, "python", ["python", "my_run_local.py"])
    assert not platform_process(markers, "psql", ["psql", "postgresql://postgres@127.0.0.1/postgres"])
    assert not platform_process(markers, "bash", ["bash", "-c", "echo -m worker_svc"])
    # a name the kernel cut at 15 characters still matches
    assert platform_process((("sieve-long-server-name",),), "sieve-long-serv", ["x"])
    assert not platform_process((), "postgres", ["postgres"])


# --- the levels ----------------------------------------------------------------------------------
def test_the_cpu_watermark_leaves_out_the_platforms_share_and_says_so() -> None:
    readings = registry_pb2.Resources(cpu_percent=91.5, cpu_own_percent=4.0, cpu_platform_percent=67.5)
    cpu = watermark_levels(readings, Settings())[0]
    assert (cpu.resource, cpu.own, cpu.platform) == ("cpu", 4.0, 67.5)
    assert cpu.value == pytest.approx(20.0)
    assert availability(readings, Settings()) == []
    assert cpu.describe(15.0) == "cpu 20.0% besides this worker's 4.0% and the platform's 67.5% >= 15.0%"
    assert availability(readings, Settings(cpu_watermark_pct=20.0)) == [
        "cpu 20.0% besides this worker's 4.0% and the platform's 67.5% >= 20.0%"
    ]
    # the platform's share alone; shares that add up past the total are clamped (never below 0 for others)
    alone = registry_pb2.Resources(cpu_percent=90.0, cpu_platform_percent=5.0)
    assert availability(alone, Settings()) == ["cpu 85.0% besides the platform's 5.0% >= 75.0%"]
    over = registry_pb2.Resources(cpu_percent=50.0, cpu_own_percent=30.0, cpu_platform_percent=40.0)
    level = watermark_levels(over, Settings())[0]
    assert (level.value, level.own, level.platform) == (0.0, 30.0, 20.0)


def test_fixed_readings_fix_the_platforms_share_too() -> None:
    sampler = ResourceSampler(Settings(fixed_resources="cpu=90,cpu_own=10,cpu_platform=70", test_hooks=True))
    out = sampler.sample(0)
    assert (out.cpu_percent, out.cpu_own_percent, out.cpu_platform_percent) == (90.0, 10.0, 70.0)
    assert availability(out, Settings()) == []
    # a fixed total without a platform share reads none (as the worker's own share)
    out = ResourceSampler(Settings(fixed_resources="cpu=90", test_hooks=True)).sample(0)
    assert out.cpu_platform_percent == 0.0
    # more than the total leaves the rest: never more than the total minus the worker's own
    out = ResourceSampler(Settings(fixed_resources="cpu=50,cpu_own=30,cpu_platform=40", test_hooks=True)).sample(0)
    assert out.cpu_platform_percent == 20.0


# --- the cgroup filter ---------------------------------------------------------------------------
def _v2(root: Path, own: str) -> Path:
    _write(root / "proc/self/cgroup", f"0::{own}\n")
    _write(
        root / "proc/self/mountinfo",
        "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    cg = root / "sys/fs/cgroup"
    _write(cg / "cgroup.controllers", "cpu memory\n")
    leaf = cg / own.lstrip("/")
    for directory in (leaf, *[p for p in leaf.parents if cg in p.parents]):
        _write(directory / "cpu.max", "max 100000\n")
    return leaf


def test_only_processes_in_the_cgroup_whose_quota_is_read_count(tmp_path: Path) -> None:
    # Given a container whose pod holds the quota
    leaf = _v2(tmp_path, "/kubepods/pod1/ctr")
    _write(leaf.parent / "cpu.max", "100000 100000\n")
    cpu = detect_cgroups(tmp_path, host_cores=8, host_memory_bytes=64 * GIB).cpu
    assert cpu is not None and cpu.path == "/kubepods/pod1" and cpu.directory == leaf.parent
    # Then the pod's processes count, wherever in it; the neighbours' and the host's do not
    assert cpu.holds("0::/kubepods/pod1/ctr\n")
    assert cpu.holds("0::/kubepods/pod1/sidecar\n")
    assert cpu.holds("0::/kubepods/pod1\n")
    assert not cpu.holds("0::/kubepods/pod10/ctr\n")
    assert not cpu.holds("0::/kubepods/pod2/postgres\n")
    assert not cpu.holds("0::/system.slice/redis.service\n")
    assert not cpu.holds("12:cpu,cpuacct:/kubepods/pod1\n")  # no v2 line
    assert not cpu.holds(None) and not cpu.holds("")


def test_inside_a_cgroup_namespace_processes_outside_it_do_not_count(tmp_path: Path) -> None:
    _v2(tmp_path, "/")
    _write(tmp_path / "sys/fs/cgroup/cpu.max", "100000 100000\n")
    cpu = detect_cgroups(tmp_path, host_cores=4, host_memory_bytes=32 * GIB).cpu
    assert cpu is not None and cpu.path == "/"
    assert cpu.holds("0::/\n") and cpu.holds("0::/worker\n")
    assert not cpu.holds("0::/../../system.slice/postgresql.service\n")


def test_with_cgroup_v1_the_cpu_controllers_line_decides(tmp_path: Path) -> None:
    _write(tmp_path / "proc/self/cgroup", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n")
    _write(
        tmp_path / "proc/self/mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n",
    )
    cpu_dir = tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/abc"
    _write(cpu_dir / "cpu.cfs_quota_us", "50000\n")
    _write(cpu_dir / "cpu.cfs_period_us", "100000\n")
    _write(cpu_dir / "cpuacct.usage", "0\n")
    cpu = detect_cgroups(tmp_path, host_cores=4, host_memory_bytes=32 * GIB).cpu
    assert cpu is not None and cpu.version == 1 and cpu.path == "/docker/abc"
    assert cpu.holds("5:memory:/other\n4:cpu,cpuacct:/docker/abc\n")
    assert not cpu.holds("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/xyz\n")
    assert not CgroupCpu(1, cpu_dir, 0.5).holds("4:cpu,cpuacct:/docker/abc\n")  # no path known: none


def test_in_a_cgroup_with_a_quota_a_platform_process_counts_only_from_inside_it(tmp_path: Path) -> None:
    if CORES < 2:
        pytest.skip("needs a quota tighter than this machine's cores")
    # Given a worker in a (laid out) cgroup of one core, fully used, and a real platform process burning a core
    leaf = _v2(tmp_path, "/pod/ctr")
    _write(leaf / "cpu.max", "100000 100000\n")
    token = uuid.uuid4().hex
    settings = Settings(cpu_platform_processes=f"--sieve-test-platform {token}")
    began = time.monotonic()

    def usage() -> None:  # the cgroup's quota fully used, as far as its counter says
        _write(leaf / "cpu.stat", f"usage_usec {int((time.monotonic() - began) * 1e6)}\n")

    usage()
    with burning("--sieve-test-platform", token) as pid:
        for inside, expected in ((True, "counts"), (False, "does not count")):
            _write(tmp_path / f"proc/{pid}/cgroup", "0::/pod/ctr\n" if inside else "0::/elsewhere\n")
            sampler = ResourceSampler(settings, fs_root=tmp_path)
            platform = []
            for _ in range(6):
                time.sleep(0.25)
                usage()
                platform.append(sampler.sample(0).cpu_platform_percent)
            # Then inside the cgroup its CPU is the platform's (a good part of the one-core quota), outside none
            if inside:
                assert pid in sampler.platform_pids(), expected
                assert max(platform) >= 30, (expected, platform)
            else:
                assert pid not in sampler.platform_pids(), expected
                assert max(platform) == 0.0, (expected, platform)


# --- real processes on the host ------------------------------------------------------------------
def _readings(sampler: ResourceSampler, seconds: float) -> list[registry_pb2.Resources]:
    out = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.25)
        out.append(sampler.sample(0))
    return out


def _watch(sampler: ResourceSampler, pid: int) -> tuple[float, float, float]:
    """After the window has filled: mean platform and others' shares over 1.5 s, and what process `pid` used
    itself meanwhile (/proc), all in percent of this machine."""
    _readings(sampler, 1.0)
    before, began = proc_stat(pid), time.monotonic()
    readings = _readings(sampler, 1.5)
    after, ended = proc_stat(pid), time.monotonic()
    assert before is not None and after is not None
    used = 100.0 * (after.cpu_s - before.cpu_s) / (ended - began) / CORES
    platform = sum(r.cpu_platform_percent for r in readings) / len(readings)
    others = sum(r.cpu_percent - r.cpu_own_percent - r.cpu_platform_percent for r in readings) / len(readings)
    return platform, others, used


def test_a_platform_process_burning_cpu_is_the_platforms_and_the_same_one_unnamed_is_someone_elses() -> None:
    token = uuid.uuid4().hex
    settings = Settings(cpu_platform_processes=f"--sieve-test-platform {token}")
    # Given a detached process burning a core, its command line one of the platform's
    with burning("--sieve-test-platform", token) as pid:
        sampler = ResourceSampler(settings)
        platform, others, used = _watch(sampler, pid)
        assert pid in sampler.platform_pids()
    # And the same process with a command line of no one in particular
    with burning("--sieve-test-other", token) as pid:
        sampler = ResourceSampler(settings)
        unnamed_platform, unnamed_others, unnamed_used = _watch(sampler, pid)
        assert pid not in sampler.platform_pids()
    if min(used, unnamed_used) < 2:
        pytest.skip(f"this machine left the burners too little CPU to tell: {used:.1f}%, {unnamed_used:.1f}%")
    # Then the named one's CPU is the platform's (what it used, as far as the readings' windows line up with the
    # measurement, however busy the rest of this machine keeps it), the unnamed one's is someone else's
    assert platform >= 0.6 * used, (platform, others, used)
    assert unnamed_platform == 0.0, (unnamed_platform, unnamed_others, unnamed_used)
    assert unnamed_others >= 0.6 * unnamed_used, (unnamed_platform, unnamed_others, unnamed_used)


def test_platform_processes_started_after_the_listing_are_found_before_they_hold_the_worker_back() -> None:
    # Given a worker that takes work (default watermark, 75 %) on a machine not too busy without the test
    token = uuid.uuid4().hex
    settings = Settings(cpu_platform_processes=f"postgres,redis-server,--sieve-test-platform {token}")
    probe = _readings(ResourceSampler(settings), 1.5)[-1]
    if probe.cpu_percent - probe.cpu_own_percent - probe.cpu_platform_percent > 60:
        pytest.skip(f"this machine is too busy without the test: {probe}")
    outcome = {}
    for name in ("--sieve-test-platform", "--sieve-test-other"):
        pressure = Pressure(ResourceSampler(settings), settings)
        pressure.reasons()
        # When processes burn every core, started after the worker listed the platform's (one burner per core:
        # decisive whatever else this machine runs, which can only take its share of the cores from them)
        with contextlib.ExitStack() as stack:
            for _ in range(CORES):
                stack.enter_context(burning(name, token))
            until = time.monotonic() + 4.5
            held = False
            while time.monotonic() < until and not held:
                time.sleep(0.1)
                pressure.reasons()
                held = pressure.held
        outcome[name] = (held, pressure.last)
    # Then the platform's own do not hold it back (they were found within a second of reading high, and counted
    # as the platform's); the same processes as someone else's do
    assert not outcome["--sieve-test-platform"][0], outcome
    assert outcome["--sieve-test-other"][0], outcome


def test_a_platform_process_that_ends_or_whose_pid_is_reused_is_dropped() -> None:
    token = uuid.uuid4().hex
    markers = ((("--sieve-test-platform", token)),)
    now = [0.0]
    with burning("--sieve-test-platform", token) as pid:
        platform = _PlatformProcesses(markers, lambda: now[0], set)
        first = platform.cpu_s()
        assert platform.pids() == {pid}
        time.sleep(0.3)
        assert platform.cpu_s() > first  # only what it used since it was found
        # a pid whose start time is not the one listed belongs to another process now: dropped at once
        started, last_s = platform._known[pid]
        platform._known[pid] = (started - 1, last_s)
        total = platform.cpu_s()
        assert platform.pids() == set()
        assert platform.cpu_s() == total
    with burning("--sieve-test-platform", token) as pid:
        platform = _PlatformProcesses(markers, lambda: now[0], set)
        platform.cpu_s()
        assert platform.pids() == {pid}
        os.kill(pid, signal.SIGKILL)
        for _ in range(50):  # until it is reaped (its launcher's child, re-parented to init)
            if proc_stat(pid) is None:
                break
            time.sleep(0.05)
        total = platform.cpu_s()
        assert platform.pids() == set() and platform.cpu_s() == total
    # the worker's own processes never count, whatever they are called
    with burning("--sieve-test-platform", token) as pid:
        platform = _PlatformProcesses(markers, lambda: now[0], lambda: {pid})
        platform.cpu_s()
        assert platform.pids() == set()


def test_proc_stat_reads_a_processes_name_start_and_cpu_time() -> None:
    me = proc_stat(os.getpid())
    assert me is not None and me.name and me.cpu_s > 0
    assert me == proc_stat(os.getpid()) or me.cpu_s <= (proc_stat(os.getpid()) or me).cpu_s
    assert proc_stat(2**22 + 12345) is None

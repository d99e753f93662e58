"""The worker's own resource readings: CPU, memory and GPU memory, measured against the limits this worker
actually runs under (a container's quota, not the host's cores), and how much of each is the worker's own doing
(its own load is bounded by its concurrency; the watermarks guard against load it does not control).

`ResourceSampler.sample` gives the `Resources` a worker registers and heartbeats with, and from which it
decides whether to hold back (`worker_svc.pressure`, on top of the shared `sieve.redis.worker_records.availability`).

Where each reading comes from (`Resources.scope` says which was used, e.g. "cpu=cgroup v2,memory=host"):

- **CPU**: the worker's cgroup when it has a CPU limit tighter than the cores it may run on — cgroup v2
  `cpu.max` (quota / period) with `cpu.stat` usage_usec, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` with
  `cpuacct.usage` — as a percentage of that quota; otherwise the host (`/proc/stat` through psutil, the CPUs of
  its affinity mask) as a percentage of those cores. Always over the last `CPU_WINDOW_S` (a sliding window of
  the counters, so that every caller sees the same recent second, however often it samples).
- **this worker's own CPU** (`cpu_own_percent`): the CPU time of its process tree — the process with its reaped
  children (`os.times`) plus its live descendants (listed again every `CHILDREN_EVERY_S`, and within
  `RELIST_AFTER_S` when the rest reads near the watermark, so that a child just started is not taken for someone
  else's load) — over the
  same window, against the same capacity.
- **the platform's own CPU** (`cpu_platform_percent`): of the rest, what the platform's own other processes used
  (`Settings.platform_processes`: the other Sieve services and workers, the Redis and PostgreSQL servers), listed
  by name and command line on the same schedule as the children (a walk of /proc), their own CPU time read from
  `/proc/<pid>/stat` in between (a pid reused by another process is told apart by its start time; the worker's
  own tree never counts twice); where CPU is read against a cgroup's quota, only processes in that cgroup count
  (`/proc/<pid>/cgroup`). The CPU watermark applies to `cpu_percent - cpu_own_percent - cpu_platform_percent`.
- **memory**: the cgroup when it has a memory limit below the host's memory — v2 `memory.max` against
  `memory.current` minus `inactive_file` of `memory.stat` (the working set: reclaimable page cache does not
  count), or v1 `memory.limit_in_bytes` against `memory.usage_in_bytes` minus `total_inactive_file` — otherwise
  the host (`psutil.virtual_memory`).
- **GPU memory**: NVML, per device, with the share held by this worker's own processes where NVML lists
  per-process usage (`nvmlDeviceGetComputeRunningProcesses`; in a container with its own PID namespace NVML's
  PIDs do not match and the share reads 0). The device with the least room left for this worker decides.

The cgroup in use is found from `/proc/self/cgroup` and `/proc/self/mountinfo` (a v2 hierarchy whose controllers
are in use, else the v1 controllers), walking from the worker's own cgroup up to the mount's root and taking the
tightest limit on the way. A reading that cannot be taken falls back to the host; a host without a GPU, without
the NVIDIA driver, or whose NVML calls fail reads as "no GPU" (zeros), never as an error.

Tests fix the percentages with `SIEVE_FIXED_RESOURCES`: either the readings themselves,
"cpu=90,memory=20,gpu_memory=0,gpu_util=0" (any subset; `cpu_own` and `gpu_memory_own` fix this worker's share,
`cpu_platform` the platform's, which otherwise read 0 wherever the total is fixed), or "file:/path" naming a file
holding them, read again on every sample so that a test can change the readings of a running worker (an empty
file fixes nothing).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sieve.redis.worker_records import availability
from sieve.settings import Settings
from sieve.v1 import registry_pb2

log = logging.getLogger("sieve.worker.resources")

FIXED_RESOURCES_VAR = "SIEVE_FIXED_RESOURCES"
#: The readings SIEVE_FIXED_RESOURCES may fix, all percentages 0..100.
FIXED_KEYS = ("cpu", "cpu_own", "cpu_platform", "memory", "gpu_memory", "gpu_memory_own", "gpu_util")
_FILE_PREFIX = "file:"

#: CPU readings cover this much of the recent past (seconds).
CPU_WINDOW_S = 1.0
#: A CPU reading needs at least this much time between its two counter readings (seconds).
MIN_CPU_SPAN_S = 0.05
#: How often the worker's child processes are listed again (listing walks /proc; reading known ones is cheap).
CHILDREN_EVERY_S = 5.0
#: ... and, when the CPU of others reads near the watermark, again if the last listing is older than this: often
#: enough that a child just started is counted as the worker's own well within CPU_ENTER_AFTER_S (worker_svc.pressure),
#: and no more often, since a listing reads every process's /proc entry (about 7 ms on a busy host: at every sample,
#: as before, a few percent of a core per worker whenever the host is busy)
RELIST_AFTER_S = 1.0
#: A cgroup v1 limit at or above this is "no limit" (the kernel's page-rounded LLONG_MAX).
_V1_UNLIMITED = 2**62


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
            raise ValueError(
                f"{FIXED_RESOURCES_VAR}: unknown reading {key!r} (expected one of {', '.join(FIXED_KEYS)})"
            )
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


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(psutil.cpu_count(logical=True) or 1))


# --- cgroups --------------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _stat_field(text: str | None, *names: str) -> int | None:
    """The first of `names` in a "key value" per line file (cpu.stat, memory.stat)."""
    if text is None:
        return None
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value.strip()
    for name in names:
        if name in values:
            try:
                return int(values[name])
            except ValueError:
                return None
    return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class _Mount:
    """One cgroup mount of /proc/self/mountinfo: which hierarchy (v1 or v2) it shows, where, with which
    controllers."""

    root: str  # the cgroup path this mount shows at its mount point
    point: Path
    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: the controllers of the hierarchy; v2: those enabled at its root


def _mounts(mountinfo: str, fs_root: Path) -> list[_Mount]:
    mounts: list[_Mount] = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = fs_root / fields[4].lstrip("/")
        if tail[0] == "cgroup2":
            controllers = frozenset((_read(point / "cgroup.controllers") or "").split())
            mounts.append(_Mount(fields[3], point, 2, controllers))
        else:
            mounts.append(_Mount(fields[3], point, 1, frozenset(tail[2].split(","))))
    return mounts


def _own_dir(mount: _Mount, path: str) -> Path:
    """The directory of cgroup `path` (as /proc/self/cgroup names it) under `mount`: inside a cgroup namespace
    or a bind-mounted subtree the path may lie above what the mount shows; then the mount's root is ours."""
    relative = path
    if mount.root != "/" and (path == mount.root or path.startswith(mount.root.rstrip("/") + "/")):
        relative = path[len(mount.root.rstrip("/")) :]
    candidate = mount.point / relative.lstrip("/")
    return candidate if candidate.is_dir() else mount.point


def _up(leaf: Path, top: Path) -> list[Path]:
    """leaf, its parent, ... up to and including top."""
    chain = [leaf]
    while chain[-1] != top and top in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _path_up(path: str, leaf: Path, directory: Path) -> str:
    """The cgroup path (as /proc/self/cgroup names them) of `directory`, an ancestor-or-self of `leaf`, the
    directory of cgroup `path`: as many components up from `path` as `directory` is from `leaf`."""
    parts = [p for p in path.split("/") if p]
    levels = len(leaf.relative_to(directory).parts)
    return "/" + "/".join(parts[: max(0, len(parts) - levels)])


@dataclass(frozen=True, slots=True)
class CgroupCpu:
    """A CPU limit: `cores` of CPU time per second, its cumulative usage read in `directory`; `path` is that
    cgroup as /proc/<pid>/cgroup names it (in this process's cgroup namespace), to tell which processes use its
    quota (`holds`; None: unknown, none is taken to)."""

    version: int
    directory: Path
    cores: float
    path: str | None = None

    def holds(self, proc_cgroup: str | None) -> bool:
        """Whether a process whose /proc/<pid>/cgroup reads `proc_cgroup` is in this cgroup or below it (its CPU
        time is in this usage, against this quota). A path outside this cgroup namespace ("/../x") never is."""
        if proc_cgroup is None or self.path is None:
            return False
        v2_path, v1_paths = _own_cgroups(proc_cgroup)
        path = v2_path if self.version == 2 else v1_paths.get("cpu")
        if not path or ".." in path.split("/"):
            return False
        top = self.path.rstrip("/")
        return path == self.path or path.startswith(top + "/")

    def usage_s(self) -> float | None:
        if self.version == 2:
            usec = _stat_field(_read(self.directory / "cpu.stat"), "usage_usec")
            return None if usec is None else usec / 1e6
        nsec = _int(_read(self.directory / "cpuacct.usage"))
        return None if nsec is None else nsec / 1e9


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """A memory limit in bytes and where its usage is read."""

    version: int
    directory: Path
    limit_bytes: int

    def used_bytes(self) -> int | None:
        """The working set: usage minus inactive page cache (what the kernel cannot simply drop)."""
        if self.version == 2:
            current = _int(_read(self.directory / "memory.current"))
            inactive = _stat_field(_read(self.directory / "memory.stat"), "inactive_file")
        else:
            current = _int(_read(self.directory / "memory.usage_in_bytes"))
            inactive = _stat_field(_read(self.directory / "memory.stat"), "total_inactive_file", "inactive_file")
        if current is None:
            return None
        return max(0, current - (inactive or 0))


@dataclass(frozen=True, slots=True)
class Cgroups:
    """The limits this process runs under (None: that resource is limited only by the host)."""

    cpu: CgroupCpu | None = None
    memory: CgroupMemory | None = None


def _v2_cpu(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if text is None:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_cpu(directory: Path) -> float | None:
    quota = _int(_read(directory / "cpu.cfs_quota_us"))
    period = _int(_read(directory / "cpu.cfs_period_us"))
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def _v2_memory(directory: Path) -> int | None:
    text = _read(directory / "memory.max")
    if text is None or text.strip() == "max":
        return None
    return _int(text)


def _v1_memory(directory: Path) -> int | None:
    limit = _int(_read(directory / "memory.limit_in_bytes"))
    return None if limit is None or limit >= _V1_UNLIMITED else limit


def _tightest(chain: list[Path], read: Callable[[Path], Any]) -> tuple[Path, Any] | None:
    found = [(d, v) for d in chain if (v := read(d)) is not None]
    return min(found, key=lambda dv: dv[1]) if found else None


def detect_cgroups(
    fs_root: Path = Path("/"), *, host_cores: int | None = None, host_memory_bytes: int | None = None
) -> Cgroups:
    """The CPU and memory limits of this process's cgroups, read under `fs_root` (a test passes a directory
    laid out as /proc/self and /sys/fs/cgroup are). A limit no tighter than the host's cores / memory is no
    limit. Never raises: what cannot be read is no limit."""
    try:
        own = _read(fs_root / "proc/self/cgroup") or ""
        mounts = _mounts(_read(fs_root / "proc/self/mountinfo") or "", fs_root)
    except Exception:  # an odd /proc: the host it is
        log.debug("cgroup detection failed", exc_info=True)
        return Cgroups()
    v2_path, v1_paths = _own_cgroups(own)
    cores = host_cores if host_cores is not None else len(_affinity())
    memory_total = host_memory_bytes if host_memory_bytes is not None else int(psutil.virtual_memory().total)
    # the v2 hierarchy first; what it does not limit, the v1 controllers may
    cpu, memory = _v2_limits(mounts, v2_path, cores, memory_total)
    if cpu is None:
        cpu = _v1_cpu_limit(mounts, v1_paths, cores)
    if memory is None:
        memory = _v1_memory_limit(mounts, v1_paths, memory_total)
    return Cgroups(cpu, memory)


def _own_cgroups(text: str) -> tuple[str | None, dict[str, str]]:
    """From /proc/self/cgroup: this process's v2 cgroup path (None without one) and each v1 controller's path."""
    v1_paths: dict[str, str] = {}
    v2_path: str | None = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2_path = path.strip()
        else:
            for c in controllers.split(","):
                v1_paths[c] = path.strip()
    return v2_path, v1_paths


def _v2_limits(
    mounts: list[_Mount], path: str | None, cores: int, memory_total: int
) -> tuple[CgroupCpu | None, CgroupMemory | None]:
    """The tightest CPU and memory limits on the way up from cgroup v2 `path`, where its mount has the controller
    and the limit is tighter than the host's."""
    cpu: CgroupCpu | None = None
    memory: CgroupMemory | None = None
    if path is None:
        return cpu, memory
    for mount in mounts:
        if mount.version != 2:
            continue
        leaf = _own_dir(mount, path)
        chain = _up(leaf, mount.point)
        if cpu is None and "cpu" in mount.controllers:
            hit = _tightest(chain, _v2_cpu)
            if hit and hit[1] < cores:
                cpu = CgroupCpu(2, hit[0], hit[1], _path_up(path, leaf, hit[0]))
        if memory is None and "memory" in mount.controllers:
            hit = _tightest(chain, _v2_memory)
            if hit and hit[1] < memory_total:
                memory = CgroupMemory(2, hit[0], hit[1])
    return cpu, memory


def _v1_cpu_limit(mounts: list[_Mount], paths: dict[str, str], cores: int) -> CgroupCpu | None:
    """The tightest v1 CPU quota tighter than the host's cores, with the directory its usage is read from (the
    cpuacct hierarchy, which may be mounted apart from cpu)."""
    if "cpu" not in paths:
        return None
    for mount in mounts:
        if mount.version != 1 or "cpu" not in mount.controllers:
            continue
        leaf = _own_dir(mount, paths["cpu"])
        hit = _tightest(_up(leaf, mount.point), _v1_cpu)
        if hit and hit[1] < cores:
            usage_dir: Path | None = hit[0]
            if "cpuacct" not in mount.controllers:  # usage is in the cpuacct hierarchy, same path
                usage_dir = _cpuacct_dir(mounts, paths, hit[0], mount)
            if usage_dir is not None:
                return CgroupCpu(1, usage_dir, hit[1], _path_up(paths["cpu"], leaf, hit[0]))
    return None


def _v1_memory_limit(mounts: list[_Mount], paths: dict[str, str], memory_total: int) -> CgroupMemory | None:
    """The tightest v1 memory limit below the host's memory."""
    if "memory" not in paths:
        return None
    for mount in mounts:
        if mount.version != 1 or "memory" not in mount.controllers:
            continue
        hit = _tightest(_up(_own_dir(mount, paths["memory"]), mount.point), _v1_memory)
        if hit and hit[1] < memory_total:
            return CgroupMemory(1, hit[0], hit[1])
    return None


def _cpuacct_dir(mounts: list[_Mount], v1_paths: dict[str, str], cpu_dir: Path, cpu_mount: _Mount) -> Path | None:
    relative = cpu_dir.relative_to(cpu_mount.point)
    for mount in mounts:
        if mount.version == 1 and "cpuacct" in mount.controllers:
            candidate = mount.point / relative
            if (candidate / "cpuacct.usage").exists():
                return candidate
            if "cpuacct" in v1_paths:
                own = _own_dir(mount, v1_paths["cpuacct"])
                if (own / "cpuacct.usage").exists():
                    return own
    return None


# --- CPU counters ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _CpuPoint:
    """One reading of the cumulative CPU counters; two of them a window apart give a CPU percentage."""

    at: float  # monotonic s
    busy_s: float  # CPU seconds used in the domain (cumulative)
    capacity_s: float  # CPU seconds the domain could have used (cumulative)
    own_s: float  # CPU seconds of this worker's process tree (cumulative)
    platform_s: float = 0.0  # CPU seconds of the platform's other processes (cumulative, as far as seen)


class _ProcessTree:
    """CPU seconds of this process and its descendants; children are listed every CHILDREN_EVERY_S."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._me = psutil.Process()
        self._children: list[psutil.Process] = []
        self._listed_at = -math.inf

    def pids(self) -> set[int]:
        self._refresh()
        return self.known_pids()

    def known_pids(self) -> set[int]:
        """The process and the descendants of the last listing (lists nothing)."""
        return {self._me.pid, *(c.pid for c in self._children)}

    def listed_ago(self) -> float:
        return self._clock() - self._listed_at

    def _refresh(self, force: bool = False) -> None:
        if self.listed_ago() < (RELIST_AFTER_S if force else CHILDREN_EVERY_S):
            return
        self._listed_at = self._clock()
        try:
            self._children = self._me.children(recursive=True)
        except psutil.Error:
            self._children = []

    def cpu_s(self, relist: bool = False) -> float:
        """CPU seconds so far (cumulative); `relist` lists the descendants again first (if not just done)."""
        self._refresh(relist)
        own = os.times()
        total = own.user + own.system + own.children_user + own.children_system
        alive: list[psutil.Process] = []
        for child in self._children:
            try:
                t = child.cpu_times()
            except psutil.Error:  # gone: its time moves to our children_* once reaped
                continue
            total += t.user + t.system + t.children_user + t.children_system
            alive.append(child)
        self._children = alive
        return total


#: /proc, where processes are listed and their CPU time read (the host's: fs_root is for cgroup files only)
_PROC = Path("/proc")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: the kernel's limit of a process name (/proc/<pid>/comm): a longer name is matched by its first 15 characters
_COMM_CHARS = 15


def _read_text(path: Path) -> str | None:
    """A /proc file as text (what a process wrote there may be any bytes); None when it cannot be read."""
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What /proc/<pid>/stat says of a process: its name, when it started (clock ticks after boot: with the pid,
    its identity, as psutil's create_time) and the CPU time it used itself (its reaped children's left out)."""

    name: str
    started_ticks: int
    cpu_s: float


def proc_stat(pid: int, proc: Path = _PROC) -> ProcStat | None:
    """One read of /proc/<pid>/stat; None when the process is gone (or the file is not as expected)."""
    text = _read_text(proc / str(pid) / "stat")
    if text is None:
        return None
    head, sep, tail = text.rpartition(")")  # the name may hold spaces and parentheses: it ends at the last ")"
    fields = tail.split()
    if not sep or len(fields) < 20:
        return None
    try:
        # after the name: state(3) ... utime(14) stime(15) ... starttime(22), numbered as proc(5) numbers them
        utime, stime, started = int(fields[11]), int(fields[12]), int(fields[19])
    except ValueError:
        return None
    return ProcStat(head.partition("(")[2], started, (utime + stime) / _CLOCK_TICKS)


def platform_process(markers: tuple[tuple[str, ...], ...], name: str, argv: list[str]) -> bool:
    """Whether a process of this name (/proc/<pid>/comm) and command line is one of the platform's (`markers`:
    `Settings.platform_processes`). A one-word marker without "/" is a process name: the name, or the last part
    of the program's path (argv[0], up to its first space: servers rewrite theirs, "redis-server 127.0.0.1:6379");
    a longer name matches a name cut at 15 characters by the kernel. Any other marker is a command-line marker:
    its words as consecutive arguments, a word with "/" also as the end of a path ("deploy/run_local.py" matches
    "/srv/sieve/deploy/run_local.py")."""
    program = argv[0].split(" ", 1)[0].rsplit("/", 1)[-1] if argv else ""
    for words in markers:
        if len(words) == 1 and "/" not in words[0]:
            word = words[0]
            if word in (name, program) or (len(name) == _COMM_CHARS and word[:_COMM_CHARS] == name):
                return True
            continue
        for i in range(len(argv) - len(words) + 1):
            if all(_word_matches(w, argv[i + k]) for k, w in enumerate(words)):
                return True
    return False


def _word_matches(word: str, arg: str) -> bool:
    return arg == word or ("/" in word and arg.endswith("/" + word.lstrip("/")))


class _PlatformProcesses:
    """CPU seconds of the platform's own other processes (`Settings.platform_processes`): they are listed every
    CHILDREN_EVERY_S (a walk of /proc: every process's stat and command line; within RELIST_AFTER_S when asked to),
    and between listings only their /proc/<pid>/stat is read, one small file each.

    The total only ever grows by what a known process used since it was last read: one found at the first listing
    adds nothing for its past, one found later (it started since the listing before) adds all it used, as a
    child of the worker's does; one that is gone, or whose pid now belongs to another process (another start
    time), is dropped. Processes of `exclude` (the worker's own tree) never count, and with `in_domain` only the
    processes it accepts (the cgroup whose quota the CPU is read against) do. A process's reaped children are
    left out: a PostgreSQL server's exited backends would count twice (they were read while alive)."""

    def __init__(
        self,
        markers: tuple[tuple[str, ...], ...],
        clock: Callable[[], float],
        exclude: Callable[[], set[int]],
        in_domain: Callable[[int], bool] | None = None,
    ) -> None:
        self._markers = markers
        self._clock = clock
        self._exclude = exclude
        self._in_domain = in_domain
        #: pid -> (start ticks, CPU seconds when last read)
        self._known: dict[int, tuple[int, float]] = {}
        self._total_s = 0.0
        self._listed_at = -math.inf
        self._listed_boot_s: float | None = None  # when the last listing began, in seconds after boot

    @property
    def enabled(self) -> bool:
        return bool(self._markers)

    def pids(self) -> set[int]:
        """The platform processes of the last listing."""
        return set(self._known)

    def listed_ago(self) -> float:
        return self._clock() - self._listed_at

    def _refresh(self, force: bool) -> None:
        if not self._markers:
            return
        if self._clock() - self._listed_at < (RELIST_AFTER_S if force else CHILDREN_EVERY_S):
            return
        self._listed_at = self._clock()
        previous, since_boot_s = self._listed_boot_s, _boot_s()
        self._listed_boot_s = since_boot_s
        try:
            entries = os.listdir(_PROC)
        except OSError:
            entries = []
        exclude = self._exclude()
        known: dict[int, tuple[int, float]] = {}
        for entry in entries:
            if not entry.isdigit() or (pid := int(entry)) in exclude:
                continue
            stat = proc_stat(pid)
            if stat is None or not self._matches(pid, stat.name):
                continue
            if self._in_domain is not None and not self._in_domain(pid):
                continue
            old = self._known.get(pid)
            if old is not None and old[0] == stat.started_ticks:
                known[pid] = old
            elif previous is not None and stat.started_ticks / _CLOCK_TICKS >= previous - 0.05:
                known[pid] = (stat.started_ticks, 0.0)  # started since the last listing: all it used is recent
            else:
                known[pid] = (stat.started_ticks, stat.cpu_s)  # running before: from now on
        self._known = known

    def _matches(self, pid: int, name: str) -> bool:
        if platform_process(self._markers, name, []):
            return True
        raw = _read_text(_PROC / str(pid) / "cmdline")
        argv = raw.rstrip("\0").split("\0") if raw else []
        return bool(argv) and platform_process(self._markers, name, argv)

    def cpu_s(self, relist: bool = False) -> float:
        """CPU seconds so far (cumulative, from the first listing on); `relist` lists again first (if not just
        done). A pid of `exclude` now (the worker's tree as last listed) is dropped."""
        self._refresh(relist)
        if not self._known:
            return self._total_s
        skip = self._exclude()
        for pid, (started, last_s) in list(self._known.items()):
            stat = proc_stat(pid)
            if stat is None or stat.started_ticks != started or pid in skip:
                del self._known[pid]  # gone, or its pid is another process's now
                continue
            self._total_s += max(0.0, stat.cpu_s - last_s)
            self._known[pid] = (started, stat.cpu_s)
        return self._total_s


def _boot_s() -> float:
    """Seconds since boot, as /proc/<pid>/stat's start times count them."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


class _HostCpu:
    """Busy and total CPU seconds of the CPUs this process may run on (/proc/stat)."""

    def __init__(self) -> None:
        self.cpus = _affinity()
        self._all = len(self.cpus) >= (psutil.cpu_count(logical=True) or 1)

    def read(self) -> tuple[float, float]:
        rows = (
            [psutil.cpu_times()]
            if self._all
            else [t for i, t in enumerate(psutil.cpu_times(percpu=True)) if i in self.cpus]
        )
        busy = total = 0.0
        for t in rows:
            # as psutil.cpu_percent counts them: guest time is already in user time; iowait is idle
            everything = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
            idle = t.idle + getattr(t, "iowait", 0.0)
            busy += everything - idle
            total += everything
        return busy, total


# --- GPUs -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GpuReading:
    """One device: memory used in all and by this worker's processes (bytes), utilisation (percent)."""

    total_bytes: int
    used_bytes: int
    own_bytes: int
    util_percent: float

    @property
    def used_percent(self) -> float:
        return 100.0 * self.used_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def own_percent(self) -> float:
        return 100.0 * min(self.own_bytes, self.used_bytes) / self.total_bytes if self.total_bytes else 0.0


def fill_gpus(out: registry_pb2.Resources, names: list[str], readings: list[GpuReading]) -> None:
    """GPU fields of `out`: the device with the most memory used by others decides gpu_memory_percent and
    gpu_memory_own_percent (CUDA runs out of memory per device, not in aggregate)."""
    if not readings:
        return
    out.gpu_available = True
    out.gpu_count = len(readings)
    out.gpu_names.extend(names)
    out.gpu_memory_total_bytes = sum(r.total_bytes for r in readings)
    worst = max(readings, key=lambda r: (r.used_percent - r.own_percent, r.used_percent))
    out.gpu_memory_percent = worst.used_percent
    out.gpu_memory_own_percent = worst.own_percent
    out.gpu_util_percent = sum(r.util_percent for r in readings) / len(readings)


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

    def _own_bytes(self, handle: Any, pids: set[int]) -> int:
        """Memory this worker's processes hold on one device (0 where NVML does not list it)."""
        pynvml = self._nvml
        own = 0
        for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                processes = getattr(pynvml, query)(handle)
            except (pynvml.NVMLError, AttributeError):  # not supported here, or an older pynvml
                continue
            for p in processes:
                used = getattr(p, "usedGpuMemory", None)
                if getattr(p, "pid", None) in pids and isinstance(used, int) and used > 0:
                    own += used
        return own

    def read(self, pids: set[int]) -> list[GpuReading]:
        """One reading per device ([] when there is no GPU or NVML fails)."""
        if self._nvml is None or not self._handles:
            return []
        pynvml = self._nvml
        try:
            memories = [pynvml.nvmlDeviceGetMemoryInfo(h) for h in self._handles]
            utils = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
        except pynvml.NVMLError as exc:
            log.warning("GPU readings failed (%s); reporting no GPU for this sample", exc)
            return []
        return [
            GpuReading(int(m.total), int(m.used), self._own_bytes(h, pids), float(u))
            for h, m, u in zip(self._handles, memories, utils, strict=True)
        ]

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


# --- the sampler ----------------------------------------------------------------------------------
class ResourceSampler:
    """Samples this worker's resources against its own limits; one per worker process.

    Owns the cgroup / host / NVML readers and the short history of CPU counters the sliding CPU window is
    computed from. `fs_root` and `clock` are for tests (a directory of cgroup files, a controllable clock).
    """

    def __init__(
        self, settings: Settings, *, fs_root: Path = Path("/"), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._fixed_source = settings.fixed_resources.strip()
        self._fixed()  # a bad SIEVE_FIXED_RESOURCES fails at start, not at the first heartbeat
        self._host = _HostCpu()
        self.cgroups = detect_cgroups(fs_root, host_cores=len(self._host.cpus))
        self._tree = _ProcessTree(clock)
        cpu = self.cgroups.cpu
        self._fs_root = fs_root
        self._platform = _PlatformProcesses(
            settings.platform_processes,
            clock,
            self._tree.known_pids,
            self._in_cpu_cgroup if cpu is not None else None,
        )
        self._cpu_count = max(1, math.ceil(cpu.cores)) if cpu else len(self._host.cpus)
        self._points: deque[_CpuPoint] = deque()
        self._cpu_point()  # the window starts now
        self._gpus = _Gpus()
        log.info("resource readings: %s", self.scope)

    def platform_pids(self) -> set[int]:
        """The platform's own processes whose CPU is left out, as last listed."""
        return self._platform.pids()

    @property
    def gpu_present(self) -> bool:
        return bool(self._gpus.names)

    @property
    def scope(self) -> str:
        """Where CPU and memory are read: "cpu=cgroup v2,memory=host" and the like."""
        cpu, memory = self.cgroups.cpu, self.cgroups.memory
        return (
            f"cpu={f'cgroup v{cpu.version}' if cpu else 'host'},"
            f"memory={f'cgroup v{memory.version}' if memory else 'host'}"
        )

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

    def _in_cpu_cgroup(self, pid: int) -> bool:
        """Whether process `pid` is in the cgroup whose CPU quota the readings are of (only those use it)."""
        cpu = self.cgroups.cpu
        return cpu is not None and cpu.holds(_read_text(self._fs_root / "proc" / str(pid) / "cgroup"))

    def _cpu_point(self) -> _CpuPoint:
        now = self._clock()
        cpu = self.cgroups.cpu
        usage = cpu.usage_s() if cpu else None
        if cpu is not None and usage is not None:
            busy, capacity = usage, now * cpu.cores
        else:
            busy, capacity = self._host.read()
        point = _CpuPoint(now, busy, capacity, self._tree.cpu_s(), self._platform.cpu_s())
        self._points.append(point)
        # keep the newest point that is at least a window old, and everything after it
        while len(self._points) > 2 and now - self._points[1].at >= CPU_WINDOW_S:
            self._points.popleft()
        return point

    def cpu_percent(self) -> tuple[float, float, float]:
        """(CPU in use in this worker's domain, of which this worker's own, of the rest the platform's own other
        processes'), in percent, over the window."""
        point = self._cpu_point()
        if len(self._points) > 1 and point.at - self._points[0].at < MIN_CPU_SPAN_S:
            # sampled again at once: the previous reading stands (a tiny span would be all noise)
            self._points.pop()
            point = self._points[-1]
        base = self._points[0]
        capacity = point.capacity_s - base.capacity_s
        if capacity <= 0 or point is base:
            return 0.0, 0.0, 0.0
        busy = max(0.0, point.busy_s - base.busy_s)
        total = min(100.0, 100.0 * busy / capacity)

        def shares(p: _CpuPoint) -> tuple[float, float]:
            own = min(total, 100.0 * max(0.0, p.own_s - base.own_s) / capacity)
            return own, min(total - own, 100.0 * max(0.0, p.platform_s - base.platform_s) / capacity)

        own, platform = shares(point)
        near = self._settings.cpu_watermark_pct - max(0.0, self._settings.watermark_hysteresis_pct)
        stale = self._tree.listed_ago() >= RELIST_AFTER_S or (
            self._platform.enabled and self._platform.listed_ago() >= RELIST_AFTER_S
        )
        if total - own - platform >= near and stale:
            # others' share reads high: make sure it is not a child of this worker's, or a platform process, that
            # was not listed yet
            own_s = self._tree.cpu_s(relist=True)
            point = _CpuPoint(point.at, point.busy_s, point.capacity_s, own_s, self._platform.cpu_s(relist=True))
            self._points[-1] = point
            own, platform = shares(point)
        return total, own, platform

    def _memory(self, out: registry_pb2.Resources) -> None:
        memory = self.cgroups.memory
        used = memory.used_bytes() if memory else None
        if memory is not None and used is not None:
            out.memory_total_bytes = memory.limit_bytes
            out.memory_available_bytes = max(0, memory.limit_bytes - used)
            out.memory_percent = min(100.0, 100.0 * used / memory.limit_bytes)
            return
        host = psutil.virtual_memory()
        out.memory_total_bytes = int(host.total)
        out.memory_available_bytes = int(host.available)
        out.memory_percent = float(host.percent)

    def sample(self, active_tasks: int) -> registry_pb2.Resources:
        """Fresh readings (CPU over the last CPU_WINDOW_S), with fixed readings applied."""
        cpu, own, platform = self.cpu_percent()
        out = registry_pb2.Resources(
            cpu_count=self._cpu_count,
            cpu_percent=cpu,
            cpu_own_percent=own,
            cpu_platform_percent=platform,
            active_tasks=max(0, active_tasks),
            scope=self.scope,
        )
        self._memory(out)
        fill_gpus(out, self._gpus.names, self._gpus.read(self._tree.pids()) if self._gpus.names else [])
        fixed = self._fixed()
        if "cpu" in fixed:
            out.cpu_percent = fixed["cpu"]
            out.cpu_own_percent = min(fixed["cpu"], fixed.get("cpu_own", 0.0))
            out.cpu_platform_percent = min(fixed["cpu"] - out.cpu_own_percent, fixed.get("cpu_platform", 0.0))
        else:
            if "cpu_own" in fixed:
                out.cpu_own_percent = min(out.cpu_percent, fixed["cpu_own"])
            if "cpu_platform" in fixed or "cpu_own" in fixed:
                platform = fixed.get("cpu_platform", out.cpu_platform_percent)
                out.cpu_platform_percent = min(out.cpu_percent - out.cpu_own_percent, platform)
        if "memory" in fixed:
            out.memory_percent = fixed["memory"]
            out.memory_available_bytes = int(out.memory_total_bytes * (100.0 - fixed["memory"]) / 100.0)
        if "gpu_memory" in fixed:
            out.gpu_memory_percent = fixed["gpu_memory"]
            out.gpu_memory_own_percent = min(fixed["gpu_memory"], fixed.get("gpu_memory_own", 0.0))
        elif "gpu_memory_own" in fixed:
            out.gpu_memory_own_percent = min(out.gpu_memory_percent, fixed["gpu_memory_own"])
        if "gpu_util" in fixed:
            out.gpu_util_percent = fixed["gpu_util"]
        return out

    def close(self) -> None:
        """Releases NVML."""
        self._gpus.close()


__all__ = [
    "FIXED_KEYS",
    "CgroupCpu",
    "CgroupMemory",
    "Cgroups",
    "GpuReading",
    "ResourceSampler",
    "detect_cgroups",
    "fill_gpus",
    "over_watermark",
    "parse_fixed_resources",
]

"""Running a command inside a fresh memory cgroup with a limit, and what the limit saw.

A memory limit (a container's, a systemd unit's ``MemoryMax=``) charges a process tree
for more than its anonymous memory: the page cache of the files it reads and writes, and
the dirty pages of files it maps, until they are written back.  `run_limited` starts a
command in a new cgroup below the caller's own (so whatever limits the caller has still
hold), with ``limit_bytes``, waits for it, and returns what the cgroup recorded: its peak
(v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``), whether the OOM killer killed
anything in it (v1 ``memory.oom_control`` ``oom_kill``, v2 ``memory.events``
``oom_kill``), beside the command's peak RSS (``ru_maxrss`` of the whole tree's largest
process) and the cgroup's peak anonymous memory and dirty file pages (sampled from its
``memory.stat`` every 0.1 s).  Used by
the memory tests (tests/report/test_memory_limit.py) and the benchmark
(bench/bench_memlimit.py).

`cgroup_unavailable` says why no cgroup can be made here (no memory controller mounted,
not root, a read-only hierarchy), or None.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence


V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOT = "/sys/fs/cgroup"


@dataclass
class LimitedRun:
    """What one command did inside its memory cgroup."""

    returncode: int
    seconds: float
    limit_mb: float
    peak_mb: float          # the cgroup's peak charge: what the limit compares
    oom_kills: int          # processes the OOM killer killed in the cgroup
    rss_mb: float           # the largest process's peak RSS
    anon_mb: float          # the cgroup's peak anonymous memory (sampled)
    dirty_mb: float         # the cgroup's peak dirty + writeback file pages (sampled)
    stdout: str
    stderr: str
    version: int            # cgroup version used (1 or 2)

    def line(self) -> str:
        return (f"exit {self.returncode}, {self.seconds:.1f} s; cgroup peak "
                f"{self.peak_mb:.0f} MB of {self.limit_mb:.0f} MB, oom_kill {self.oom_kills}; "
                f"peak RSS {self.rss_mb:.0f} MB, anonymous {self.anon_mb:.0f} MB, dirty "
                f"{self.dirty_mb:.0f} MB")


def _own_cgroup(controller: str) -> Optional[str]:
    """The caller's cgroup path in ``controller`` ("" for v2's unified line)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(",") or (controller == "" and names == ""):
                return path
    return None


def _hierarchy() -> tuple[int, str]:
    """(version, the directory new cgroups are made under)."""
    if os.path.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
        own = _own_cgroup("memory") or "/"
        return 1, os.path.join(V1_ROOT, own.lstrip("/"))
    if os.path.exists(os.path.join(V2_ROOT, "cgroup.controllers")):
        own = _own_cgroup("") or "/"
        return 2, os.path.join(V2_ROOT, own.lstrip("/"))
    raise OSError("no memory cgroup hierarchy is mounted (neither v1 "
                  f"{V1_ROOT} nor v2 {V2_ROOT})")


def cgroup_unavailable() -> Optional[str]:
    """Why a memory cgroup cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    try:
        version, parent = _hierarchy()
        if version == 2:
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    return f"the memory controller is not enabled below {parent}"
        path = os.path.join(parent, f"ctracer-probe-{uuid.uuid4().hex[:8]}")
        os.mkdir(path)
        os.rmdir(path)
    except OSError as e:
        return f"no memory cgroup can be made here: {e}"
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _oom_kills(version: int, path: str) -> int:
    name = "memory.oom_control" if version == 1 else "memory.events"
    for line in _read(os.path.join(path, name)).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def run_limited(argv: Sequence[str], limit_bytes: int, *, env: Optional[dict] = None,
                cwd: Optional[str] = None, timeout: Optional[float] = None,
                stdin: Optional[int] = subprocess.DEVNULL,
                stdout: Any = subprocess.PIPE) -> LimitedRun:
    """Run ``argv`` in a new memory cgroup limited to ``limit_bytes`` (no swap), wait for
    it and remove the cgroup; what the limit saw (`LimitedRun`).  ``stdout``: where the
    command's output goes (default: captured in `LimitedRun.stdout`; a file, or
    ``subprocess.DEVNULL`` for an output too big to hold)."""
    version, parent = _hierarchy()
    path = os.path.join(parent, f"ctracer-limit-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        if version == 1:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
            try:  # no swap either (memsw exists only with swap accounting)
                _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit_bytes))
            except OSError:
                pass
            procs = os.path.join(path, "cgroup.procs")
        else:
            _write(os.path.join(path, "memory.max"), str(limit_bytes))
            _write(os.path.join(path, "memory.swap.max"), "0")
            procs = os.path.join(path, "cgroup.procs")
        # the child joins the cgroup before it runs the command: nothing it allocates
        # is charged elsewhere
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=stdin,
                                stdout=stdout, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: _write(procs, "0"))
        output: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=n, s=s: output.__setitem__(n, s.read()))
                   for n, s in (("out", proc.stdout), ("err", proc.stderr)) if s is not None]
        for reader in readers:
            reader.start()
        with _StatSampler(version, path) as stat:
            timer = threading.Timer(timeout, proc.kill) if timeout else None
            if timer:
                timer.start()
            # wait4: the command's own usage, its waited-for helpers' included
            _, status, usage = os.wait4(proc.pid, 0)
            if timer:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        for reader in readers:
            reader.join()
        out, err = output.get("out", ""), output.get("err", "")
        seconds = time.perf_counter() - start
        if version == 1:
            peak = int(_read(os.path.join(path, "memory.max_usage_in_bytes")))
        else:
            peak = int(_read(os.path.join(path, "memory.peak")))
        kills = _oom_kills(version, path)
        rss = usage.ru_maxrss / 1024
        return LimitedRun(proc.returncode, seconds, limit_bytes / 2**20, peak / 2**20, kills,
                          rss, stat.anon / 2**20, stat.dirty / 2**20, out, err, version)
    finally:
        _remove(version, path)


class _StatSampler:
    """Peaks of a cgroup's anonymous memory and dirty file pages, sampled in a thread."""

    ANON = {1: ("rss",), 2: ("anon",)}  # v1 rss includes rss_huge
    DIRTY = {1: ("dirty", "writeback"), 2: ("file_dirty", "file_writeback")}

    def __init__(self, version: int, path: str, interval: float = 0.1):
        self.version, self.stat = version, os.path.join(path, "memory.stat")
        self.interval = interval
        self.anon = self.dirty = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        try:
            values = dict(line.split() for line in _read(self.stat).splitlines())
        except (OSError, ValueError):
            return
        self.anon = max(self.anon, sum(int(values.get(k, 0)) for k in self.ANON[self.version]))
        self.dirty = max(self.dirty,
                         sum(int(values.get(k, 0)) for k in self.DIRTY[self.version]))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "_StatSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _remove(version: int, path: str) -> None:
    """Remove the cgroup once its processes are gone (its page cache moves to the
    parent, v1 after ``force_empty``)."""
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except OSError:
            if version == 1:
                try:
                    _write(os.path.join(path, "memory.force_empty"), "0")
                except OSError:
                    pass
            time.sleep(0.05)

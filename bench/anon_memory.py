"""The anonymous memory of a process tree, sampled while it works: what a benchmark
reports as "memory" once big arrays live in mapped files.

A process's peak RSS (``VmHWM``, ``ru_maxrss``) counts the pages of files it maps, which
the kernel drops under pressure and which a memory cgroup's limit reclaims; what cannot
be dropped is anonymous memory.  `AnonSampler` reads ``Pss_Anon`` from
``/proc/PID/smaps_rollup`` of a process and of every process below it (helpers forked
by the renderer share their parent's pages copy-on-write: Pss divides each shared page
among its sharers, so the sum is what the tree holds) every ``interval`` seconds in a
thread, and keeps the peaks.
"""

from __future__ import annotations

import os
import threading
from typing import Optional


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += _children(p)
    return tree


def pss_anon_mb(pid: int) -> Optional[float]:
    """The process's proportional anonymous memory in MB (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class AnonSampler:
    """Peaks of a process tree's anonymous memory, sampled in a thread: ``own`` (the
    root process alone) and ``tree`` (summed over it and its descendants), in MB."""

    def __init__(self, pid: Optional[int] = None, interval: float = 0.25):
        self.pid = pid if pid is not None else os.getpid()
        self.interval = interval
        self.own = self.tree = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        total = 0.0
        for p in process_tree(self.pid):
            mb = pss_anon_mb(p)
            if mb is None:
                continue
            total += mb
            if p == self.pid:
                self.own = max(self.own, mb)
        self.tree = max(self.tree, total)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "AnonSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

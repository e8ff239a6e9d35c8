"""The scheduling priority of the recorder's reading thread while it records.

The probes fill the ring buffer at the traced program's pace; the reading thread must
empty it before it is full.  It needs little CPU (about 0.2 µs a record), but it needs
it when the ring fills: on a busy 2-core machine a thread of normal priority that wakes
up (or has just spent a few milliseconds committing to the trace file) waits tens of
milliseconds for a CPU behind the traced program's own threads and everything else,
and 16 MB of ring holds only a few hundred milliseconds of a busy workload
(docs/compact-events.md has the measurements).  So while recording, the reading thread
runs under the realtime policy ``SCHED_FIFO`` at its lowest priority (1), as ``perf
record -r 1`` does for its whole process: whenever it is runnable it runs, ahead of
every normal thread, and below every realtime thread of the kernel (threaded
interrupts run at 50).

What keeps that safe:

* only the reading thread: the policy is set with ``SCHED_RESET_ON_FORK``, so the traced
  command and every thread the recorder starts (the trace file's checkpoint, the
  detaching of the probes) run at normal priority;
* the thread sleeps in ``epoll`` between takes, and its loop has no busy wait (a poll
  without a timeout happens only while the ring still holds records);
* the kernel's realtime throttling (``kernel.sched_rt_runtime_us``: 95% of each second
  by default) leaves every CPU to the other threads part of the time, even under a
  flood the reader cannot keep up with;
* the previous policy comes back when the recording stops (before the trace file is
  finished), and ``--reader-priority normal`` leaves it alone.

Where the kernel refuses the policy (no ``CAP_SYS_NICE``, or a cgroup without realtime
time), the thread keeps its priority and `ReaderPriority.description` says why.
"""

from __future__ import annotations

import os
from typing import Optional

#: ``--reader-priority``'s choices; the first is the default
CHOICES = ("realtime", "normal")
#: the realtime priority of the reading thread: the lowest (1..99)
REALTIME_PRIORITY = 1
#: how `ReaderPriority.description` begins where the kernel refused the realtime policy
REFUSED = "normal (the kernel refused realtime"


class ReaderPriority:
    """The calling thread's scheduling policy, raised by `begin` (``mode`` "realtime")
    and given back by `end`."""

    def __init__(self, mode: str = "realtime"):
        if mode not in CHOICES:
            raise ValueError(f"unknown reader priority {mode!r}")
        self.mode = mode
        #: what the reading thread ran with, said once `begin` ran (the trace's meta)
        self.description = ""
        self._previous: Optional[tuple[int, os.sched_param]] = None

    @property
    def realtime(self) -> bool:
        """Whether the thread runs under the realtime policy now."""
        return self._previous is not None

    def begin(self) -> None:
        """Raise the calling thread's priority (``mode`` realtime), or say why not."""
        if self.mode == "normal":
            self.description = "normal (--reader-priority normal)"
            return
        if self._previous is not None:
            return
        previous = (os.sched_getscheduler(0), os.sched_getparam(0))
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                                  os.sched_param(REALTIME_PRIORITY))
        except OSError as e:
            self.description = f"{REFUSED}: {e.strerror})"
            return
        self._previous = previous
        self.description = f"realtime (SCHED_FIFO {REALTIME_PRIORITY})"

    def end(self) -> None:
        """Give the calling thread its previous policy back (nothing if `begin` did not
        raise it)."""
        if self._previous is None:
            return
        policy, param = self._previous
        self._previous = None
        os.sched_setscheduler(0, policy, param)

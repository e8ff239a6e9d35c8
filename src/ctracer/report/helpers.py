"""Forked helper processes that write the report's pages, and how their work ends.

The report's pages are written in tasks numbered 0..N-1 that forked helpers run (they
inherit the report data from the parent, so a task goes by its number).  What can end
that work early is turned into one `HelpersStopped` the renderer reports in one line:

* Ctrl-C (or SIGTERM, which the ``report`` command turns into the same): the helpers
  ignore SIGINT (a terminal sends it to every process of the group; a helper's
  ``KeyboardInterrupt`` traceback is what users saw), the parent stops them;
* a helper that dies (killed, out of memory): `concurrent.futures` says so, where a
  ``multiprocessing.Pool`` would wait for its lost task for ever.

SIGINT and SIGTERM are blocked while the helpers are forked, so none is hit before it
ignores them.
"""

from __future__ import annotations

import signal
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class HelpersStopped(Exception):
    """The helpers' work ended before every task was done: ``why`` in words,
    ``signal_number`` when a signal to ctracer ended it (else a helper died)."""

    def __init__(self, why: str, done: int, total: int,
                 signal_number: Optional[int] = None):
        super().__init__(why)
        self.why, self.done, self.total = why, done, total
        self.signal_number = signal_number


def _helper_started() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def run_in_helpers(task: Callable[[int], float], count: int, workers: int,
                   say: Callable[[str], None]) -> float:
    """Run ``task(0)`` ... ``task(count - 1)`` in ``workers`` forked helpers, the lower
    numbers first; the sum of what they return.  `HelpersStopped` on Ctrl-C (a
    ``KeyboardInterrupt`` here) or when a helper dies; a task's own exception is raised
    as it is."""
    return sum(map_in_helpers(task, count, workers, say))


def map_in_helpers(task: Callable[[int], T], count: int, workers: int,
                   say: Callable[[str], None], doing: str = "writing pages",
                   every: int = 20) -> list[T]:
    """`run_in_helpers`, giving what each task returned (pickled back), by task number;
    ``doing`` names the work in progress lines (every ``every`` tasks) and in the
    `HelpersStopped` of a helper that died."""
    import concurrent.futures as cf
    import multiprocessing
    from concurrent.futures.process import BrokenProcessPool

    done = 0
    results: dict[int, T] = {}
    pool: Optional[cf.ProcessPoolExecutor] = None
    try:
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            pool = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                          initializer=_helper_started)
            futures = {pool.submit(task, i): i for i in range(count)}  # the first forks them
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)  # a pending Ctrl-C lands here
        for future in cf.as_completed(futures):
            results[futures[future]] = future.result()
            done += 1
            if done % every == 0 or done == count:
                say(f"{doing}: {done}/{count} done")
    except KeyboardInterrupt:
        _stop(pool)
        raise HelpersStopped("interrupted", done, count, signal.SIGINT) from None
    except BrokenProcessPool:
        _stop(pool)
        raise HelpersStopped(f"a helper process {doing} died (killed, or out of memory)",
                             done, count) from None
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    return [results[i] for i in range(count)]


def _stop(pool) -> None:
    """End the helpers now (they ignore SIGINT; SIGTERM ends them) and the pool; a
    second Ctrl-C meanwhile is ignored, so the one line is the last word."""
    import multiprocessing

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for helper in multiprocessing.active_children():
            helper.terminate()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        signal.signal(signal.SIGINT, previous)

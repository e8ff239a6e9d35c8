"""Heavy commands (``report``, ``export``) run in a forked child that ctracer waits
for, so that when memory runs out ctracer can still say so.

Under a memory limit (a container's, a systemd unit's ``MemoryMax=``, a memory cgroup)
the kernel's OOM killer ends the process that holds the most memory with SIGKILL: no
handler runs, nothing is printed, and a user sees the shell's "Killed" at best.  Here the
work runs in a child (which asks to be the OOM killer's first choice, ``oom_score_adj``);
the parent holds only what ctracer's start-up loaded, waits, and when the child was
killed says in one line that memory ran out and what to try (``on_killed``'s words),
with a non-zero exit (137, as a shell says for SIGKILL).  Either way it removes the
private directories the child made and could not remove itself (a staged output, a
scratch folder).  The child's own result (its exit status) or error (a `CtracerError`,
Ctrl-C) comes back through a pipe and is raised here, so the CLI prints it as it
always did.

``CTRACER_NO_SUPERVISOR=1`` runs the work in the process itself (for debugging), as
does a caller whose stdout or stderr is not a file (an in-memory capture).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from typing import Callable, Optional

from ctracer.errors import CtracerError
from ctracer.files import list_leftovers, remove_leftovers

#: the child's ``oom_score_adj``: chosen before the parent (and before anything else in
#: the same limit that did not ask)
CHILD_OOM_SCORE_ADJ = 500


class OutOfMemory(CtracerError):
    """The work was killed by the kernel (SIGKILL), most likely by the OOM killer."""

    exit_status = 128 + signal.SIGKILL


def run_supervised(work: Callable[[], int], what: str,
                   on_killed: Callable[[str, bool], str]) -> int:
    """``work()`` in a forked child; its exit status.  When the child is killed,
    ``on_killed(why, out_of_memory)`` says what is left (and, when the death was
    SIGKILL, most likely the OOM killer's, what to try), raised as one `OutOfMemory`
    line with the exit status of that signal's death."""
    if os.environ.get("CTRACER_NO_SUPERVISOR") or not hasattr(os, "fork") \
            or not _real_streams():
        return work()
    before = oom_kills()
    _become_subreaper()
    others = set(_own_children())
    sys.stdout.flush()
    sys.stderr.flush()
    leftovers = list_leftovers()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: do the work, say how it ended, never return
        os.close(reader)
        _child(work, writer)
    os.close(writer)
    # a terminal's Ctrl-C reaches the child too (it reports it); SIGTERM to ctracer is
    # passed on, and the child ends as it would have
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda s, f: _pass_on(pid, s))
    try:
        # the child's end first (its message is small: the pipe holds it), then the
        # message; helpers the child forked may hold the pipe open a little longer
        _, status = os.waitpid(pid, 0)
        _end_orphans(others)
        remove_leftovers(leftovers)  # a killed child's staged output and scratch
        os.set_blocking(reader, False)
        with os.fdopen(reader, "rb") as f:
            message = f.read() or b""
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    if message:
        kind, value = pickle.loads(message)
        if kind == "exit":
            return int(value)
        raise value
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        killed_by_oom = oom_kills()
        if number == signal.SIGKILL:
            if before is not None and killed_by_oom is not None and killed_by_oom > before:
                why = f"out of memory: the kernel's OOM killer ended {what}{_limit_text()}"
            else:
                why = (f"{what} was killed (SIGKILL), most likely by the kernel's OOM "
                       f"killer: out of memory{_limit_text()}")
            raise OutOfMemory(on_killed(why, True))
        error = OutOfMemory(on_killed(f"{what} was killed by signal {number}", False))
        error.exit_status = 128 + number
        raise error
    return os.waitstatus_to_exitcode(status)


def _become_subreaper() -> None:
    """Helpers the child forked come to this process if the child dies first
    (``PR_SET_CHILD_SUBREAPER``), so `_end_orphans` can end them: killed with it, they
    would wait for work for ever, holding their memory and ctracer's output pipes."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _own_children() -> list[int]:
    try:
        return [int(c) for t in os.listdir("/proc/self/task")
                for c in open(f"/proc/self/task/{t}/children").read().split()]
    except OSError:
        return []


def _end_orphans(others: set[int]) -> None:
    """Kill and reap the processes left to this one (a dead child's helpers), not
    ``others`` (children it had before)."""
    for pid in set(_own_children()) - others:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _real_streams() -> bool:
    """stdout and stderr are files the child writes too (not a caller's in-memory
    capture, which the child's prints would never reach)."""
    try:
        sys.stdout.fileno()
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _pass_on(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _child(work: Callable[[], int], writer: int) -> None:
    status = 70
    try:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(CHILD_OOM_SCORE_ADJ))
        except OSError:
            pass
        try:
            outcome = ("exit", int(work() or 0))
        except BaseException as e:  # raised again in the parent, printed by the CLI
            if os.environ.get("CTRACER_DEBUG") or "--debug" in sys.argv:
                import traceback

                traceback.print_exc()
            outcome = ("raise", _picklable(e))
        status = 0
        data = pickle.dumps(outcome)
        with os.fdopen(writer, "wb") as f:
            f.write(data)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 70
    finally:
        os._exit(status)


def _picklable(e: BaseException) -> BaseException:
    """``e`` if it survives a round trip through pickle, else a `CtracerError` with its
    line, prefix and exit status."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        if isinstance(e, CtracerError):
            copy = CtracerError(str(e))
            copy.prefix, copy.exit_status = e.prefix, e.exit_status
            return copy
        return RuntimeError(f"{type(e).__name__}: {e}")


def _own_memory_cgroup() -> Optional[str]:
    """The directory of this process's memory cgroup (v1 or v2), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if "memory" in names.split(","):
            return os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
    for line in lines:
        _, names, path = line.split(":", 2)
        if names == "":
            return os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    return None


def oom_kills() -> Optional[int]:
    """How many processes the OOM killer has killed in this process's memory cgroup
    (None where that cannot be read)."""
    where = _own_memory_cgroup()
    if where is None:
        return None
    for name in ("memory.oom_control", "memory.events"):
        try:
            with open(os.path.join(where, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _limit_text() -> str:
    """`` (memory limit N MB)`` when this process's memory cgroup has a limit."""
    where = _own_memory_cgroup()
    if where is None:
        return ""
    for name in ("memory.limit_in_bytes", "memory.max"):
        try:
            with open(os.path.join(where, name)) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < (1 << 60):
            return f" (memory limit {int(value) >> 20} MB)"
    return ""

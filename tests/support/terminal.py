"""What a command started from a terminal has that a test's child may not: SIGINT and
SIGQUIT at their default actions, and a terminal for its output (`run_on_a_terminal`).  A shell without job control starts background
commands with both ignored (``sh -c 'pytest' &``, ``nohup``), the children inherit that,
and Python then installs no Ctrl-C handler: a test sending Ctrl-C passes
``preexec_fn=as_from_a_terminal`` to the child it starts."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
from typing import Optional


def as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def run_on_a_terminal(argv: list[str], env: Optional[dict] = None,
                      timeout: float = 120) -> tuple[int, str]:
    """Run ``argv`` with its stdout and stderr on a pseudo-terminal (what a user's shell
    gives it); (status, output).  A command silent for ``timeout`` seconds is killed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], timeout)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal's other side closed: the command is done
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(), b"".join(chunks).decode("utf-8", "replace")

"""What a command started from a terminal has that a test's child may not: SIGINT and
SIGQUIT at their default actions.  A shell without job control starts background
commands with both ignored (``sh -c 'pytest' &``, ``nohup``), the children inherit that,
and Python then installs no Ctrl-C handler: a test sending Ctrl-C passes
``preexec_fn=as_from_a_terminal`` to the child it starts."""

from __future__ import annotations

import signal


def as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

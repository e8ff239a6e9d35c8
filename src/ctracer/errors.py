"""Errors a user can cause or meet, each printed by the CLI as one line.

Anything raised as a `CtracerError` reaches the user as ``ctracer: error: <message>``
and a non-zero exit status.  The CLI (`ctracer.cli.main`) also keeps everything else to
one line: an `OSError` names its file and reason, any other exception is reported as an
internal error (a bug, exit status 70); ``--debug`` prints the traceback as well.
"""

from __future__ import annotations

from typing import Iterable


class CtracerError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    exit_status = 1
    #: the word before the message: ``ctracer: error: ...``
    prefix = "error"


class UsageError(CtracerError):
    """The command line asks for something that cannot be done (exit status 2)."""

    exit_status = 2


class InputFileError(CtracerError):
    """A file is missing, unreadable or not what it should be (no DWARF, not ELF, ...)."""


class UnknownType(CtracerError):
    """A struct/union name that the debug info does not define."""

    def __init__(self, kind: str, name: str, known: Iterable[str], where: str):
        import difflib  # (only when a name is wrong: a cached query starts without it)

        close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        super().__init__(f"no {kind} {name} in {where}{hint}")
        self.suggestions = close


class CommandNotFound(InputFileError):
    """The command to trace does not exist or cannot be executed: 127, as a shell says."""

    exit_status = 127


class Interrupted(CtracerError):
    """Ctrl-C (or SIGTERM) ended the work before it was done; the message says what is
    left, e.g. an incomplete report.  128 + the signal's number, as a shell says."""

    prefix = "interrupted"

    def __init__(self, message: str, signal_number: int = 2):
        super().__init__(message)
        self.exit_status = 128 + signal_number


class BPFUnavailable(CtracerError):
    """Not root, or the kernel refuses what we need (uprobes, maps, BPF itself)."""


class OutputError(CtracerError):
    """An output (trace file, report, export) that cannot be written where asked."""


class TraceFileError(CtracerError):
    """A trace file that is missing, not a trace file, or of a schema we do not read."""

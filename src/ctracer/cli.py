"""The ``ctracer`` command line: parses arguments and hands each subcommand to its module.

Each module under ``ctracer.commands`` offers ``add_arguments(parser)`` and
``run(args) -> int``; they import their heavy dependencies inside ``run`` so that
``ctracer --help`` and cached queries start fast.  Errors the user can fix arrive here as
`CtracerError` and leave as one line on stderr with a non-zero status.  So does any other
failure: an `OSError` (a file that cannot be read or written, a full disk) names its file
and the system's reason; anything else is a bug, reported in one line with exit status
70 (``EX_SOFTWARE``).  ``--debug`` (anywhere before ``--``) or ``CTRACER_DEBUG=1`` adds
the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

from ctracer import __version__
from ctracer.debuginfo.gcpause import collector_paused
from ctracer.errors import CtracerError

#: subcommand → (module, one-line help)
COMMANDS = {
    "functions": ("ctracer.commands.functions",
                  "list the functions (methods) that take a struct"),
    "struct": ("ctracer.commands.struct",
               "print a struct's layout like pahole, or its mini struct"),
    "plan": ("ctracer.commands.plan",
             "show the probe kind chosen for each method, or why none; --verify loads them"),
    "project": ("ctracer.commands.project",
                "write a project file (methods and fields to record) for trace --project"),
    "trace": ("ctracer.commands.trace",
              "record a struct's fields at entry and exit of its methods and at its "
              "tracepoints"),
    "report": ("ctracer.commands.report",
               "render a trace file as the HTML report: call graphs, changes, plots"),
    "diff": ("ctracer.commands.diff",
             "compare two traces of one struct: what the code does differently"),
    "export": ("ctracer.commands.export",
               "write a trace as JSON Lines, CSV, Perfetto or Parquet"),
    "sql": ("ctracer.commands.sql",
            "run SQL (DuckDB) over trace files and exports"),
    "demo": ("ctracer.commands.demo",
             "trace the kernel's struct sock over a bundled workload and render the "
             "report (a user-space sample where the kernel cannot be traced)"),
}
#: old name → subcommand: a name a released version used, still accepted
ALIASES = {"callgraph": "report"}

EPILOG = """\
examples:
  ctracer functions struct sock                      # live kernel, from its BTF
  ctracer functions struct sock --binary ./prog      # a program's DWARF
  ctracer struct sock --binary ./prog --mini         # the fields a trace records
  ctracer plan struct sock --verify                  # probe kinds here; verifier check
  ctracer trace struct sock --binary ./prog -- ./prog --run
  ctracer project init struct sock --binary ./prog -o sock.toml
  ctracer trace --project sock.toml -- ./prog --run
  ctracer report sock.ctrace                         # → callgraph/sock/index.html
  ctracer diff before.ctrace after.ctrace           # what changed: → diff/index.html
  ctracer export sock.ctrace --format jsonl          # one event per line, for scripts
  ctracer sql "SELECT function, count(*) FROM events GROUP BY 1" sock.ctrace
  ctracer demo                                       # trace, render: the whole pipeline once
"""


DEBUG_HELP = "on an error, print the Python traceback too"

#: the exit status of a failure that is ctracer's fault (sysexits.h EX_SOFTWARE)
EX_SOFTWARE = 70


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus a message; keep it to one line like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand (its module imported, the others
    not even added: start-up time matters for cached queries, and a command line naming
    a subcommand never shows the list of them)."""
    parser = _Parser(prog="ctracer", description="Trace a C struct through the functions that touch it.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ctracer {__version__}")
    parser.add_argument("--debug", action="store_true", default=False, help=DEBUG_HELP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        mod = importlib.import_module(module)
        aliases = [old for old, new in ALIASES.items() if new == name]
        p = sub.add_parser(name, aliases=aliases, help=help_text, description=mod.__doc__,
                           parents=[common],
                           epilog=getattr(mod, "EPILOG", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _subcommand(argv: Sequence[str]) -> Optional[str]:
    """The subcommand named in argv (by its name or an old one), if its first non-option
    word is one."""
    for word in argv:
        if not word.startswith("-"):
            word = ALIASES.get(word, word)
            return word if word in COMMANDS else None
    return None


def describe_os_error(e: OSError) -> str:
    """One line for an operating-system error: the file(s) and the system's reason."""
    reason = e.strerror or str(e) or type(e).__name__
    files = [f for f in (e.filename, e.filename2) if f is not None]
    if files:
        return f"{' -> '.join(os.fsdecode(f) for f in files)}: {reason}"
    return reason


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``ctracer`` command: parse ``argv`` (default the process's), run the subcommand and
    return its exit status; a `CtracerError` is one line on stderr (the traceback too with
    ``--debug`` or CTRACER_DEBUG)."""
    if argv is None:
        argv = sys.argv[1:]
    # start-up makes only objects kept for the process's life (modules, classes, the
    # parser): no collection until it is over, and none of them walked by later ones
    with collector_paused(freeze=True):
        args = build_parser(_subcommand(argv)).parse_args(argv)
    debug = bool(getattr(args, "debug", False) or os.environ.get("CTRACER_DEBUG"))

    def fail(message: str, status: int) -> int:
        if debug:
            import traceback  # (here only: it would slow every start-up)

            traceback.print_exc()
        print(f"ctracer: {message}", file=sys.stderr)
        return status

    try:
        return int(args._run(args) or 0)
    except CtracerError as e:
        return fail(f"{e.prefix}: {e}", e.exit_status)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: silence the final flush of stdout too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        return fail(f"error: {describe_os_error(e)}", 1)
    except MemoryError:
        return fail("error: out of memory", 1)
    except Exception as e:  # a bug: one line, the traceback with --debug
        what = str(e).splitlines()[0] if str(e) else ""
        return fail(f"internal error: {type(e).__name__}{': ' + what if what else ''} "
                    "(a bug in ctracer; --debug shows where)", EX_SOFTWARE)

"""The ``ctracer`` command line: parses arguments and hands each subcommand to its module.

Each module under ``ctracer.commands`` offers ``add_arguments(parser)`` and
``run(args) -> int``; they import their heavy dependencies inside ``run`` so that
``ctracer --help`` and cached queries start fast.  Errors the user can fix arrive here as
`CtracerError` and leave as one line on stderr with a non-zero status.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

from ctracer import __version__
from ctracer.errors import CtracerError

#: subcommand → (module, one-line help)
COMMANDS = {
    "functions": ("ctracer.commands.functions",
                  "list the functions (methods) that take a struct"),
    "struct": ("ctracer.commands.struct",
               "print a struct's layout like pahole, or its mini struct"),
    "plan": ("ctracer.commands.plan",
             "show the probe kind chosen for each method, or why none; --verify loads them"),
    "trace": ("ctracer.commands.trace",
              "record a struct's fields at entry and exit of its methods"),
    "callgraph": ("ctracer.commands.callgraph",
                  "render a trace file as HTML call graphs, changes and plots"),
    "demo": ("ctracer.commands.demo",
             "build the bundled sample, trace it and render the report"),
}

EPILOG = """\
examples:
  ctracer functions struct sock                      # live kernel, from its BTF
  ctracer functions struct sock --binary ./prog      # a program's DWARF
  ctracer struct sock --binary ./prog --mini         # the fields a trace records
  ctracer plan struct sock --verify                  # probe kinds here; verifier check
  ctracer trace struct sock --binary ./prog -- ./prog --run
  ctracer callgraph sock.ctrace                      # → callgraph/sock/index.html
  ctracer demo                                       # all of the above on the sample
"""


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus a message; keep it to one line like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's module is imported (start-up
    time matters for cached queries), the others keep their one-line help."""
    parser = _Parser(prog="ctracer", description="Trace a C struct through the functions that touch it.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ctracer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=mod.__doc__,
                           epilog=getattr(mod, "EPILOG", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _subcommand(argv: Sequence[str]) -> Optional[str]:
    """The subcommand named in argv, if its first non-option word is one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(_subcommand(argv)).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except CtracerError as e:
        print(f"ctracer: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("ctracer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: silence the final flush of stdout too
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0

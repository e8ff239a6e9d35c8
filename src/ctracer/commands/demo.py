"""Build the bundled sample, trace it and render the report: the whole pipeline once.

Builds samples/ (make), records `struct sock` in the sample program sockdemo while it
runs socket lifecycles (ctracer trace), renders the trace (ctracer callgraph) and says
which page to open.  The trace goes to sock.ctrace and the report to callgraph/sock/,
both under the current directory.  Needs root (for the tracing step).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Optional

EPILOG = """\
examples:
  sudo ctracer demo                     # from a source checkout
  sudo ctracer demo --loops 30 --threads 4
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loops", type=int, default=9, metavar="N",
                        help="socket lifecycles per thread in the sample (default 9)")
    parser.add_argument("--threads", type=int, default=2, metavar="N",
                        help="threads in the sample (default 2)")
    parser.add_argument("--samples", metavar="DIR",
                        help="the samples directory (default: the one of this checkout)")


def find_samples(start: Optional[str] = None) -> Optional[str]:
    """The samples/ directory of the source tree this ctracer runs from, or of the
    current directory."""
    here = os.path.dirname(os.path.abspath(start or __file__))
    candidates = []
    while True:
        candidates.append(os.path.join(here, "samples"))
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    candidates.append(os.path.join(os.getcwd(), "samples"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "sock", "Makefile")):
            return c
    return None


def build_samples(samples: str) -> None:
    from ctracer.errors import CtracerError
    cc = os.environ.get("CC", "cc")
    missing = [tool for tool in ("make", cc) if shutil.which(tool) is None]
    if missing:
        raise CtracerError(f"building the samples needs {' and '.join(missing)}: "
                           "apt-get install make gcc (or run scripts/setup.sh)")
    r = subprocess.run(["make", "-s", "-C", samples], capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "error" in ln), lines[-1] if lines else "")
        raise CtracerError(f"building the samples failed: {why.strip()}")


def run(args: argparse.Namespace) -> int:
    from ctracer.commands import trace as trace_command
    from ctracer.errors import CtracerError, UsageError

    if args.loops < 1 or not 1 <= args.threads <= 64:
        raise UsageError("--loops needs a positive number and --threads 1 to 64")
    samples = args.samples or find_samples()
    if samples is None or not os.path.isfile(os.path.join(samples, "sock", "Makefile")):
        raise CtracerError("the bundled samples are not here: run ctracer demo from a "
                           "source checkout (or give --samples DIR)")
    print(f"ctracer demo: building {samples}", file=sys.stderr)
    build_samples(samples)
    program = os.path.join(samples, "sock", "build", "sockdemo")

    parser = argparse.ArgumentParser(prog="ctracer trace")
    trace_command.add_arguments(parser)
    trace_args = parser.parse_args(["struct", "sock", "--binary", program, "-o", "sock.ctrace",
                                    "--", program, "--loops", str(args.loops),
                                    "--threads", str(args.threads)])
    print(f"ctracer demo: ctracer trace struct sock --binary {program} -- "
          f"{' '.join(trace_args.command)}", file=sys.stderr)
    kind, name = trace_command.target_from_args(trace_args)
    result = trace_command.trace(trace_args, kind, name)
    trace_command.print_summary(result)

    try:
        from ctracer.report import render_report
    except ImportError:
        print("ctracer demo: the report renderer is not available in this build; "
              f"the trace is in {result.path}", file=sys.stderr)
        return 1
    print(f"ctracer demo: ctracer callgraph {result.path}", file=sys.stderr)
    rendered = render_report(result.path)
    print(f"ctracer demo: {rendered.events} events, {rendered.objects_total} objects rendered",
          file=sys.stderr)
    print(f"open file://{os.path.abspath(rendered.index)}")
    return 0

"""Build the bundled samples, trace struct sock and render the report: the whole pipeline once.

Builds samples/ (make), then records the running kernel's `struct sock` while the
bundled loopback TCP workload (samples/tcp: several connections, orderly closes from
each side, an abort) runs — `ctracer trace struct sock -- tcploop` —, renders the
trace (ctracer report) and says which page to open.  Where the kernel cannot be
traced (no BTF, BPF refused, no raw tracepoints...) it says why in one line and traces
the user-space sample sockdemo instead, as `ctracer trace struct sock --binary
sockdemo -- sockdemo` would.  The trace goes to sock.ctrace and the report to
callgraph/sock/, both under the current directory.  Needs root (for the tracing step).
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
  sudo ctracer demo --connections 30
  sudo ctracer demo --user-space --loops 30 --threads 4
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer demo``."""
    parser.add_argument("--connections", type=int, default=6, metavar="N",
                        help="TCP connections the kernel workload makes (default 6)")
    parser.add_argument("--user-space", action="store_true",
                        help="trace the user-space sample even where the kernel can be traced")
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
    """Build the bundled samples with make (one line naming what is missing, or make's
    first error, when it cannot)."""
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


def _record(built, command: list[str], output: str):
    from ctracer.record import recorder
    progress = recorder.Progress(sys.stderr)
    return recorder.record(built.program, built.binary, output, meta=built.meta,
                           command=command, progress=progress)


def _trace_kernel(samples: str, connections: int, output: str):
    from ctracer.record import request as trace_request
    from ctracer.debuginfo.catalog import ShapeKind
    workload = os.path.join(samples, "tcp", "build", "tcploop")
    command = [workload, "--connections", str(connections)]
    print(f"ctracer demo: ctracer trace struct sock -- {' '.join(command)}", file=sys.stderr)
    request = trace_request.TraceRequest(ShapeKind.STRUCT, "sock", follow_processes=True,
                                    argv=("ctracer", "trace", "struct", "sock", "--",
                                          *command))
    return _record(trace_request.build(request), command, output)


def _trace_sample(samples: str, loops: int, threads: int, output: str):
    from ctracer.record import request as trace_request
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.debuginfo.sources import TypeSource
    program = os.path.join(samples, "sock", "build", "sockdemo")
    command = [program, "--loops", str(loops), "--threads", str(threads)]
    print(f"ctracer demo: ctracer trace struct sock --binary {program} -- "
          f"{' '.join(command)}", file=sys.stderr)
    request = trace_request.TraceRequest(ShapeKind.STRUCT, "sock", TypeSource(binary=program),
                                    follow_processes=True,
                                    argv=("ctracer", "trace", "struct", "sock", "--binary",
                                          program, "--", *command))
    return _record(trace_request.build(request), command, output)


def run(args: argparse.Namespace) -> int:
    """``ctracer demo``: trace the kernel's struct sock while the TCP sample runs (the
    user-space sample where the kernel cannot be traced) and render the report."""
    from ctracer.errors import CtracerError, UsageError
    from ctracer.record.recorder import summary_lines

    if args.loops < 1 or not 1 <= args.threads <= 64 or not 1 <= args.connections <= 100000:
        raise UsageError("--loops needs a positive number, --threads 1 to 64 and "
                         "--connections 1 to 100000")
    samples = args.samples or find_samples()
    if samples is None or not os.path.isfile(os.path.join(samples, "sock", "Makefile")):
        raise CtracerError("the bundled samples are not here: run ctracer demo from a "
                           "source checkout (or give --samples DIR)")
    print(f"ctracer demo: building {samples}", file=sys.stderr)
    build_samples(samples)

    result = None
    if not args.user_space:
        try:
            result = _trace_kernel(samples, args.connections, "sock.ctrace")
        except CtracerError as e:
            print(f"ctracer demo: the running kernel cannot be traced here ({e}); "
                  "tracing the user-space sample instead", file=sys.stderr)
    if result is None:
        result = _trace_sample(samples, args.loops, args.threads, "sock.ctrace")
    for line in summary_lines(result):
        print(f"ctracer: {line}", file=sys.stderr)

    try:
        from ctracer.report import render_report
    except ImportError:
        print("ctracer demo: the report renderer is not available in this build; "
              f"the trace is in {result.path}", file=sys.stderr)
        return 1
    print(f"ctracer demo: ctracer report {result.path}", file=sys.stderr)
    rendered = render_report(result.path)
    print(f"ctracer demo: {rendered.counts}; {rendered.objects_total} objects rendered",
          file=sys.stderr)
    print(f"open file://{os.path.abspath(rendered.index)}")
    return 0

"""scripts/vm-run's command line: run a command as root in a QEMU guest booting one of
Debian's own kernels, with this machine's file system as the guest's root (virtme-ng:
9p, read-only, throw-away overlays on /etc, /var, /tmp ...), so the guest runs the
same checkout, venv, bcc and bpftrace.  What it does is told in scripts/vm-run."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile

from ctracer.guest.boot import DEFAULT_TIMEOUT_S, _vng, start
from ctracer.guest.common import Refused, cache_root
from ctracer.guest.kernels import SERIES, kernel_image


def main(args: list[str]) -> int:
    """``scripts/vm-run``: parse its options and run the command in a guest booting the
    kernel asked (or only fetch the kernels)."""
    p = argparse.ArgumentParser(
        prog="vm-run", description="Run COMMAND as root in a QEMU guest booting Debian's "
        "own kernel, with this machine's file system as its root.",
        epilog="examples:\n  scripts/vm-run --kernel 6.12 -- .venv/bin/ctracer plan struct sock\n"
               "  scripts/vm-run --kernel 6.1 --out /tmp/out -- sh -c 'ctracer trace struct "
               "sock -o /tmp/t.ctrace -- ./samples/tcp/build/tcploop && cp /tmp/t.ctrace /tmp/out/'\n"
               "  scripts/vm-run --fetch-only 6.1 6.12 7.2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default="6.12", help="6.1, 6.12 (Debian 12's lines), 7.2 (Debian "
                   "unstable's) or the path of a kernel image (modules beside it); default 6.12")
    p.add_argument("--out", help="a directory the guest can write (created); default a "
                   "fresh one under the cache")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds before a guest is taken as hung (default {DEFAULT_TIMEOUT_S})")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--memory", default="4G")
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto")
    p.add_argument("--refresh", action="store_true", help="fetch the newest kernel of the "
                   "series even when one is cached")
    p.add_argument("--fetch-only", nargs="*", metavar="SERIES",
                   help="fetch these kernels (default: every series) and exit")
    p.add_argument("--print-kernel", action="store_true",
                   help="print the kernel image that would boot and exit")
    p.add_argument("command", nargs=argparse.REMAINDER)
    o = p.parse_args(args)
    command = o.command[1:] if o.command[:1] == ["--"] else o.command
    if o.fetch_only is not None:
        for series in o.fetch_only or list(SERIES):
            if series not in SERIES:
                raise Refused(f"unknown kernel {series!r} (known: {', '.join(SERIES)})")
            image, _ = kernel_image(series, o.refresh)
            print(image)
        return 0
    if o.timeout <= 0:
        raise Refused("--timeout must be a positive number of seconds")
    if o.print_kernel:
        print(kernel_image(o.kernel, o.refresh)[0])
        return 0
    # what can be told without the network first: the kernel's name, the command, root,
    # QEMU; only then a kernel is fetched (a download of ~100 MB, for nothing otherwise)
    if o.kernel not in SERIES and os.sep not in o.kernel and not os.path.exists(o.kernel):
        kernel_image(o.kernel, o.refresh)  # refuses it in one line
    if not command:
        raise Refused("no command: vm-run [options] -- COMMAND...")
    if os.geteuid() != 0:
        raise Refused("vm-run runs the guest's command as root and needs root here too")
    vng = _vng()
    image, series = kernel_image(o.kernel, o.refresh)
    if o.out:
        out = os.path.abspath(o.out)
        os.makedirs(out, exist_ok=True)
    else:
        os.makedirs(os.path.join(cache_root(), "runs"), exist_ok=True)
        out = tempfile.mkdtemp(prefix="run-", dir=os.path.join(cache_root(), "runs"))
    signal.signal(signal.SIGTERM, _interrupted)
    return start(command, image, series, out, o.accel, o.cpus, o.memory, o.timeout, vng,
                 say=lambda line: (sys.stderr.write(f"vm-run: {line}\n"), sys.stderr.flush()))


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt  # the guest is stopped on the way out


def entry(argv: list[str]) -> int:
    """main() with a refusal said in one line (the exit status it carries)."""
    try:
        return main(argv)
    except Refused as e:
        sys.stderr.write(f"vm-run: {e}\n")
        return e.status

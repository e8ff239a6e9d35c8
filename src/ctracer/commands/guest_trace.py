"""`ctracer trace --kernel 6.1|6.12|7.2|PATH`: the same recording, made in a throwaway
QEMU guest booting that kernel (`ctracer.guest`), landed on the host as if recorded
here.

The guest sees this machine's files (the same checkout, venv, bcc and workload) and
runs ``ctracer trace`` itself with the options given, ``--repeat N`` times in one boot.
Each run writes its SQLite trace on the guest's tmpfs (/var/tmp: SQLite on the guest's
9p root fails with "database is locked") and copies it to a directory the host shares
with the guest; the host moves it to ``-o`` (``NAME-1.ctrace`` ... with --repeat) and
writes into its meta that it was recorded in a guest, which kernel, which image, KVM or
TCG (the recorder itself wrote the guest's ``kernel_release``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
from typing import Optional

#: set in the guest's ctracer: record there, do not boot another guest
IN_GUEST_ENV = "CTRACER_GUEST_RECORDING"
#: the guest's own writable place for the SQLite file (tmpfs)
GUEST_SCRATCH = "/var/tmp/ctracer-guest"
#: seconds before a guest is taken as hung (a run of every method of struct sock takes
#: several minutes under TCG)
DEFAULT_TIMEOUT_S = 3600


def wanted(args: argparse.Namespace) -> bool:
    """Whether this trace is to be recorded in a guest (not when already in one)."""
    return bool(getattr(args, "kernel", None)) and not os.environ.get(IN_GUEST_ENV)


def outputs(output: str, repeat: int) -> list[str]:
    """Where each run's trace lands: ``output`` itself, or ``STEM-1.ctrace`` ... for
    several runs."""
    if repeat == 1:
        return [output]
    stem, ext = os.path.splitext(output)
    return [f"{stem}-{i}{ext or '.ctrace'}" for i in range(1, repeat + 1)]


def guest_argv(argv: list[str], scratch_file: str) -> list[str]:
    """The ``ctracer trace`` words the guest runs: the user's own, with the trace file
    put on the guest's tmpfs (argparse keeps the last -o)."""
    words = list(argv)
    command: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, command = words[:at], words[at:]
    return [sys.executable, "-m", "ctracer", "trace", *words, "-o", scratch_file, *command]


def guest_script(trace_words: list[str], repeat: int, shared: str) -> str:
    """The shell text run in the guest: each run recorded on tmpfs, copied to the shared
    directory with its exit status; the first run that fails ends the loop."""
    lines = [f"mkdir -p {GUEST_SCRATCH} || exit 125"]
    for i in range(1, repeat + 1):
        scratch = f"{GUEST_SCRATCH}/run-{i}.ctrace"
        argv = guest_argv(trace_words, scratch)
        lines += [
            f"echo 'ctracer: run {i} of {repeat} in the guest' >&2",
            f"{IN_GUEST_ENV}=1 {shlex.join(argv)}",
            "s=$?",
            f"for f in {scratch} {scratch}-wal; do [ -f \"$f\" ] && "
            f"cp \"$f\" {shlex.quote(shared)}/; done",
            f"echo $s > {shlex.quote(shared)}/run-{i}.status",
            "[ $s -eq 0 ] || exit $s",
        ]
    return "\n".join(lines) + "\nexit 0\n"


def check(args: argparse.Namespace) -> None:
    """Refuse, before anything boots, what cannot work in a guest."""
    from ctracer.errors import UsageError
    if args.pid is not None:
        raise UsageError("--kernel records in a fresh guest: -p PID names a process of "
                         "this machine; give the command to run after --")
    if args.print_bpf:
        raise UsageError("--print-bpf prints this kernel's program; drop --kernel")
    if not args.command and not args.duration:
        raise UsageError("--kernel needs a command to run in the guest (-- COMMAND) or "
                         "-d SECONDS")
    if args.repeat < 1:
        raise UsageError("--repeat needs a positive number of runs")


def record_in_guest(args: argparse.Namespace, name: str, argv: list[str],
                    check_output) -> int:
    """Boot the kernel, record there ``args.repeat`` times, land the traces; the exit
    status (the command's when it failed in the guest).  ``check_output(path)`` refuses
    a trace file that cannot be written, before anything boots."""
    from ctracer.errors import UsageError
    from ctracer.guest import boot, kernels
    from ctracer.guest.common import Refused, cache_root
    from ctracer.record.recorder import check_command

    check(args)
    image_path = kernels.resolve_without_fetching(args.kernel)
    if args.command:
        check_command(args.command)   # same files in the guest: a typo costs no boot
    targets = outputs(args.output or f"{name}.ctrace", args.repeat)
    for target in targets:
        check_output(target)
    if os.geteuid() != 0:
        raise UsageError("--kernel boots a guest and needs root")
    vng = boot._vng()

    def say(line: str) -> None:
        print(f"ctracer: {line}", file=sys.stderr, flush=True)

    image, series = kernels.kernel_image(args.kernel, False, say=say) if image_path is None \
        else (image_path, "custom")
    runs = os.path.join(cache_root(), "runs")
    os.makedirs(runs, exist_ok=True)
    shared = tempfile.mkdtemp(prefix="trace-", dir=runs)
    script = os.path.join(shared, "record.sh")
    with open(script, "w") as f:
        f.write(guest_script(argv, args.repeat, shared))
    terminated: list[int] = []

    def on_sigterm(signum, frame) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt   # boot.run stops the guest on the way out

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    accel: list[str] = []
    try:
        status = boot.start(["sh", script], image, series, shared, "auto", 2, "4G",
                            args.guest_timeout, vng, say=_remember_accel(say, accel))
    except Refused as e:
        # the runs that finished before the guest was stopped (or died) are kept
        kept = _land(shared, targets, series, image, accel[0] if accel else "", say)
        if kept:
            e.args = (f"{e.args[0]}; the {len(kept)} run{'s' if len(kept) != 1 else ''} "
                      "finished before that landed",)
        if terminated and e.status == 130:   # said as a shell says SIGTERM
            raise Refused(f"terminated; {e.args[0].split('; ', 1)[1]}", 143) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    landed = _land(shared, targets, series, image, accel[0] if accel else "", say)
    if status:
        ran = sum(os.path.exists(os.path.join(shared, f"run-{i}.status"))
                  for i in range(1, args.repeat + 1))
        say(f"error: the recording in the guest exited {status} (run {max(ran, 1)} of "
            f"{args.repeat}); {len(landed)} trace{'s' if len(landed) != 1 else ''} landed"
            f"{'' if landed else ' (console: ' + os.path.join(shared, '.vm-run', 'console.log') + ')'}")
        if landed:
            shutil.rmtree(shared, ignore_errors=True)
        return status
    shutil.rmtree(shared, ignore_errors=True)
    return 0


def _remember_accel(say, into: list):
    def told(line: str) -> None:
        if " under " in line and not into:
            into.append(line.split(" under ", 1)[1].split(" ", 1)[0].lower())
        say(line)
    return told


def _land(shared: str, targets: list[str], series: str, image: str, accel: str,
          say) -> list[str]:
    """Move each run's trace from the shared directory to its target, its meta saying
    where it was recorded."""
    from ctracer.tracefile import add_meta, read_meta
    landed = []
    for i, target in enumerate(targets, 1):
        got = os.path.join(shared, f"run-{i}.ctrace")
        if not os.path.exists(got) or not os.path.exists(os.path.join(shared, f"run-{i}.status")):
            continue   # not recorded, or its copy had not finished
        for suffix in ("-wal",):
            if os.path.exists(got + suffix):
                shutil.move(got + suffix, target + suffix)
        shutil.move(got, target)
        release = read_meta(target).get("kernel_release", "")
        add_meta(target, recorded_in="guest",
                 guest={"kernel_release": release, "kernel": series,
                        "image": image, "accel": accel, "run": i, "runs": len(targets)})
        say(f"trace of run {i} landed in {target} (recorded in a guest, Linux {release})")
        landed.append(target)
    return landed

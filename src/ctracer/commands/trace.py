"""Record a struct's fields at entry and exit of every function that takes it.

ctracer reads the program's DWARF, finds the struct's methods (see `ctracer functions`),
builds the mini struct (see `ctracer struct --mini`) and attaches an eBPF uprobe and
uretprobe to each method.  Every hit records the time, CPU, process, thread, function,
entry or exit, the object's address, its call depth, the return value on exit and the
mini snapshot of the object.  The recording ends when COMMAND exits, when process PID
goes away, after -d SECONDS or at Ctrl-C; the events already emitted are always drained
into the trace file, and events the buffer had to drop are counted and shown.

Without COMMAND or -p, every process that runs the binary is recorded until -d or
Ctrl-C.  With -p or COMMAND, only that process and the children it forks are.
Needs root.  Render the trace with `ctracer callgraph FILE`.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import signal
import sys
import tempfile
from typing import Optional, Sequence

from ctracer.debuginfo import sources

EPILOG = """\
examples:
  ctracer trace struct sock --binary ./sockdemo -- ./sockdemo --loops 10
  ctracer trace sock --binary ./sockdemo -p 4242 -d 5 -o five-seconds.ctrace
  ctracer trace sock --binary ./sockdemo --functions 'tcp_*' --fields 'sk_stats' -- ./sockdemo
  ctracer trace sock --binary ./sockdemo --print-bpf     # the generated BPF C, no root needed
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sources.add_struct_name_argument(parser)
    sources.add_type_source_arguments(parser)
    run = parser.add_argument_group("what to record")
    run.add_argument("-p", "--pid", type=int, metavar="PID",
                     help="record this running process (and children it forks)")
    run.add_argument("-d", "--duration", type=_seconds, metavar="SECONDS",
                     help="stop after this many seconds")
    run.add_argument("--functions", nargs="+", action="extend", default=[], metavar="GLOB",
                     help="only the methods whose name matches one of these globs")
    run.add_argument("--fields", nargs="+", action="extend", default=[], metavar="GLOB",
                     help="only these fields of the struct (a glob naming a nested struct "
                          "takes all of its fields)")
    run.add_argument("--pointers", action="store_true",
                     help="also record pointer members (as addresses)")
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", metavar="FILE",
                     help="trace file to write (default: NAME.ctrace in the current directory)")
    out.add_argument("--print-bpf", action="store_true",
                     help="print the generated BPF C program and exit (needs no root)")
    out.add_argument("--buffer-mb", type=int, default=16, metavar="MB",
                     help="ring buffer size, a power of two (default 16)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    parser.usage = ("%(prog)s [struct|union] NAME --binary PATH [-p PID | -d SECONDS] "
                    "[-o FILE] [options] [-- COMMAND [ARGS...]]")
    _take_command_after_double_dash(parser)


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse turns the ValueError into one line)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


_seconds.__name__ = "number of seconds"  # argparse's message: "invalid number of seconds value"


def check_output(path: str) -> None:
    """Fail now, not after the compile, when the trace file cannot be written: ``path``
    is a directory, its directory is missing, or creating a file there is refused (a
    read-only file system, permissions, a full inode table)."""
    from ctracer.errors import InputFileError
    if os.path.isdir(path):
        raise InputFileError(f"-o {path} is a directory: give the trace file's name "
                             f"(e.g. {os.path.join(path, 'trace.ctrace')})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputFileError(f"cannot write the trace file {path}: no directory {folder}")
    try:  # the one reliable test is to try (access() ignores ACLs, quotas, ...)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".ctracer-check-")
    except OSError as e:
        raise InputFileError(f"cannot write the trace file {path}: "
                             f"{e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


def exit_status(result) -> int:
    """ctracer's exit status after a recording: the command's own when the recording
    ended because it exited (128 + N when signal N killed it, as a shell and strace
    report it), else 0."""
    status = result.command_status
    if result.stopped_by != "command exited" or not status:
        return 0
    return 128 - status if status < 0 else status


def describe_status(status: int) -> str:
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}"
    return f"exit status {status}"


def _take_command_after_double_dash(parser: argparse.ArgumentParser) -> None:
    """Everything after the first ``--`` is the command to run, untouched.  argparse
    cannot give that to a positional argument on its own (a ``+`` positional before it
    swallows it), so this parser sets it aside before parsing the rest."""
    parse = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        words = list(sys.argv[1:] if args is None else args)
        command: list[str] = []
        if "--" in words:
            at = words.index("--")
            words, command = words[:at], words[at + 1:]
        namespace, extras = parse(words, namespace)
        if extras and not command:
            parser.error(f"unrecognized arguments: {' '.join(extras)} "
                         "(put the command to run after --)")
        namespace.command = command
        return namespace, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def select_methods(methods: Sequence, patterns: Sequence[str]) -> list:
    """The methods whose function name (or name@unit) matches a glob; all when none."""
    if not patterns:
        return list(methods)
    from ctracer.errors import UsageError
    names = sorted({m.name for m in methods} | {m.key for m in methods})
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(n, pat) for n in names):
            import difflib
            close = difflib.get_close_matches(pat, names, n=5, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"--functions {pat!r} matches no method{hint}")
    return [m for m in methods
            if any(fnmatch.fnmatchcase(m.name, p) or fnmatch.fnmatchcase(m.key, p)
                   for p in patterns)]


def build(args: argparse.Namespace, kind, name: str):
    """(probe program, trace meta) for the options: types, methods, mini struct,
    probes."""
    from ctracer.plan import discovery
    from ctracer.plan import mini
    from ctracer.probes import program as probes
    from ctracer.record import recorder as record
    from ctracer.errors import CtracerError, UsageError

    model = sources.open_type_source(args)
    graph = model.find_struct(name, kind)
    found = discovery.discover(model.catalog(), name, kind)
    methods = select_methods([m for m in found.methods if not m.is_tracepoint],
                             args.functions)
    if not methods:
        raise CtracerError(f"no function in {args.binary} takes {kind.value} {name} "
                           "(directly, through an alias or a holder): nothing to probe")
    built = mini.build_mini(graph, include=args.fields, pointers=args.pointers)
    if not built.layout.fields:
        raise CtracerError(f"{kind.value} {name} has no member a snapshot can record")
    ring = args.buffer_mb << 20
    if args.buffer_mb < 1 or ring & (ring - 1):
        raise UsageError("--buffer-mb must be a power of two (1, 2, 4, ... MB)")
    program = probes.build_program(methods, built.layout,
                                   filtered=bool(args.pid or args.command), ring_bytes=ring)
    try:
        from ctracer.plan import pahole as layout
        full = layout.render(graph, source_format=model.format)
    except Exception as e:  # the layout printer is a nicety here; never lose a trace to it
        full = f"/* layout unavailable: {e} */\n"
    meta = record.trace_meta(
        struct_kind=kind.value, struct_name=name, mini_json=built.layout.to_json(),
        mini_text=mini.render_mini(built.layout, skipped=built.skipped,
                                   struct_size=built.struct_size),
        full_layout=full, binary=args.binary, argv=sys.argv, fields=args.fields,
        functions=args.functions, bpf_text=program.text)
    return program, meta


def _check_process_maps(pid: int, binary: str) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    if os.path.realpath(binary) not in maps:
        return f"process {pid} has not mapped {binary} (yet): probes fire only once it does"
    return None


def trace(args: argparse.Namespace, kind, name: str, *, out=None):
    """Record as the options say; returns the `ctracer.record.recorder.RecordResult`."""
    from ctracer.record import recorder as record
    from ctracer.errors import UsageError

    out = out or sys.stderr
    _check_source(args)
    if args.pid is not None and args.command:
        raise UsageError("give either -p PID or a COMMAND, not both")
    if args.pid is not None and args.pid <= 0:
        raise UsageError("-p needs a process id")
    output = args.output or f"{name}.ctrace"
    check_output(output)
    program, meta = build(args, kind, name)
    if args.pid is not None:
        warning = _check_process_maps(args.pid, args.binary)
        if warning:
            print(f"ctracer: warning: {warning}", file=out)
    progress = record.Progress(out, enabled=not args.quiet)

    def announce() -> None:
        if args.quiet:
            return
        who = (f"process {args.pid}" if args.pid else
               "the command" if args.command else f"every process running {args.binary}")
        until = " until it exits" if (args.pid or args.command) else ""
        if args.duration:
            until += f"{' or' if until else ''} for {args.duration:g} s"
        print(f"ctracer: recording {kind.value} {name} in {who}{until}; Ctrl-C to stop",
              file=out, flush=True)

    return record.record(program, args.binary, output, meta=meta,
                         command=args.command or None, pid=args.pid,
                         duration=args.duration, progress=progress, on_attached=announce)


def print_summary(result, out=None) -> None:
    out = out or sys.stderr
    how = {"command exited": "the command exited", "process exited": "the process exited",
           "duration": "the duration ended", "ctrl-c": "Ctrl-C",
           "terminated": "SIGTERM"}.get(result.stopped_by, result.stopped_by)
    status = ""
    if result.command_status:
        status = f", {describe_status(result.command_status)}"
    took = f"{result.seconds:.1f} s" if result.seconds >= 1 else f"{result.seconds * 1000:.0f} ms"
    print(f"ctracer: {result.events} events, {result.objects} object addresses, "
          f"{result.lost} lost in {took} (stopped: {how}{status})", file=out)
    skipped = f", {result.skipped} not probeable" if result.skipped else ""
    print(f"ctracer: probes on {result.attached} functions, {result.failed} failed{skipped} "
          f"(bcc compile {result.compile_seconds:.1f} s, attach {result.attach_seconds:.1f} s)",
          file=out)
    for failure in result.failures[:5]:
        print(f"ctracer:   {failure}", file=out)
    if len(result.failures) > 5:
        print(f"ctracer:   ... and {len(result.failures) - 5} more (see the trace's "
              "functions table)", file=out)
    if result.lost:
        print(f"ctracer: warning: {result.lost} events were lost (ring buffer full); "
              "a larger --buffer-mb or fewer --functions helps", file=out)
    if result.kept_old:
        print(f"ctracer: the file that was at {result.path} is kept as {result.kept_old}",
              file=out)
    print(f"ctracer: wrote {result.path}; next: ctracer callgraph {result.path}", file=out)


def _check_source(args: argparse.Namespace) -> None:
    from ctracer.errors import UsageError
    if args.btf or args.module or not args.binary:
        raise UsageError("ctracer trace needs --binary PATH (tracing the kernel itself is "
                         "not supported yet)")


def run(args: argparse.Namespace) -> int:
    kind, name = target_from_args(args)
    _check_source(args)
    if args.print_bpf:
        program, _ = build(args, kind, name)
        print(program.text, end="")
        return 0
    result = trace(args, kind, name)
    print_summary(result)
    return exit_status(result)


def target_from_args(args: argparse.Namespace):
    from ctracer.errors import UsageError
    words = args.target
    if len(words) > 2 or (len(words) == 2 and words[0] not in ("struct", "union")):
        raise UsageError(f"expected '[struct|union] NAME', got {' '.join(words)!r} "
                         "(put the command to run after --)")
    return sources.struct_name_from_args(args)

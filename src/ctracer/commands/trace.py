"""Record a struct's fields wherever the code touches it: a program's functions or the kernel.

ctracer reads the debug info (a program's DWARF with --binary; the running kernel's
BTF by default, or --module NAME, --btf FILE), finds the struct's methods (see `ctracer
functions`), builds the mini struct (see `ctracer struct --mini`) and records every hit.

* A program (--binary): an eBPF uprobe and uretprobe on each method.  Every hit records
  the time, CPU, process, thread, function, entry or exit, the object's address, its
  call depth, the return value on exit and the mini snapshot of the object.
* The kernel: every function taking the struct, on entry and exit, wherever the kernel
  allows it (`ctracer plan` shows what it allows): one session program on tracing_multi
  links (fsession.multi) where the kernel has them and runs session programs, else
  fentry/fexit on tracing_multi links (fentry.multi), else fentry/fexit, or kprobes and
  kretprobes (kprobe.multi links where the kernel has them, else one perf kprobe a
  function; without tracing_multi, kprobes over fentry above 256 functions: kprobe.multi
  links attach and detach them all at once, and perf kprobes, without kprobe.multi,
  still faster than a program per function); plus the raw tracepoints whose arguments carry
  the struct (on a kernel that attaches neither fentry nor kprobes, the only way in).
  A function's hit records a snapshot of the object at entry and at exit, read at the
  offsets of the kernel's BTF, and its return value; a tracepoint's hit one snapshot
  and the tracepoint's arguments by name (inet_sock_set_state: oldstate, newstate).
  With -p PID or -- COMMAND a kernel object first seen in that process tree's own
  work (its system calls, and softirqs it raised itself, such as a loopback send's
  receive; not an interrupt or a timer that came in while it ran) is followed for the
  rest of its life in every context (softirq, timers, kernel threads); without them
  every object system-wide.
  --comm, --object, --where and --max-followed choose objects, in the kernel.

The recording ends when COMMAND exits, when process PID goes away, after -d SECONDS or
at Ctrl-C; the events already emitted are always drained into the trace file, and
events the buffer had to drop are counted and shown.  Needs root.  Render the trace
with `ctracer report FILE`.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
from typing import Optional, Sequence

from ctracer.commands import options

EPILOG = """\
examples:
  ctracer trace struct sock -- ./samples/tcp/build/tcploop     # the kernel's sockets of a command
  ctracer trace struct sock -d 10 --where 'skc_num == 8080'    # system-wide, one port
  ctracer trace sk_buff --functions 'kfree_skb' 'consume_skb' -d 5 --tail
  ctracer trace struct sock --lifetime-rule ends:tcp_destroy_sock -- ./tcploop   # only this rule
  ctracer trace struct sock --binary ./sockdemo -- ./sockdemo --loops 10
  ctracer trace sock --binary ./sockdemo -p 4242 -d 5 -o five-seconds.ctrace
  ctracer trace sock --binary ./sockdemo --functions 'tcp_*' --fields 'sk_stats' -- ./sockdemo
  ctracer trace sock --binary ./sockdemo --cachelines 1 --max-bytes 32 -- ./sockdemo
  ctracer trace --project sock.toml -- ./sockdemo   # a file from ctracer project init
  ctracer trace sock --print-bpf                               # the generated BPF C, no root needed
  ctracer trace struct sock --kernel 7.2 --repeat 3 -o sock72.ctrace -- ./samples/tcp/build/tcploop
"""


def _address(text: str) -> int:
    try:
        value = int(text, 16 if text.lower().startswith("0x") or not text.isdigit() else 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an address") from None
    if not 0 < value < 1 << 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not an address")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer trace``."""
    parser.add_argument("target", nargs="*", metavar="[struct|union] NAME",
                        help="the struct (or union) to trace, e.g. 'struct sock' or 'sock' "
                             "(from the project file with --project)")
    options.add_type_source_arguments(parser)
    run = parser.add_argument_group("what to record")
    run.add_argument("--project", metavar="FILE",
                     help="a project file (ctracer project init) saying the struct, where "
                          "its types come from, the functions and the fields")
    run.add_argument("-p", "--pid", type=int, metavar="PID",
                     help="record this running process (and children it forks); on the "
                          "kernel: the objects it touches, followed in every context")
    run.add_argument("-d", "--duration", type=_seconds, metavar="SECONDS",
                     help="stop after this many seconds")
    run.add_argument("--functions", nargs="+", action="extend", default=[], metavar="GLOB",
                     help="only the methods (functions, tracepoints) whose name matches")
    run.add_argument("--exclude", nargs="+", action="extend", default=[], metavar="GLOB",
                     help="leave out the methods whose name matches")
    run.add_argument("--function-probes", default="auto",
                     choices=("auto", "fsession.multi", "fentry.multi", "fentry", "kprobe",
                              "none"),
                     help="how kernel functions are probed: auto (default) takes one session "
                          "program on tracing_multi links (fsession.multi) where the kernel "
                          "runs them, else fentry/fexit on tracing_multi links "
                          "(fentry.multi) where the kernel has them, "
                          "else fentry/fexit where the kernel accepts them, kprobes otherwise, "
                          "and kprobes above 256 functions where the kernel attaches them "
                          "(kprobe.multi links, else perf kprobes); beside a trampoline "
                          "kind (fsession.multi, fentry.multi, fentry), kprobes for the functions a trampoline "
                          "cannot take or the kernel refuses it on; fsession.multi, "
                          "fentry.multi, fentry or kprobe forces that kind alone; none: "
                          "tracepoints only")
    run.add_argument("--max-functions", type=int, metavar="N",
                     help="refuse to probe more than N kernel functions (a guard: every "
                          "function taking the struct is probed by default)")
    run.add_argument("--fields", nargs="+", action="extend", default=[], metavar="GLOB",
                     help="only these fields of the struct (a glob naming a nested struct "
                          "takes all of its fields)")
    run.add_argument("--exclude-fields", nargs="+", action="extend", default=[],
                     metavar="GLOB", help="leave out these fields of the struct")
    run.add_argument("--pointers", action="store_true",
                     help="also record pointer members (as addresses)")
    options.add_selection_arguments(run)
    run.add_argument("--watch", nargs="+", action="extend", default=[], metavar="FIELD",
                     help="arm hardware write breakpoints on these fields of the objects "
                          "followed (up to the CPU's 4 debug registers of 1-8 bytes, "
                          "shared by the objects armed at once) and record every write: "
                          "the writing instruction, its source line, the new value, the "
                          "call stack (docs/watch.md)")
    run.add_argument("--watch-budget", type=int, default=1000, metavar="WRITES",
                     help="writes recorded on one object before its breakpoints move to "
                          "another admitted object (default 1000)")
    run.add_argument("--vmlinux", metavar="FILE",
                     help="a vmlinux with DWARF (e.g. from Debian's -dbg package): the "
                          "kernel writers' source lines for --watch")
    _add_object_arguments(parser)
    _add_output_arguments(parser)


def _add_object_arguments(parser: argparse.ArgumentParser) -> None:
    objects = parser.add_argument_group("which kernel objects (checked in the kernel)")
    objects.add_argument("--comm", metavar="NAME",
                         help="objects first seen in a process of this name")
    objects.add_argument("--object", dest="objects", nargs="+", action="extend", default=[],
                         type=_address, metavar="ADDR", help="only these object addresses")
    objects.add_argument("--where", metavar="CONDITION",
                         help="objects from the first hit where the condition on their "
                              "fields holds, e.g. 'skc_num == 8080 && skc_family == 2'")
    objects.add_argument("--max-followed", dest="max_followed", type=int, metavar="N",
                         help="follow at most N objects (lifetimes), admitted in the "
                              "kernel; later ones are not recorded")
    # the spelling of releases before 2026-12; `report --max-objects` is a page limit
    objects.add_argument("--max-objects", dest="max_followed", type=int,
                         help=argparse.SUPPRESS)
    objects.add_argument("--lifetime-rule", dest="lifetime_rules", action="append",
                         metavar="RULE",
                         help="where an object's lifetime starts or ends, replacing the "
                              "defaults (printed when recording starts): "
                              "starts|ends:TRACEPOINT[:ARGUMENT=VALUE], e.g. "
                              "'starts:inet_sock_set_state:oldstate=TCP_CLOSE', "
                              "'ends:tcp_destroy_sock'; repeat for several; 'none' for no rule")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    from ctracer.record.priority import CHOICES as reader_priorities

    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", metavar="FILE",
                     help="trace file to write (default: NAME.ctrace in the current directory)")
    out.add_argument("--tail", action="store_true",
                     help="also print each event as it arrives, one line: time, object, "
                          "function, the fields it changed old → new")
    out.add_argument("--print-bpf", action="store_true",
                     help="print the generated BPF C program and exit (needs no root)")
    out.add_argument("--buffer-mb", type=int, default=16, metavar="MB",
                     help="ring buffer size, a power of two (default 16)")
    out.add_argument("--reader-priority", choices=reader_priorities, default=reader_priorities[0],
                     help="realtime (default): the thread reading the ring buffer runs "
                          "under SCHED_FIFO 1 while recording (only that thread; the "
                          "command does not), so a busy machine does not keep it from "
                          "emptying the ring; normal: it keeps ctracer's priority")
    out.add_argument("--full-snapshots", action="store_true",
                     help="every event carries the object's whole snapshot (by default "
                          "an event carries only the 8-byte words of the snapshot that "
                          "changed since the object's last event; the reader rebuilds the "
                          "rest)")
    out.add_argument("--calls", choices=("all", "changes"), default="all",
                     help="all (default): every call's entry and exit is an event; "
                          "changes: a call that changed no field of its object is counted "
                          "in the kernel (calls, total and longest duration per object, "
                          "function and caller) instead of written as two events "
                          "(not with --full-snapshots, --tail or --watch)")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    guest = parser.add_argument_group("another kernel (a throwaway QEMU guest)")
    guest.add_argument("--kernel", metavar="6.1|6.12|7.2|PATH",
                       help="record in a guest booting this kernel: Debian's 6.1 or 6.12 "
                            "(Debian 12) or 7.2 (unstable), fetched once into the cache, or "
                            "a kernel image you built (its modules beside it, or none); the "
                            "guest sees this machine's files and the trace lands here")
    guest.add_argument("--repeat", type=int, default=1, metavar="N",
                       help="with --kernel: record N runs of the command in one boot "
                            "(NAME-1.ctrace ... NAME-N.ctrace; the noise for ctracer diff)")
    guest.add_argument("--guest-timeout", type=_seconds, default=3600, metavar="SECONDS",
                       help="with --kernel: stop a guest that has not finished by then "
                            "(default 3600)")
    parser.usage = ("%(prog)s {[struct|union] NAME [--binary PATH | --module NAME | --btf FILE]"
                    " | --project FILE} [-p PID | -d SECONDS] [-o FILE] [options] [-- COMMAND [ARGS...]]")
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


#: how a recording stopped by a signal to ctracer exits: 128 + the signal, as a shell says
SIGNAL_STOPS = {"ctrl-c": 128 + signal.SIGINT, "terminated": 128 + signal.SIGTERM}


def exit_status(result) -> int:
    """ctracer's exit status after a recording: the command's own when the recording
    ended because it exited (128 + N when signal N killed it, as a shell and strace
    report it); 130 after Ctrl-C and 143 after SIGTERM (the trace is kept all the same);
    1 when the disk filled up (the trace is cut short); else 0 (-d, -p's process gone)."""
    from ctracer.record.recorder import DISK_FULL
    if result.stopped_by == DISK_FULL:
        return 1
    if result.stopped_by in SIGNAL_STOPS:
        return SIGNAL_STOPS[result.stopped_by]
    status = result.command_status
    if result.stopped_by != "command exited" or not status:
        return 0
    return 128 - status if status < 0 else status


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
        namespace.trace_words = words   # what a guest's ctracer is given (--kernel)
        return namespace, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def request_from_args(args: argparse.Namespace, kind, name: str,
                      argv: Optional[Sequence[str]] = None):
    """The `ctracer.trace_request.TraceRequest` the options describe."""
    from ctracer.record.request import TraceRequest
    return TraceRequest(
        kind=kind, name=name, source=options.type_source_from_args(args),
        functions=tuple(args.functions), exclude=tuple(args.exclude),
        fields=tuple(args.fields), exclude_fields=tuple(args.exclude_fields),
        cachelines=tuple(n for group in args.cachelines for n in group),
        max_bytes=args.max_bytes, project=getattr(args, "project_file", None),
        pointers=args.pointers,
        follow_processes=bool(args.pid or args.command), comm=args.comm,
        objects=tuple(args.objects), where=args.where, max_objects=args.max_followed,
        lifetime_rules=(tuple(args.lifetime_rules)
                        if getattr(args, "lifetime_rules", None) else None),
        function_probes=getattr(args, "function_probes", "auto"),
        max_functions=getattr(args, "max_functions", None),
        buffer_mb=args.buffer_mb, calls=getattr(args, "calls", "all"),
        # --tail prints events as they come: they carry whole snapshots
        full_snapshots=bool(getattr(args, "full_snapshots", False) or getattr(args, "tail", False)
                            or getattr(args, "watch", None)),  # the watcher reads whole events
        argv=tuple(sys.argv if argv is None else argv),
        watch=tuple(getattr(args, "watch", ()) or ()),
        watch_budget=getattr(args, "watch_budget", 1000))


def snapshot_summary(meta: dict) -> str:
    """What each event will carry, said before recording: the snapshot's bytes and the
    fields chosen, so that fields are traded for overhead knowingly."""
    from ctracer.event import Layout, event_size
    layout = Layout.from_json(meta["mini_layout"])
    names = [f.name for f in layout.ordered_fields]
    shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12
                                      else "")
    return (f"ctracer: snapshot of {meta['struct_kind']} {meta['struct_name']}: "
            f"{layout.size} bytes per event ({event_size(layout)} with the event header), "
            f"{len(names)} fields: {shown}")


def _chosen(who: str, admission: dict) -> str:
    """``who`` (the objects a kernel recording follows) narrowed by the choices in the
    meta's ``admission`` (--comm, --object, --where, --max-followed)."""
    parts = []
    if admission.get("comm"):
        parts.append(f"first seen in a process named {admission['comm']}")
    if admission.get("objects"):
        parts.append(f"at {', '.join(admission['objects'])}")
    if admission.get("where"):
        parts.append(f"where {admission['where']}")
    if not parts and not admission.get("max_objects"):
        return who
    text = "the objects" if who == "every object" else who
    text = " ".join([text, " and ".join(parts)]) if parts else text
    return text + (f" (at most {admission['max_objects']})" if admission.get("max_objects")
                   else "")


def _check_process_maps(pid: int, binary: str) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    if os.path.realpath(binary) not in maps:
        return f"process {pid} has not mapped {binary} (yet): probes fire only once it does"
    return None


def _check_run_options(args: argparse.Namespace) -> None:
    from ctracer.errors import UsageError
    if args.pid is not None and args.command:
        raise UsageError("give either -p PID or a COMMAND, not both")
    if args.pid is not None and args.pid <= 0:
        raise UsageError("-p needs a process id")
    if getattr(args, "vmlinux", None) and not getattr(args, "watch", None):
        raise UsageError("--vmlinux names the lines of --watch's kernel writers: "
                         "give --watch FIELD too")


def trace(args: argparse.Namespace, kind, name: str, *, out=None):
    """Record as the options say; returns the `ctracer.record.recorder.RecordResult`."""
    from ctracer.record import request as trace_request
    from ctracer.record.recorder import check_command
    _check_run_options(args)
    if args.command:
        check_command(args.command)  # 127 now, not after seconds of compiling
    check_output(args.output or f"{name}.ctrace")
    built = trace_request.build(request_from_args(args, kind, name))
    if built.watch is not None:
        args.vmlinux = watch_vmlinux(built, getattr(args, "vmlinux", None))
        check_watch(built)
    return record_built(built, args, kind, name, out=out)


def watch_vmlinux(built, given):
    """The vmlinux with DWARF whose lines name the kernel writers: ``given`` once
    checked to be the running kernel's build (else one line, before anything is
    compiled), else the one Debian's -dbg package installed, else None."""
    from ctracer.errors import UsageError
    from ctracer.host.vmlinux import kernel_vmlinux
    if not built.is_kernel:
        if given:
            raise UsageError("--vmlinux is for kernel objects: a program's writers are "
                             "named by its own DWARF")
        return None
    return kernel_vmlinux(given)


def check_watch(built) -> None:
    """Refuse ``--watch`` now, in one line, where the kernel refuses the breakpoints it
    needs (before anything is compiled or written)."""
    from ctracer.errors import BPFUnavailable
    from ctracer.record.breakpoints import refusal
    why = refusal(kernel=built.is_kernel)
    if why:
        where = "kernel" if built.is_kernel else "user-space"
        raise BPFUnavailable(f"--watch: the kernel refuses {where} write breakpoints here "
                             f"({why})")


def record_built(built, args: argparse.Namespace, kind, name: str, *, out=None):
    """Record a built trace with the run options of ``args`` (-p, -d, -o, --tail, -q,
    the command)."""
    from ctracer.record import recorder as record

    out = out or sys.stderr
    if args.pid is not None and built.binary:
        warning = _check_process_maps(args.pid, built.binary)
        if warning:
            print(f"ctracer: warning: {warning}", file=out)
    output = args.output or f"{name}.ctrace"
    progress = record.Progress(out, enabled=not (args.quiet or args.tail))
    tail = None
    if args.tail:
        from ctracer.record.tail import Tail
        from ctracer.report.values import ValueFormatter
        from ctracer.plan.stores import rules_by_tracepoint
        from ctracer.host import netdevs
        devices = netdevs.read() if built.is_kernel else None
        tail = Tail(built.program, formatter=ValueFormatter(built.program.mini,
                                                            built.meta.get("tracepoint_args"),
                                                            devices=devices),
                    announced=rules_by_tracepoint(built.meta.get("announced_stores")))

    def announce() -> None:
        if args.quiet:
            return
        print(snapshot_summary(built.meta), file=out)
        if built.watch is not None:
            print(f"ctracer: {built.watch.describe()}", file=out)
            if built.is_kernel:
                vmlinux = getattr(args, "vmlinux", None)
                print("ctracer: watch: writers' lines from " + vmlinux if vmlinux else
                      "ctracer: watch: writers as function+offset (no vmlinux with DWARF "
                      "found: --vmlinux FILE, e.g. from Debian's linux-image-…-dbg)",
                      file=out)
        until = " until it exits" if (args.pid or args.command) else ""
        if args.duration:
            until += f"{' or' if until else ''} for {args.duration:g} s"
        if built.is_kernel:
            who = (f"the objects process {args.pid} touches" if args.pid else
                   "the objects the command touches" if args.command else "every object")
            who = _chosen(who, built.meta.get("admission") or {})
            rules = getattr(built.program, "rules", ())
            plan = built.meta.get("probe_plan") or {}
            if plan.get("kinds"):
                print(f"ctracer: probes: {plan['kinds']}", file=out)
            creators = sorted({s.method.name for f in getattr(built.program, "kfunctions", ())
                               for s in f.routes if s.starts})
            made = (f"; a new lifetime also starts where {len(creators)} creation "
                    f"function{'s' if len(creators) != 1 else ''} return the object "
                    f"({', '.join(creators[:4])}{', ...' if len(creators) > 4 else ''})"
                    if creators else "")
            print(f"ctracer: lifetime rules: "
                  f"{', '.join(r.text for r in rules) if rules else 'none'} "
                  f"(change with --lifetime-rule){made}", file=out)
            print(f"ctracer: recording {kind.value} {name} in the kernel: {who}{until}; "
                  "Ctrl-C to stop", file=out, flush=True)
            return
        who = (f"process {args.pid}" if args.pid else
               "the command" if args.command else f"every process running {built.binary}")
        print(f"ctracer: recording {kind.value} {name} in {who}{until}; Ctrl-C to stop",
              file=out, flush=True)

    return record.record(built.program, built.binary, output, meta=built.meta,
                         command=args.command or None, pid=args.pid,
                         duration=args.duration, progress=progress, on_attached=announce,
                         tail=tail, watch_plan=built.watch,
                         vmlinux=getattr(args, "vmlinux", None),
                         reader_priority=getattr(args, "reader_priority", "realtime"))


def print_summary(result, out=None) -> None:
    """The recording's summary lines, each after ``ctracer:``, on stderr (or ``out``)."""
    from ctracer.record.recorder import summary_lines
    out = out or sys.stderr
    for line in summary_lines(result):
        print(f"ctracer: {line}", file=out)


def run(args: argparse.Namespace) -> int:
    """``ctracer trace``: record the struct's methods into a trace file (here, or in a
    guest with ``--kernel``)."""
    kind, name = target_from_args(args)
    from ctracer.commands import guest_trace
    if guest_trace.wanted(args):
        words = list(getattr(args, "trace_words", []))
        return guest_trace.record_in_guest(args, name, words + (["--", *args.command]
                                                                if args.command else []),
                                           check_output)
    if args.repeat != 1 and not os.environ.get(guest_trace.IN_GUEST_ENV):
        from ctracer.errors import UsageError
        raise UsageError("--repeat records several runs in one guest boot: give --kernel")
    if args.print_bpf:
        from ctracer.record import request as trace_request
        from ctracer.errors import UsageError
        given = [what for what, on in (("-- COMMAND", args.command), ("-p", args.pid),
                                       ("-d", args.duration), ("--tail", args.tail),
                                       ("-o", args.output)) if on]
        if given:
            raise UsageError(f"--print-bpf prints the program and records nothing: "
                             f"{', '.join(given)} would be ignored (drop --print-bpf to "
                             "record)")
        built = trace_request.build(request_from_args(args, kind, name))
        print(built.program.text, end="")
        describe = getattr(built.program, "descriptors_text", None)
        if describe is not None:
            print(describe(), end="")
        return 0
    result = trace(args, kind, name)
    print_summary(result)
    return exit_status(result)


def apply_project(args: argparse.Namespace) -> None:
    """Fill the options from ``--project FILE`` (what the command line also gives is
    added to it; a type source on the command line wins)."""
    from ctracer.errors import UsageError
    from ctracer.plan import project
    args.project_file = None
    if not getattr(args, "project", None):
        return
    p = project.load(args.project)
    if args.target:
        raise UsageError(f"the struct comes from {args.project} ({p.kind} {p.name}): give "
                         "no NAME with --project")
    args.target = [p.kind, p.name]
    if not any(getattr(args, k, None) for k in ("binary", "btf", "module")):
        args.binary, args.btf, args.btf_base, args.module = p.binary, p.btf, p.btf_base, p.module
    args.functions = list(p.functions) + list(args.functions)
    args.exclude = list(p.exclude_functions) + list(args.exclude)
    args.fields = list(p.fields) + list(args.fields)
    args.exclude_fields = list(p.exclude_fields) + list(args.exclude_fields)
    args.cachelines = ([list(p.cachelines)] if p.cachelines else []) + list(args.cachelines)
    if args.max_bytes is None:
        args.max_bytes = p.max_bytes
    args.pointers = args.pointers or p.pointers
    if not args.lifetime_rules and p.lifetime_rules is not None:
        args.lifetime_rules = list(p.lifetime_rules)   # --lifetime-rule replaces the file's
    args.project_file = p


def target_from_args(args: argparse.Namespace):
    """The struct to trace, from the words given or the project file; a `UsageError`
    when the words are not ``[struct|union] NAME``."""
    from ctracer.errors import UsageError
    apply_project(args)
    words = args.target
    if not words:
        raise UsageError("which struct? give '[struct|union] NAME' or --project FILE")
    if len(words) > 2 or (len(words) == 2 and words[0] not in ("struct", "union")):
        raise UsageError(f"expected '[struct|union] NAME', got {' '.join(words)!r} "
                         "(put the command to run after --)")
    return options.struct_name_from_args(args)

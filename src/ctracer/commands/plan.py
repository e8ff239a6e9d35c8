"""Show how a struct would be traced: the probe kind chosen for each of its methods, or why none.

The kernel's probe mechanisms are tried, not looked up by version (fentry/fexit on
tracing_multi links, fentry/fexit, kprobes and kprobe.multi links, raw tracepoints,
uprobes), and every function that takes the struct (see `ctracer functions`) gets the
best kind this kernel accepts, or the reason it is left out: inline only, not in the
kernel's list of traceable functions, a static-call trampoline (``__SCT__*``), a
tracepoint's BPF glue (``__bpf_trace_*``), notrace...  Tracepoints whose BTF prototype
carries the struct get raw tracepoint programs.

With --verify, every program the plan could use (the kprobe and kretprobe programs of
every function even where this kernel cannot attach kprobes, the raw tracepoint programs
a recording loads, or the uprobe programs of a user-space binary) is loaded through the
kernel's verifier without being attached, and rejections are reported with the
verifier's message.  fentry/fexit programs are not loaded by --verify.  Needs root.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ctracer.commands import options
from ctracer.debuginfo import sources

EPILOG = """\
examples:
  ctracer plan struct sock                       # the running kernel: counts and kinds
  ctracer plan struct sock --json | jq '.probes[] | select(.kind == "raw_tracepoint")'
  ctracer plan sk_buff --verify                  # load every kprobe program, attach none
  ctracer plan sock --verify --functions 'tcp_*' --exclude 'tcp_bpf*'
  ctracer plan sock --verify --cachelines 1      # ... snapshotting cacheline 1 only
  ctracer plan struct nfs_fh --binary nfs.ko     # a module's DWARF (not the running kernel)
  ctracer plan sock --binary ./sockdemo --verify # uprobe programs of a program
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer plan``."""
    options.add_struct_name_argument(parser)
    options.add_type_source_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help='print {"kernel": {...}, "probes": [...]} for scripts')
    parser.add_argument("--verify", action="store_true",
                        help="load every program the plan could use through the verifier, "
                             "without attaching (needs root)")
    parser.add_argument("--functions", nargs="+", action="extend", default=[], metavar="GLOB",
                        help="only the methods (functions, tp:tracepoints) whose name matches")
    parser.add_argument("--exclude", nargs="+", action="extend", default=[], metavar="GLOB",
                        help="leave out the methods whose name matches")
    options.add_selection_arguments(parser.add_argument_group(
        "with --verify: the snapshot the programs take"))
    parser.add_argument("--watch", nargs="+", action="extend", default=[], metavar="FIELD",
                        help="the write breakpoints `trace --watch` would arm: words, "
                             "objects at once, whether this kernel accepts them")
    parser.add_argument("--watch-budget", type=int, default=1000, metavar="WRITES",
                        help="writes per object before the breakpoints move on (default 1000)")


def run(args: argparse.Namespace) -> int:
    """``ctracer plan``: print which probe each method would get on this kernel and, with
    ``--verify``, load the programs through the verifier."""
    from ctracer.plan import attach
    from ctracer.plan import discovery
    from ctracer.errors import UnknownType

    from ctracer.plan.selection import open_struct

    kind, name = options.struct_name_from_args(args)
    source = options.type_source_from_args(args)
    if source.is_kernel and not (source.btf or source.module):
        model, _, found = open_struct(source, name, kind)   # vmlinux and every module
    else:
        model = sources.open_type_source(source)
        found = discovery.discover(model.catalog(), name, kind)
        if found.struct is None and not found.methods:
            raise UnknownType(kind.value, name, model.catalog().struct_names(kind),
                              model.description)
    catalog = model.catalog()
    if args.functions or args.exclude:
        from ctracer.plan.selection import select_methods
        found = dataclasses.replace(found, methods=tuple(
            select_methods(found.methods, args.functions, args.exclude)))
    plan = build_plan(args, found)
    verdicts = None
    if args.verify:
        from ctracer.record import verify
        if plan.space == "kernel" and not plan.facts.running_kernel:
            from ctracer.errors import UsageError
            raise UsageError("--verify loads programs for the running kernel: drop --binary/"
                             "--btf naming another kernel's files")
        verdicts = verify.verify_plan(
            plan, model.find_struct(name, kind), binary=args.binary, catalog=catalog,
            progress=_progress, cachelines=[n for group in args.cachelines for n in group],
            max_bytes=args.max_bytes)
    watch = watch_plan_text(args, model, name, kind, plan.space == "kernel") \
        if getattr(args, "watch", None) else None
    if args.json:
        out = as_json(plan, verdicts)
        if watch is not None:
            out["watch"] = watch
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        sys.stdout.write(as_text(found, model.description, plan, verdicts))
        if watch is not None:
            sys.stdout.write(f"\n{watch['line']}\n{watch['breakpoints']}\n")
    return 0


def watch_plan_text(args: argparse.Namespace, model, name: str, kind, kernel: bool) -> dict:
    """What ``trace --watch`` would arm and whether this kernel takes it (JSON-ready)."""
    from ctracer.plan.watch import plan_watch
    from ctracer.record.breakpoints import refusal
    watch = plan_watch(model.find_struct(name, kind), list(args.watch), args.watch_budget)
    why = refusal(kernel=kernel)
    where = "kernel" if kernel else "user-space"
    return {"words": [w.__dict__ for w in watch.words], "objects_at_once": watch.objects_at_once,
            "budget": watch.budget, "refused": why, "line": watch.describe(),
            "breakpoints": (f"{where} write breakpoints with a BPF program: refused here ({why})"
                            if why else f"{where} write breakpoints with a BPF program: "
                            "accepted here (each write costs one run of the write program: "
                            "the trace's summary measures it)")}


def _progress(line: str) -> None:
    print(f"ctracer: {line}", file=sys.stderr, flush=True)


def build_plan(args: argparse.Namespace, found):
    """The probe plan for the type source the options name."""
    from ctracer.plan import attach
    from ctracer.host import features, kallsyms

    space = attach.binary_space(args.binary) if args.binary else "kernel"
    functions = [m.name for m in found.methods if not m.is_tracepoint]
    tracepoints = [m.name for m in found.methods if m.is_tracepoint]
    running = not args.binary and (not args.btf or args.btf == sources.KERNEL_BTF)
    if running:
        facts = features.kernel_facts(functions, tracepoints)
    else:
        # another kernel's vmlinux or module (or a program): its own symbol table says
        # which functions exist out of line under their own name
        path = args.binary or args.btf
        facts = features.kernel_facts(functions, symbols=kallsyms.file_symbols(path),
                                    running_kernel=False)
    return attach.plan_probes(found.methods, facts, space=space)


def _verdict(probe, verdicts):
    """(verified, error) of one planned probe."""
    if probe.kind is None:
        return None, f"left out: {probe.reason}"
    if verdicts is None:
        return None, "not tried (run with --verify)"
    return verdicts.get(probe)


def as_json(plan, verdicts) -> dict:
    """The plan as ``--json`` prints it: the kernel's facts and one entry per probe with
    its verdict."""
    probes = []
    for p in plan.probes:
        verified, error = _verdict(p, verdicts)
        probes.append({"function": p.function, "kind": p.kind, "verified": verified,
                       "error": error or None})
    kernel = plan.facts.to_json()
    kernel["space"] = plan.space
    kernel["counts"] = plan.counts()
    kernel["mixed"] = [[p.function, p.reason] for p in _mixed(plan)]
    if verdicts is not None:
        kernel["verifier"] = {**verdicts.counts(), "programs": verdicts.programs,
                              "compile_seconds": round(verdicts.compile_seconds, 1),
                              "load_seconds": round(verdicts.load_seconds, 1),
                              "proves": "each program passes the verifier; not that its "
                                        "function can be attached"}
    return {"kernel": kernel, "probes": probes}


def _word(works) -> str:
    return {True: "yes", False: "no", None: "unknown"}[works]


def as_text(found, description: str, plan, verdicts) -> str:
    """The plan as text: the kernel's mechanisms, then each function's probe kind and verdict."""
    functions = found.functions()
    tracepoints = sorted({m.name for m in found.methods if m.is_tracepoint})
    lines = [f"{found.target} ({description}): probe plan for {len(functions)} functions "
             f"and {len(tracepoints)} tracepoints"]
    facts = plan.facts
    if plan.space == "kernel" and not facts.running_kernel:
        lines.append("  (not the running kernel's types: attaching is not checked)")
    lines.append("kernel:")
    for name, m in facts.mechanisms().items():
        lines.append(f"  {name:<16} {_word(m.works):<8} {m.why}")
    if facts.symbols_source:
        lines.append(f"  traceable functions listed by {facts.symbols_source}"
                     + (" (available_filter_functions is not readable: notrace functions "
                        "cannot be told apart)" if facts.symbols_source == "/proc/kallsyms"
                        else ""))
    rows = []
    for key, probes in plan.by_function().items():
        first = probes[0]
        kinds = "+".join(p.kind for p in probes if p.kind) or "-"
        attach = {True: "yes", False: "no", None: "unknown"}[first.attachable]
        row = [key, kinds, attach]
        if verdicts is not None:
            states = [_verdict(p, verdicts) for p in probes if p.kind]
            row.append("-" if not states else "ok" if all(v for v, _ in states)
                       else "REJECTED" if any(v is False for v, _ in states) else "not tried")
        row.append(first.reason)
        rows.append(row)
    header = ["FUNCTION", "PROBES", "ATTACH"] + (["VERIFIED"] if verdicts is not None else []) \
        + ["WHY"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header) - 1)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines.append("")
    lines.extend(fmt.format(*r).rstrip() for r in [header] + rows)
    lines.append("")
    lines.append("probes per kind:            attachable here   not attachable   unknown")
    for kind, n in plan.counts().items():
        lines.append(f"  {kind:<24} {n['attachable']:>12} {n['not attachable']:>16} "
                     f"{n['unknown']:>9}")
    if plan.left_out():
        lines.append("functions left out:")
        for why, n in plan.left_out_reasons():
            lines.append(f"  {n:>6}  {why}")
    if verdicts is not None:
        lines.extend(_verify_summary(plan, verdicts))
    placed = plan.placed()
    lines.append(f"placed here: {len(placed)} probes "
                 f"({', '.join(f'{k} {n}' for k, n in _kind_counts(placed).items()) or 'none'})")
    lines.extend(_mixed_note(plan))
    lines.extend(_trace_kind_note(plan))
    return "\n".join(lines) + "\n"


def _mixed(plan) -> list:
    """The entry probes placed on kprobes beside a trampoline kind."""
    from ctracer.plan.attach import mixed_in
    return [p for p in plan.of_kind("kprobe") if mixed_in(p)]


def _mixed_note(plan) -> list[str]:
    """Which functions go on kprobes beside the trampoline kind, and why, in a line."""
    mixed = _mixed(plan)
    if not mixed:
        return []
    from ctracer.plan.attach import TRAMPOLINE_KINDS
    main = next((p.kind for p in plan.of_kind(*TRAMPOLINE_KINDS)), "fentry")
    names = ", ".join(p.function for p in mixed[:5]) + (", ..." if len(mixed) > 5 else "")
    return [f"mixed: {len(mixed)} function{'s' if len(mixed) != 1 else ''} on "
            f"kprobe/kretprobe beside {main}, which cannot take them (more than 12 "
            f"arguments, a struct returned by value, variable arguments): {names}; "
            f"--function-probes {main} leaves them out"]


def _trace_kind_note(plan) -> list[str]:
    """What ``ctracer trace`` does by default where it differs from the plan's kind."""
    from ctracer.plan.selection import auto_kprobes_instead
    fentry = {p.function for p in plan.of_kind("fentry") if p.attachable}
    why = auto_kprobes_instead(len(fentry), plan.facts) if fentry else None
    if not why:
        return []
    how = ("kprobe.multi links" if plan.facts.kprobe_multi.works
           else "perf kprobes and kretprobes")
    return [f"ctracer trace probes these functions with {how} by default ({why})"]


def _kind_counts(probes) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in probes:
        out[p.kind] = out.get(p.kind, 0) + 1
    return out


def _verify_summary(plan, verdicts) -> list[str]:
    ok = sum(1 for p in plan.probes if p.kind and verdicts.get(p)[0] is True)
    bad = [(p, verdicts.get(p)[1]) for p in plan.probes if p.kind and verdicts.get(p)[0] is False]
    untried = [(p, verdicts.get(p)[1]) for p in plan.probes
               if p.kind and verdicts.get(p)[0] is None]
    lines = [f"verifier: {ok} programs accepted, {len(bad)} rejected, {len(untried)} not tried"
             + (f" ({verdicts.note})" if verdicts.note else "")]
    for p, error in bad[:20]:
        lines.append(f"  rejected {p.kind} {p.function}: {error}")
    if len(bad) > 20:
        lines.append(f"  ... and {len(bad) - 20} more (see --json)")
    reasons: dict[str, int] = {}
    for _, why in untried:
        reasons[why] = reasons.get(why, 0) + 1
    for why, n in sorted(reasons.items(), key=lambda i: -i[1])[:5]:
        lines.append(f"  not tried ({n}): {why}")
    return lines

"""List the functions (methods) through which a struct can be traced, and how each reaches it.

One row per route, a way a function reaches the object, by its route kind: a parameter
`struct X *` (direct), a `struct X **` (double_pointer), a pointer to a struct embedding
X at offset 0 (alias), a pointer to a struct holding a `struct X *` member (holder, with
the member path), a returned `struct X *` (returns), or a tracepoint argument
(tracepoint).  Counts per route kind and per route follow, then remarks (functions that
exist only inlined, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Optional

from ctracer.commands import options
from ctracer.debuginfo import sources
from ctracer.debuginfo.gcpause import collector_paused
from ctracer.debuginfo.catalog import TracepointInfo
from ctracer.plan.discovery import ROUTE_KINDS

EPILOG = """\
examples:
  ctracer functions struct sock                        # the running kernel, from its BTF
  ctracer functions sock --binary ./sockdemo           # a program's DWARF
  ctracer functions sk_buff --route-kind direct --route-kind tracepoint
  ctracer functions nfs_fh --binary nfs.ko --json | jq '.methods[].function'
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer functions``."""
    options.add_struct_name_argument(parser)
    options.add_type_source_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--route-kind", action="append", metavar="KIND", default=None,
                        dest="route_kinds",
                        help=f"only the routes of these kinds (repeat or comma-separate): "
                             f"{', '.join(ROUTE_KINDS)}")
    # the spelling of releases before 2026-12
    parser.add_argument("--reach", action="append", dest="route_kinds", help=argparse.SUPPRESS)
    parser.add_argument("--holder-depth", type=int, default=0, metavar="N",
                        help="also follow holders embedded at a non-zero offset in other "
                             "structs, this many levels (default 0)")


def _route_kinds(args: argparse.Namespace):
    if not args.route_kinds:
        return None
    from ctracer.errors import UsageError
    kinds = [k.strip() for item in args.route_kinds for k in item.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ROUTE_KINDS]
    if bad:
        raise UsageError(f"unknown route kind {bad[0]!r}; choose from {', '.join(ROUTE_KINDS)}")
    return kinds


def _is_live_kernel(args: argparse.Namespace) -> bool:
    if getattr(args, "binary", None):
        return False
    btf = getattr(args, "btf", None)
    return not btf or btf == sources.KERNEL_BTF


def _kernel_symbols_loader(args: argparse.Namespace):
    """Start reading the running kernel's symbols in the background (it overlaps with
    loading the types), or None when the types are not the running kernel's."""
    if not _is_live_kernel(args):
        return None
    from ctracer.host import kallsyms
    return kallsyms.SymbolsLoader()


def _attach_column(loader, found):
    """A function giving each method's attachability on the running kernel, from the
    probe plan (`ctracer.plan.attach`): ``yes``, ``no: <why>``, ``clone:<symbol>`` when
    only a compiler-specialised copy exists, or ``unknown``; None without a loader."""
    if loader is None:
        return None
    from ctracer.plan import attach
    from ctracer.host import features
    functions = [m.name for m in found.methods if not m.is_tracepoint]
    tracepoints = [m.name for m in found.methods if m.is_tracepoint]
    facts = features.kernel_facts(functions, tracepoints, symbols=loader.result())
    plan = attach.plan_probes(found.methods, facts).by_function()
    return lambda method: attach_state(plan[method.key][0])


def attach_state(probe) -> str:
    """The ATTACHABLE column for a function's (first) planned probe."""
    if probe.attachable is None:
        return "unknown"
    if probe.attachable:
        return "yes"
    if probe.reason.startswith("only a compiler clone exists: "):
        return "clone:" + probe.reason.split(": ", 1)[1].split()[0]
    if probe.kind is None:
        return f"no: {probe.reason.split(' (')[0].split(':')[0]}"
    return f"no: {probe.kind} cannot attach here"


def run(args: argparse.Namespace) -> int:
    """``ctracer functions``: list the struct's methods and their routes (text or JSON)."""
    from ctracer.plan import discovery
    from ctracer.errors import UnknownType, UsageError

    kind, name = options.struct_name_from_args(args)
    route_kinds = _route_kinds(args)
    if args.holder_depth < 0:
        raise UsageError("--holder-depth must be 0 or more")
    loader = _kernel_symbols_loader(args)
    source = options.type_source_from_args(args)
    if source.is_kernel and not (source.btf or source.module):
        from ctracer.plan.selection import open_struct   # vmlinux and every loaded module
        model, _, found = open_struct(source, name, kind, route_kinds=route_kinds,
                                      holder_depth=args.holder_depth)
    else:
        model = sources.open_type_source(source)
        catalog = model.catalog()
        found = discovery.discover(catalog, name, kind, route_kinds=route_kinds,
                                   holder_depth=args.holder_depth)
        if found.struct is None and not found.methods:
            raise UnknownType(kind.value, name, catalog.struct_names(kind), model.description)
    attachable = _attach_column(loader, found)
    out = sys.stdout
    with collector_paused():  # a row per method, all kept until written
        if args.json:
            _write_json(_as_json(found, model.description, attachable), out)
        else:
            out.write(_as_text(found, model.description, attachable))
    return 0


def _as_json(found, description: str, attachable) -> dict:
    methods = []
    for m in found.methods:
        row = m.to_json()
        if attachable is not None:
            row["attachable"] = attachable(m)
        methods.append(row)
    return {
        "target": {"kind": found.kind.value, "name": found.name,
                   "size": found.struct.size if found.struct else None,
                   "defined": found.struct is not None},
        "source": description,
        "methods": methods,
        "counts": {"reach": found.counts_by_route_kind(),
                   "route": [{"reach": k, "route": r, "methods": n}
                             for k, r, n in found.counts_by_route()],
                   "functions": found.function_count(),
                   "tracepoints": len({m.name for m in found.methods if m.is_tracepoint})},
        "aliases": [[link.to_json() for link in chain] for chain in found.aliases],
        "holders": list(found.holders),
        "by_value": list(found.by_value),
        "notes": list(found.notes),
    }


def _write_json(doc: dict, out) -> None:
    """JSON with one method per line: readable, and written by the C encoder (an indented
    dump of ten thousand methods costs more than finding them)."""
    out.write("{\n")
    items = list(doc.items())
    for n, (key, value) in enumerate(items):
        out.write(f" {json.dumps(key)}: ")
        if key == "methods":
            out.write("[\n" + ",\n".join("  " + json.dumps(m) for m in value) + "\n ]")
        else:
            out.write(json.dumps(value))
        out.write(",\n" if n + 1 < len(items) else "\n")
    out.write("}\n")


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, the last one not padded."""
    columns = list(zip(header, *rows))
    # a column at a time (str.ljust), then one join a row: faster than a format a row
    # (12k rows for sock)
    padded = [[cell.ljust(width) for cell in column] for column, width in
              zip(columns[:-1], [max(map(len, column)) for column in columns[:-1]])]
    padded.append(columns[-1])
    return ["  ".join(cells).rstrip() for cells in zip(*padded)]


def _as_text(found, description: str, attachable) -> str:
    target = found.target
    tracepoints = {m.function.name for m in found.methods
                   if isinstance(m.function, TracepointInfo)}
    lines = [f"{target} ({description}): {len(found.methods)} methods in "
             f"{found.function_count()} functions and {len(tracepoints)} tracepoints"]
    if found.struct is None:
        lines.append(f"  ({target} is only declared: no layout to record)")
    header = ("FUNCTION", "ROUTE KIND", "PROBE")
    if attachable is not None:
        header += ("ATTACHABLE",)
    header += ("ROUTE",)
    rows = []
    status = Counter()
    texts: dict = {}  # Method.route_text by what it depends on (sock: 414 texts, 11,746 methods)
    for m in found.methods:  # (m.function.key: Method.key without a property call)
        probe = "yes" if m.probeable else f"no: {m.not_probeable}"
        text = texts.get((m.route_form, m.param_index, m.param_name))
        if text is None:
            text = texts[(m.route_form, m.param_index, m.param_name)] = m.route_text
        if attachable is None:
            rows.append((m.function.key, m.route_kind, probe, text))
        else:
            state = attachable(m)
            status[state.split(":")[0]] += 1
            rows.append((m.function.key, m.route_kind, probe, state, text))
    if rows:
        lines.append("")
        lines.extend(_table(rows, header))
    lines.append("")
    lines.append("methods per route kind:")
    for k, n in found.counts_by_route_kind().items():
        lines.append(f"  {k:<15} {n:>6}")
    if attachable is not None:
        lines.append("attachable on the running kernel: " + ", ".join(
            f"{k} {n}" for k, n in sorted(status.items())))
    lines.append("methods per route:")
    for k, route, n in found.counts_by_route():
        lines.append(f"  {k:<15} {n:>6}  {route}")
    if found.notes:
        lines.append("notes:")
        lines.extend(f"  {note}" for note in found.notes)
    return "\n".join(lines) + "\n"

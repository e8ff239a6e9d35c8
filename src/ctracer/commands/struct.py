"""Print a struct's (or union's) layout exactly as ``pahole -C NAME`` prints it, or with
--mini the minimized struct that a trace records for it.

The mini struct holds every scalar member reachable without following a pointer (dotted
paths, anonymous structs and unions included); members of a complex type (locks,
refcounts, atomics, queues, lists, ktime_t) are recorded by the collector of their kind
as the values an engineer reads (``sk_lock.owned``, ``sk_lock.slock.held``,
``__sk_common.skc_refcnt``), not as their internals.  --explain lists every member left
out and why, and what each collector records instead.

The layout shows every member with its offset and size, bitfield bit offsets, holes, bit
holes, padding, cacheline boundaries and pahole's summary comment; anonymous structs and
unions are expanded inline.  Types come from DWARF (--binary), BTF (--btf, --module) or,
by default, the running kernel's BTF.
"""

from __future__ import annotations

import argparse

from ctracer.commands import options
from ctracer.debuginfo import sources

EPILOG = """\
examples:
  ctracer struct sock                                 # the running kernel, from its BTF
  ctracer struct union bpf_attr                       # a union
  ctracer struct sock --binary ./sockdemo             # a program's DWARF
  ctracer struct sock --binary ./sockdemo --mini      # the fields a trace records
  ctracer struct sock --mini --explain                # ... and what is left out, and why
  ctracer struct sock --mini --cachelines 1,3 --max-bytes 64
  ctracer struct nfs_fh --binary nfs.ko
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer struct``."""
    options.add_struct_name_argument(parser)
    options.add_type_source_arguments(parser)
    mini = parser.add_argument_group("mini struct")
    mini.add_argument("--mini", action="store_true",
                      help="print the minimized struct a trace records instead of the layout")
    mini.add_argument("--fields", nargs="+", action="extend", default=[], metavar="GLOB",
                      help="with --mini: only these fields (names or globs; a glob naming "
                           "a nested struct takes all of its fields), as `ctracer trace "
                           "--fields`")
    mini.add_argument("--exclude-fields", nargs="+", action="extend", default=[],
                      metavar="GLOB", help="with --mini: leave out these fields (names or "
                                           "globs), as `ctracer trace --exclude-fields`")
    options.add_selection_arguments(mini, "with --mini: ")
    mini.add_argument("--explain", action="store_true",
                      help="with --mini: list what is left out and why, and what the "
                           "collectors of complex members record")
    mini.add_argument("--pointers", action="store_true",
                      help="with --mini: also record pointer members (as addresses)")
    mini.add_argument("--no-reorganize", action="store_true",
                      help="with --mini: keep the fields in source order")


def run(args: argparse.Namespace) -> int:
    """``ctracer struct``: print the struct's layout as pahole does, or with ``--mini`` the
    mini struct a trace records."""
    from ctracer.errors import UnknownType, UsageError
    from ctracer.debuginfo.catalog import ShapeKind

    kind, name = options.struct_name_from_args(args)
    kind_given = len(args.target) == 2
    mini_only = (args.fields or args.exclude_fields or args.cachelines or args.pointers
                 or args.no_reorganize or args.max_bytes is not None or args.explain)
    if mini_only and not args.mini:
        raise UsageError("--fields, --exclude-fields, --cachelines, --max-bytes, --pointers, "
                         "--no-reorganize and --explain need --mini")
    model = sources.open_type_source(options.type_source_from_args(args))
    try:
        graph = model.find_struct(name, kind)
    except UnknownType:
        if kind_given:
            raise
        # like pahole -C, a bare name may be a union's
        try:
            graph = model.find_struct(name, ShapeKind.UNION)
        except UnknownType:
            raise UnknownType("struct", name, model.struct_names(ShapeKind.STRUCT),
                              model.description) from None
    if args.mini:
        print(_mini_text(graph, args), end="")
        return 0
    from ctracer.plan import pahole as layout
    print(layout.render(graph, source_format=model.format), end="")
    return 0


def _mini_text(graph, args: argparse.Namespace) -> str:
    from ctracer.collectors import registry
    from ctracer.plan import mini
    built = mini.build_mini(graph, include=args.fields, exclude=args.exclude_fields,
                            cachelines=[n for group in args.cachelines for n in group],
                            max_bytes=args.max_bytes, pointers=args.pointers,
                            reorganize_fields=not args.no_reorganize, kinds=registry.claim)
    return mini.render_built(built, explain=args.explain)

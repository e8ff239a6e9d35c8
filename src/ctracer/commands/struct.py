"""Print a struct's (or union's) layout exactly as ``pahole -C NAME`` prints it, or with
--mini the minimized struct that a trace records for it.

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
  ctracer struct nfs_fh --binary nfs.ko
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_struct_name_argument(parser)
    options.add_type_source_arguments(parser)
    mini = parser.add_argument_group("mini struct")
    mini.add_argument("--mini", action="store_true",
                      help="print the minimized struct a trace records instead of the layout")
    mini.add_argument("--field", action="append", default=[], metavar="PATTERN",
                      help="with --mini: only fields matching this name or glob (repeatable)")
    mini.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                      help="with --mini: leave out fields matching this name or glob")
    mini.add_argument("--cacheline", action="append", type=int, default=[], metavar="N",
                      help="with --mini: only fields in cacheline N of the traced struct")
    mini.add_argument("--pointers", action="store_true",
                      help="with --mini: also record pointer members (as addresses)")
    mini.add_argument("--no-reorganize", action="store_true",
                      help="with --mini: keep the fields in source order")


def run(args: argparse.Namespace) -> int:
    from ctracer.errors import UnknownType, UsageError
    from ctracer.debuginfo.model import ShapeKind

    kind, name = options.struct_name_from_args(args)
    kind_given = len(args.target) == 2
    mini_only = (args.field or args.exclude or args.cacheline or args.pointers
                 or args.no_reorganize)
    if mini_only and not args.mini:
        raise UsageError("--field, --exclude, --cacheline, --pointers and --no-reorganize "
                         "need --mini")
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
    from ctracer.plan import mini
    built = mini.build_mini(graph, include=args.field, exclude=args.exclude,
                            cachelines=args.cacheline, pointers=args.pointers,
                            reorganize_fields=not args.no_reorganize)
    return mini.render_mini(built.layout, skipped=built.skipped,
                            struct_size=built.struct_size)

"""The command-line options the commands share: the struct to work on and where its types
come from (`ctracer.debuginfo.sources.TypeSource`).  Only commands take argparse objects;
these turn them into the plain data the library takes.
"""

from __future__ import annotations

import argparse

from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.sources import MODULE_BTF_DIR, TypeSource, parse_struct_name


def add_type_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The options saying where the types come from (a binary's DWARF, BTF, a module, the
    running kernel), shared by the subcommands that open a struct."""
    g = parser.add_argument_group("type source (default: the running kernel's BTF)")
    g.add_argument("--binary", "-b", metavar="PATH",
                   help="ELF file whose DWARF (or .BTF section) describes the types")
    g.add_argument("--btf", metavar="PATH", help="raw BTF file, or ELF file with .BTF")
    g.add_argument("--btf-base", metavar="PATH",
                   help="the BTF a split --btf was built on (e.g. vmlinux for a module)")
    g.add_argument("--module", metavar="NAME",
                   help=f"kernel module whose BTF ({MODULE_BTF_DIR}/NAME) to read")
    g.add_argument("--no-cache", action="store_true",
                   help="do not read or write the type cache")


def add_struct_name_argument(parser: argparse.ArgumentParser) -> None:
    """The ``[struct|union] NAME`` argument."""
    parser.add_argument("target", nargs="+", metavar="[struct|union] NAME",
                        help="the struct (or union) to work on, e.g. 'struct sock' or 'sock'")


def struct_name_from_args(args: argparse.Namespace) -> tuple[ShapeKind, str]:
    """The kind and name given as ``[struct|union] NAME``."""
    return parse_struct_name(args.target)


def type_source_from_args(args: argparse.Namespace) -> TypeSource:
    """The `TypeSource` the options of `add_type_source_arguments` chose."""
    return TypeSource(binary=getattr(args, "binary", None), btf=getattr(args, "btf", None),
                      btf_base=getattr(args, "btf_base", None),
                      module=getattr(args, "module", None),
                      use_cache=not getattr(args, "no_cache", False))


def add_selection_arguments(group, prefix: str = "") -> None:
    """--cachelines and --max-bytes: which fields a snapshot takes (`ctracer struct
    --mini`, `ctracer trace`, `ctracer plan --verify`)."""
    group.add_argument("--cachelines", action="append", type=cacheline_list, default=[],
                       metavar="N[,N...]",
                       help=f"{prefix}only fields on these cachelines of the traced struct "
                            "(numbered from 0 as pahole's comments)")
    group.add_argument("--max-bytes", type=int, default=None, metavar="N",
                       help=f"{prefix}keep fields in order while the snapshot stays within N "
                            "bytes")


def cacheline_list(text: str) -> list[int]:
    """``1,3`` → [1, 3] (argparse turns the ValueError into one line)."""
    lines = [int(part) for part in text.split(",") if part.strip()]
    if not lines or any(n < 0 for n in lines):
        raise ValueError(text)
    return lines


cacheline_list.__name__ = "cacheline list"

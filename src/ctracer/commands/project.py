"""Write a project file: every method and every recordable field of a struct, for a
person to edit, then record with ``ctracer trace --project FILE``.

The file is TOML (see `ctracer.plan.project`): the struct, where its types come from,
[functions] include/exclude globs and [fields] include/exclude paths or globs,
cachelines, max_bytes and pointers.  Each method line says how the function reaches the
struct; each field line its C type, offset and cacheline.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ctracer.commands import options

EPILOG = """\
examples:
  ctracer project init struct sock --binary ./sockdemo -o sock.toml
  ctracer project init struct sock -o sock.toml        # the running kernel's BTF
  ctracer trace --project sock.toml -- ./sockdemo      # record what the file keeps
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer project``."""
    parser.add_argument("action", choices=["init"], help="init: write a new project file")
    options.add_struct_name_argument(parser)
    options.add_type_source_arguments(parser)
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="the file to write (it must not exist yet; default: stdout)")


def run(args: argparse.Namespace) -> int:
    """``ctracer project init``: write a project file naming the struct, its type source,
    every probeable method and the mini struct's fields."""
    from ctracer.collectors import registry
    from ctracer.errors import CtracerError
    from ctracer.plan import mini, project

    kind, name = options.struct_name_from_args(args)
    from ctracer.plan.selection import open_struct
    model, graph, found = open_struct(options.type_source_from_args(args), name, kind)
    wanted = [m for m in found.methods if m.probeable
              and (m.is_tracepoint != bool(args.binary))]
    methods: dict[str, str] = {}
    for m in wanted:
        methods.setdefault(m.key, f"{m.route_kind}: {m.route_text}")
    fields, _ = mini.candidate_fields(graph, kinds=registry.claim)
    described = [(f.name, f"{f.source.get('ctype', f.ctype)}, byte {f.source['byte_offset']}, "
                          f"cacheline {f.source['cacheline']}") for f in fields]
    source = {k: os.path.abspath(getattr(args, k)) if k != "module" else getattr(args, k)
              for k in ("binary", "btf", "btf_base", "module") if getattr(args, k, None)}
    command = "ctracer " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = project.render(kind.value, name, source, sorted(methods.items()), described,
                          command)
    if not args.output:
        sys.stdout.write(text)
        return 0
    try:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise CtracerError(f"{args.output} exists: remove it or choose another -o") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    print(f"ctracer: wrote {args.output}: {len(methods)} methods, {len(fields)} fields of "
          f"{kind.value} {name}; next: ctracer trace --project {args.output}", file=sys.stderr)
    return 0

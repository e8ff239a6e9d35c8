#!/usr/bin/env python3
"""What `ctracer plan --verify` and a kernel-function trace's compile cost, as ratios to
an anchor measured in the same run (needs root; run with the project's venv):

    .venv/bin/python bench/bench_verify.py [--struct sock] [--functions N]

* the anchor: bcc compiling a one-line kprobe program (bcc's fixed cost);
* the kprobe/kretprobe programs of the first N (default: every) kernel function of the
  struct's plan (`ctracer.probes.kfunctions`: one entry and one exit program per route
  count, shared by all the functions), compiled once and each loaded through the
  verifier: seconds, the compile's ratio to the anchor, and per-function cost, which
  should not grow with N.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from ctracer.collectors import registry  # noqa: E402
from ctracer.debuginfo.btf import reader as btf  # noqa: E402
from ctracer.debuginfo.catalog import ShapeKind  # noqa: E402
from ctracer.plan import attach, discovery, mini  # noqa: E402
from ctracer.probes.kernel_program import build_kernel_program  # noqa: E402
from ctracer.record import bpf_runtime  # noqa: E402
from ctracer.host import features


def _compile(text: str, cflags: list[str]) -> tuple[object, float]:
    import bcc
    start = time.monotonic()
    b = bcc.BPF(text=text.encode(), cflags=cflags)
    return b, time.monotonic() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--struct", default="sock")
    p.add_argument("--functions", type=int, default=None)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_verify: needs root", file=sys.stderr)
        return 2
    bpf_runtime.prepare()
    import bcc

    model = btf.open_btf(btf.KERNEL_BTF)
    found = discovery.discover(model.catalog(), args.struct)
    facts = features.kernel_facts([m.name for m in found.methods if not m.is_tracepoint])
    plan = attach.plan_probes(found.methods, facts, prefer="kprobe")
    layout = mini.build_mini(model.find_struct(args.struct, ShapeKind.STRUCT),
                             kinds=registry.claim).layout
    entries = plan.of_kind("kprobe")[:args.functions]
    program = build_kernel_program((), layout, None, entry_kind="kprobe",
                                   function_methods=[m for e in entries for m in e.methods])
    n = len(program.kfunctions)

    b, anchor = _compile("int probe(void *ctx) { return 0; }", ["-g0"])
    b.cleanup()
    print(f"anchor: one-line program compile {anchor:.2f} s")
    b, seconds = _compile(program.text, ["-g0"])
    names = program.program_names()
    start = time.monotonic()
    for name in names:
        f = b.load_func(name.encode(), bcc.BPF.KPROBE)
        os.close(f.fd)
        del b.funcs[name.encode()]
    load = time.monotonic() - start
    b.cleanup()
    print(f"{n} {args.struct} functions: {len(names)} programs, compile {seconds:.1f} s "
          f"({seconds / anchor:.1f}x the anchor; {seconds / max(n, 1) * 1000:.2f} ms a "
          f"function), load {load:.2f} s ({load / len(names) * 1000:.1f} ms a program)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What `ctracer plan --verify` costs, as ratios to anchors measured in the same run (needs
root; run with the project's venv):

    .venv/bin/python bench/bench_verify.py [--struct sock] [--functions N]

* the anchor: bcc compiling a one-line kprobe program (bcc's fixed cost);
* the first N kprobe functions of the struct's plan on the running kernel (an entry and an
  exit program each, one shared emitter), compiled without debug info (what --verify does)
  and with bcc's default debug info, each then loaded through the verifier: seconds, ms
  per function, and the compile's ratio to the anchor;
* the same N functions with the snapshot inlined in every probe instead of the shared
  emitter (the design not taken): compile time and ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from ctracer.debuginfo.btf import reader as btf  # noqa: E402
from ctracer.debuginfo.model import ShapeKind  # noqa: E402
from ctracer.plan import attach, discovery, mini  # noqa: E402
from ctracer.probes import kprobe  # noqa: E402
from ctracer.record import bpf_runtime, kernel  # noqa: E402


def _compile(text: str, cflags: list[str]) -> tuple[object, float]:
    import bcc
    start = time.monotonic()
    b = bcc.BPF(text=text.encode(), cflags=cflags)
    return b, time.monotonic() - start


def _inlined(program: kprobe.KprobeProgram) -> str:
    """The same probes with the emitter's work done in each probe (no tail call)."""
    text = program.text.replace("\tctracer_emitters.call(ctx, 0);",
                                "\tctracer_emit_inline(ctx);")
    emitter = text.index(f"int {kprobe.EMITTER}(struct pt_regs *ctx)")
    inline = text[emitter:].split("\n}\n", 1)[0].replace(
        f"int {kprobe.EMITTER}(struct pt_regs *ctx)",
        "static __always_inline int ctracer_emit_inline(struct pt_regs *ctx)") + "\n}\n"
    return text[:emitter] + inline + text[emitter:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--struct", default="sock")
    p.add_argument("--functions", type=int, default=300, metavar="N")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_verify: needs root", file=sys.stderr)
        return 2
    bpf_runtime.prepare()
    import bcc

    model = btf.open_btf(btf.KERNEL_BTF)
    found = discovery.discover(model.catalog(), args.struct)
    facts = kernel.kernel_facts([m.name for m in found.methods if not m.is_tracepoint])
    plan = attach.plan_probes(found.methods, facts)
    layout = mini.build_mini(model.find_struct(args.struct, ShapeKind.STRUCT)).layout
    entries = plan.of_kind("kprobe")[:args.functions]
    program = kprobe.build_kprobe_program(entries, layout)
    n = len(program.functions)

    b, anchor = _compile("int probe(void *ctx) { return 0; }", ["-g0"])
    b.cleanup()
    print(f"anchor: one-line program compile {anchor:.2f} s")
    for label, flags in (("without debug info (--verify)", ["-g0"]), ("bcc default", [])):
        b, seconds = _compile(program.text, flags)
        start = time.monotonic()
        fd = b.load_func(kprobe.EMITTER.encode(), bcc.BPF.KPROBE).fd
        b[b"ctracer_emitters"][0] = fd
        for name in program.program_names[1:]:
            f = b.load_func(name.encode(), bcc.BPF.KPROBE)
            os.close(f.fd)
            del b.funcs[name.encode()]
        load = time.monotonic() - start
        b.cleanup()
        print(f"{n} {args.struct} functions, {label}: compile {seconds:.1f} s "
              f"({seconds / n * 1000:.1f} ms a function, {seconds / anchor:.0f}x the anchor), "
              f"load {2 * n + 1} programs {load:.2f} s ({load / (2 * n + 1) * 1000:.2f} ms each)")
    b, seconds = _compile(_inlined(program), ["-g0"])
    b.cleanup()
    print(f"{n} functions with the snapshot inlined in every probe: compile {seconds:.1f} s "
          f"({seconds / n * 1000:.1f} ms a function, {seconds / anchor:.0f}x the anchor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

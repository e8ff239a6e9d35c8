#!/usr/bin/env python3
"""What recording costs, on the bundled sample, as ratios to anchors measured in the same
run (needs root; run with the project's venv):

    .venv/bin/python bench/bench_trace.py [--loops N] [--threads T] [--cachelines 1,3]

* set-up: bcc compile of the generated program against the compile of a one-line program
  (the anchor: bcc's fixed cost), then attach and detach time per probe;
* throughput: the -O2 sample (no ground-truth log) run under the probes with the events
  consumed (a) by a callback that only counts them (the anchor: what the ring buffer,
  read through its memory map, delivers to Python) and (b) by the recorder (committing them raw to the trace file
  every 0.25 s and decoding them as time allows); events/s delivered and lost, and the
  sample's slowdown against running it untraced;
* finishing the trace file (decoding what was left when the recording stopped).

The snapshot is the default selection (every field, complex members by their
collectors), or only the fields on ``--cachelines``; its size is printed first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from ctracer.collectors import registry
from ctracer.record import bpf_runtime
from ctracer.plan import discovery
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan import mini
from ctracer.probes import uprobe
from ctracer.record import recorder as record
from ctracer.event import event_size  # noqa: E402
from ctracer.tracefile import TraceWriter  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SAMPLE = os.path.join(ROOT, "samples", "sock", "build", "sockdemo-O2")


def program_for(binary: str, cachelines=()) -> uprobe.UprobeProgram:
    types = dwarf.open_elf_types(binary)
    found = discovery.discover(types.catalog(), "sock")
    layout = mini.build_mini(types.find_struct("sock"), cachelines=cachelines,
                             kinds=registry.claim).layout
    return uprobe.build_program(found.methods, layout, filtered=True)


def anchor_compile_seconds() -> float:
    import bcc  # the anchor uses bcc directly: the cost any bcc tool pays
    start = time.perf_counter()
    b = bcc.BPF(text=b"int probe(void *ctx) { return 0; }")
    seconds = time.perf_counter() - start
    b.cleanup()
    return seconds


def run_sample(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def traced_run(program, argv, consumer: str, out_dir: str) -> dict:
    counts = record.ProgressCounts()
    writer = None
    session = bpf_runtime.ProbeSession(program, SAMPLE, lambda raw: None)
    session.compile()
    if consumer == "count":
        size = event_size(program.mini, program.nargs)

        def count(raw: bytes) -> None:  # one or more events, back to back
            counts.events += len(raw) // size
        session.on_event = count
    else:
        writer = TraceWriter(os.path.join(out_dir, "bench.ctrace"))
        writer.set_meta(mini_layout=program.mini.to_json(),
                        return_value_functions=sorted(program.rows_with_return_value()))
        writer.expect_raw()
        session.on_event = record.EventSink(program, writer, counts)
    command = record.GatedCommand(argv)
    session.follow(command.pid)
    start = time.perf_counter()
    session.attach()
    attach = time.perf_counter() - start
    start = time.perf_counter()
    command.release()
    while command.poll() is None:
        session.poll(record.POLL_MS)
        if writer:
            session.on_event.flush()
    session.drain()
    if writer:
        session.on_event.flush(commit=True)
    wall = time.perf_counter() - start
    lost = session.lost()
    start = time.perf_counter()
    session.close()
    detach = time.perf_counter() - start
    write = 0.0
    if writer:
        start = time.perf_counter()
        writer.close()
        write = time.perf_counter() - start
    return dict(events=counts.events, lost=lost, wall=wall, attach=attach, detach=detach,
                compile=session.compile_seconds, write=write)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cachelines", default="",
                        help="snapshot only the fields on these cachelines, e.g. 1 or 1,3")
    args = parser.parse_args()
    cachelines = [int(n) for n in args.cachelines.split(",") if n.strip()]
    if os.geteuid() != 0:
        print("bench_trace: needs root", file=sys.stderr)
        return 1
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    bpf_runtime.prepare()
    program = program_for(SAMPLE, cachelines)
    nprobes = 2 * len(program.functions)
    print(f"snapshot: {program.mini.size} bytes, {len(program.mini.fields)} fields "
          f"({'cachelines ' + args.cachelines if cachelines else 'default selection'})")
    argv = [SAMPLE, "--loops", str(args.loops), "--threads", str(args.threads)]

    anchor = anchor_compile_seconds()
    untraced = min(run_sample(argv) for _ in range(3))
    with tempfile.TemporaryDirectory() as d:
        counted = traced_run(program, argv, "count", d)
        recorded = traced_run(program, argv, "record", d)
    print(f"set-up: bcc compile {recorded['compile']:.2f} s = {recorded['compile'] / anchor:.1f}x "
          f"a one-line program ({anchor:.2f} s); attach {recorded['attach'] * 1000:.0f} ms for "
          f"{nprobes} probes ({recorded['attach'] / nprobes * 1000:.1f} ms each); "
          f"detach {recorded['detach'] * 1000:.0f} ms")
    emitted = counted["events"] + counted["lost"]
    print(f"workload: {emitted} events; untraced run {untraced:.3f} s")
    for name, r in (("count-only callback (anchor)", counted), ("recorder", recorded)):
        total = r["events"] + r["lost"]
        print(f"{name}: {r['events'] / r['wall']:,.0f} events/s delivered, {r['lost']} lost "
              f"({100 * r['lost'] / max(total, 1):.1f}%), run {r['wall']:.2f} s = "
              f"{r['wall'] / untraced:.1f}x untraced")
    ratio = (recorded["events"] / recorded["wall"]) / (counted["events"] / counted["wall"])
    print(f"recorder / anchor delivered events/s: {ratio:.2f}")
    print(f"finishing the trace file after the recording (decoding what was left): "
          f"{recorded['write']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

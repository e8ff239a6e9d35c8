#!/usr/bin/env python3
"""Bytes per event of compact events against whole snapshots, in one run (needs root;
run with the project's venv):

    .venv/bin/python bench/bench_compact.py [--connections 4] [--messages 30000]

The bundled loopback workload (samples/tcp) traced on this host's tracepoints twice,
one recording after the other: with compact events (the default) and with
``--full-snapshots`` (the anchor).  For each: events written, events lost, the bytes of
events in the trace file per event written (the spool's raw batches) and the whole
file's bytes per event; then the ratio of the two bytes per event.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
CTRACER = [sys.executable, "-m", "ctracer"]


def record(out: str, connections: int, messages: int, *extra: str) -> dict:
    r = subprocess.run(CTRACER + ["trace", "struct", "sock", "-q", "-o", out, *extra, "--",
                                  TCPLOOP, "--connections", str(connections),
                                  "--messages", str(messages)],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(r.stderr)
    m = re.search(r"(\d+) events, \d+ object addresses, (\d+) lost in ([\d.]+) (m?s)", r.stderr)
    events, lost = int(m.group(1)), int(m.group(2))
    seconds = float(m.group(3)) / (1000 if m.group(4) == "ms" else 1)
    db = sqlite3.connect(out)
    raw = db.execute("SELECT sum(length(raw)) FROM spool").fetchone()[0] or 0
    db.close()
    return dict(events=events, lost=lost, seconds=seconds, raw=raw,
                file=os.path.getsize(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--messages", type=int, default=30000)
    args = p.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        for name, extra in (("compact", ()), ("full (anchor)", ("--full-snapshots",))):
            rows[name] = record(os.path.join(work, "t.ctrace"), args.connections,
                                args.messages, *extra)
            os.unlink(os.path.join(work, "t.ctrace"))
    print(f"tcploop --connections {args.connections} --messages {args.messages}, "
          "tracepoints of struct sock")
    for name, r in rows.items():
        total = r["events"] + r["lost"]
        print(f"  {name:14} {r['events']:>9} written {r['lost']:>9} lost "
              f"({100 * r['lost'] / max(1, total):.0f}%)  "
              f"{r['raw'] / max(1, r['events']):6.1f} B/event (events) "
              f"{r['file'] / max(1, r['events']):6.1f} B/event (file)  "
              f"{r['events'] / max(r['seconds'], 1e-9):,.0f} written/s")
    c, f = rows["compact"], rows["full (anchor)"]
    print(f"  compact / full bytes per event: "
          f"{(c['file'] / c['events']) / (f['file'] / f['events']):.2f} (file), "
          f"{(c['raw'] / c['events']) / (f['raw'] / f['events']):.2f} (events)")


if __name__ == "__main__":
    main()

"""The sample's own log of every method call (samples/sock/gtlog.c), and its comparison
with a trace file: the oracle of the real-BPF tests."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from ctracer.event import PHASE_ENTRY
from ctracer.tracefile import Trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_DIR = os.path.join(ROOT, "samples", "sock")
SOCKDEMO = os.path.join(SAMPLE_DIR, "build", "sockdemo")
SOCKDEMO_O2 = os.path.join(SAMPLE_DIR, "build", "sockdemo-O2")
SOCKDEMO_NOPIE = os.path.join(SAMPLE_DIR, "build", "sockdemo-nopie")
LOG_ENV = "CTRACER_SAMPLE_LOG"


@dataclass(frozen=True)
class Call:
    """One object of one method call at entry or exit, as the log or the trace saw it."""

    function: str
    unit: str
    phase: str
    tid: int
    depth: int
    slot: int
    object: int
    ret: Optional[int]
    fields: tuple  # sorted (name, value) pairs; empty when there is no object

    def brief(self) -> str:
        return (f"{self.function}@{self.unit} {self.phase} slot {self.slot} depth {self.depth} "
                f"obj {self.object:#x} ret {self.ret}")


def parse_log(path: str) -> list[Call]:
    calls = []
    with open(path) as f:
        for line in f:
            items = dict(part.split("=", 1) for part in line.rstrip("\n").split("\t"))
            fields = {k: v for k, v in items.items()
                      if k not in ("fn", "file", "phase", "tid", "depth", "slot", "obj", "ret")}
            calls.append(Call(items["fn"], items["file"], items["phase"], int(items["tid"]),
                              int(items["depth"]), int(items["slot"]), int(items["obj"], 0),
                              None if items["ret"] == "-" else int(items["ret"]),
                              tuple(sorted(fields.items()))))
    return calls


def _as_text(kind: str, value) -> str:
    if kind == "pointer":
        return hex(value) if value else "0"
    return str(value)


def trace_calls(trace: Trace) -> list[Call]:
    """The trace's events as `Call`s whose field values are printed as the log prints
    them, for the fields of the trace's mini struct."""
    slots: dict[int, int] = {}
    seen: dict[tuple, int] = defaultdict(int)
    for fid in sorted(trace.functions):
        row = trace.functions[fid]
        slots[fid] = seen[(row.name, row.unit)]
        seen[(row.name, row.unit)] += 1
    kinds = {f.name: f.kind for f in trace.mini.fields}
    calls = []
    for e in trace.events():
        row = trace.functions[e.function_id]
        values = trace.values(e)
        fields = () if values is None else tuple(sorted(
            (name, _as_text(kinds[name], v)) for name, v in values.items()))
        calls.append(Call(row.name, os.path.basename(row.unit or ""),
                          "entry" if e.phase == PHASE_ENTRY else "exit", e.tid, e.depth,
                          slots[e.function_id], e.object, e.retval, fields))
    return calls


def restrict_fields(calls: list[Call], names: set) -> list[Call]:
    """The calls with only the named fields (the log has every field, a trace only its
    mini struct's)."""
    return [Call(c.function, c.unit, c.phase, c.tid, c.depth, c.slot, c.object, c.ret,
                 tuple((k, v) for k, v in c.fields if k in names)) for c in calls]


def by_thread(calls: list[Call]) -> dict[int, list[Call]]:
    out: dict[int, list[Call]] = defaultdict(list)
    for c in calls:
        out[c.tid].append(c)
    return dict(out)


def differences(expected: list[Call], got: list[Call], limit: int = 5) -> list[str]:
    """Human-readable differences between two call sequences of one thread."""
    out = []
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            what = []
            for attr in ("function", "unit", "phase", "depth", "slot", "object", "ret"):
                if getattr(e, attr) != getattr(g, attr):
                    what.append(f"{attr}: log {getattr(e, attr)!r} trace {getattr(g, attr)!r}")
            ef, gf = dict(e.fields), dict(g.fields)
            for k in sorted(set(ef) | set(gf)):
                if ef.get(k) != gf.get(k):
                    what.append(f"{k}: log {ef.get(k)!r} trace {gf.get(k)!r}")
            out.append(f"#{i} {e.brief()}: " + "; ".join(what))
            if len(out) >= limit:
                break
    if len(expected) != len(got):
        out.append(f"log has {len(expected)} calls, trace {len(got)}")
    return out

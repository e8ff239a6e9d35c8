"""``--watch``: follows the objects a recording admits with the CPU's write breakpoints.

`Watcher` runs in the process that drains the ring buffer.  It reads the header of
every event batch (`events`): an object's first event admits it (a kernel trace's
events are only of the objects the probes admitted; a program's are of every object it
touched), and it remembers the latest snapshot of the watched fields.  `service`, called
after every poll, arms the plan's words (`ctracer.plan.watch.WatchPlan`) on objects
waiting, as many at once as the debug registers hold, newest admitted first: on each
thread of the object's process (a program: breakpoints follow a task) or on every CPU
(the kernel).  An armed object is left, and its breakpoints moved to the next waiting
object, when its life ends (the exit of a function whose exit ends lives, a tracepoint's
ending rule, or, in a program without creation functions or rules, the exit of a
free-like function on it) or once it has had `WatchPlan.budget` writes while another
object waits.

Each trapped write (`on_write`, from the writes' ring buffer) is matched to the object
and field armed at its address at its time, its value cut to the field's bytes, and its
old value taken from the last write seen, else from the object's memory at arming
(a program: /proc/PID/mem), else from its last snapshot: a write storing the value the
field held is kept and marked ``unchanged``.  Rows go to the trace file
(`ctracer.writes`) at every commit; `finish` disarms, resolves the code addresses
(`ctracer.debuginfo.code` for the program's DWARF; kallsyms for the kernel) and says
what the watch cost in the meta ``watch``.
"""

from __future__ import annotations

import statistics
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

from ctracer import write_event
from ctracer.tracefile import writes
from ctracer.event import FLAG_READ_FAILED, HEADER, PHASE_ENTRY, PHASE_TRACEPOINT, SCALARS, \
    Layout, args_offset, mini_offset
from ctracer.plan.lifetime_rules import FREE_LIKE
from ctracer.plan.watch import WatchPlan, WatchWord
from ctracer.record.breakpoints import Breakpoint, BreakpointRefused, online_cpus, threads_of
from ctracer.record.write_sites import ProcessMaps

#: admitted objects remembered while waiting for breakpoints (the oldest are forgotten)
MAX_WAITING = 4096


@dataclass
class _Armed:
    object: int
    pid: int
    admitted_ns: int
    armed_ns: int
    breakpoints: list = field(default_factory=list)
    last: dict = field(default_factory=dict)      # word offset -> last value seen
    writes: int = 0
    disarmed_ns: Optional[int] = None
    ended: str = ""


class Watcher:
    """Arms the plan's write breakpoints on the objects a recording admits, and turns the
    writes they trap into `Write` rows."""

    def __init__(self, plan: WatchPlan, program, prog_fd: int, *, kernel: bool):
        self.plan = plan
        self.kernel = kernel
        self.prog_fd = prog_fd
        self.mini: Layout = program.mini
        self.size = None
        self.start = mini_offset(program.mini, program.nargs)
        self.nargs = program.nargs
        self._header: Optional[struct.Struct] = None
        self._order: list[str] = []
        names = {f.name for f in program.mini.fields}
        #: the watched fields the snapshot carries (old values from the last snapshot)
        self.snapshot_fields = [w for w in plan.words if w.field in names]
        self.signed = {f.name: f.ctype.startswith("s") for f in program.mini.fields}
        rows = list(program.rows)
        ending = {r.function for r in getattr(program, "rules", ()) if r.probe == "function"}
        self.ending_rows = {r.id for r in rows if r.name in ending and r.route_kind == "direct"}
        self.tracepoint_rules: dict[int, list] = {}
        by_name = {r.name: r.id for r in rows if r.route_kind == "tracepoint"}
        for rule in getattr(program, "rules", ()):
            if rule.probe != "function" and rule.effect == "ends" and rule.function in by_name:
                self.tracepoint_rules.setdefault(by_name[rule.function], []).append(rule)
        self.args = program.args_by_row() if self.tracepoint_rules else {}
        has_creators = any(r.route_kind == "returns" for r in rows)
        self.free_rows = set() if (has_creators or getattr(program, "rules", ())
                                   or self.ending_rows) else \
            {r.id for r in rows if FREE_LIKE.search(r.name)}
        self.waiting: "OrderedDict[int, tuple[int, int]]" = OrderedDict()
        self.seen: set[int] = set()
        self.done: set[int] = set()
        self.snapshots: dict[int, dict] = {}
        self.armed: list[_Armed] = []
        self.history: list[_Armed] = []          # every arming, for matching late writes
        self.pending: list[writes.Write] = []
        self.pending_arms: list[_Armed] = []
        self.refused: dict[str, int] = {}
        self.count = self.unchanged = self.unmatched = 0
        self.first_ns: Optional[int] = None
        self.last_ns: Optional[int] = None
        self.arm_seconds: list[float] = []
        self.maps = ProcessMaps()
        self._tables = False
        self._fields = [HEADER.field(n) for n in ("ts_ns", "object", "pid", "tid",
                                                   "function_id", "phase", "flags")]

    # -- events --------------------------------------------------------------

    def events(self, batch: bytes, size: int) -> None:
        """Take the header of each event of a batch (admissions, snapshots, ends)."""
        if self.size != size:
            self.size = size
            fields = sorted(self._fields, key=lambda f: f.offset)
            fmt, at, order = ["<"], 0, []
            for f in fields:
                fmt.append(f"{f.offset - at}x" if f.offset > at else "")
                fmt.append(SCALARS[f.ctype][0])
                at = f.offset + f.size
                order.append(f.name)
            fmt.append(f"{size - at}x")
            self._header = struct.Struct("".join(fmt))
            self._order = order
        order = self._order
        i_ts, i_obj, i_pid = order.index("ts_ns"), order.index("object"), order.index("pid")
        i_fid, i_phase, i_flags = (order.index("function_id"), order.index("phase"),
                                   order.index("flags"))
        ending = self.ending_rows | self.free_rows | set(self.tracepoint_rules)
        snapshots = bool(self.snapshot_fields)
        for at, values in zip(range(0, len(batch), size), self._header.iter_unpack(batch)):
            obj = values[i_obj]
            if not obj or values[i_flags] & FLAG_READ_FAILED:
                continue
            if obj not in self.seen and obj not in self.done:
                self.seen.add(obj)
                self.waiting[obj] = (values[i_pid], values[i_ts])
                if len(self.waiting) > MAX_WAITING:
                    old, _ = self.waiting.popitem(last=False)
                    self.snapshots.pop(old, None)
            if snapshots and (obj in self.waiting or self._armed_for(obj)):
                decoded = self.mini.decode(batch, at + self.start)
                self.snapshots[obj] = {w.field: decoded.get(w.field)
                                       for w in self.snapshot_fields}
            if values[i_fid] in ending and self._ends(dict(zip(order, values)), batch, at):
                self._end(obj, "its life ended")

    def _ends(self, h: dict, batch: bytes, at: int) -> bool:
        fid, phase = h["function_id"], h["phase"]
        if phase == PHASE_TRACEPOINT:
            rules = self.tracepoint_rules.get(fid)
            if not rules:
                return False
            raw = struct.unpack_from(f"<{self.nargs}Q", batch, at + args_offset())
            spec = self.args.get(fid, ())
            args = {a.name: a.value(v) for a, v in zip(spec, raw)}
            return any(r.param_index < len(raw) and raw[r.param_index] == h["object"]
                       and r.applies(args) for r in rules)
        if phase == PHASE_ENTRY:
            return False
        return fid in self.ending_rows or fid in self.free_rows

    def _armed_for(self, obj: int) -> Optional[_Armed]:
        for a in self.armed:
            if a.object == obj:
                return a
        return None

    def _end(self, obj: int, why: str) -> None:
        self.waiting.pop(obj, None)
        self.seen.discard(obj)   # the address may come back as another object
        self.done.discard(obj)
        self.snapshots.pop(obj, None)
        armed = self._armed_for(obj)
        if armed is not None:
            self._disarm(armed, why)

    # -- arming ----------------------------------------------------------------

    def service(self) -> None:
        """Arm waiting objects into free places; leave over-budget ones if others wait."""
        if self.waiting:
            for a in list(self.armed):
                if a.writes >= self.plan.budget:
                    self._disarm(a, f"budget of {self.plan.budget} writes")
        while self.waiting and len(self.armed) < self.plan.objects_at_once:
            obj, (pid, admitted) = self.waiting.popitem(last=True)
            self._arm(obj, pid, admitted)

    def _arm(self, obj: int, pid: int, admitted_ns: int) -> None:
        armed = _Armed(obj, pid, admitted_ns, 0)
        places = [dict(cpu=c) for c in online_cpus()] if self.kernel else \
            [dict(tid=t) for t in threads_of(pid)]
        if not places:
            return   # the process has gone
        try:
            for w in self.plan.words:
                for where in places:
                    armed.breakpoints.append(Breakpoint(self.prog_fd, obj + w.offset,
                                                        w.length, **where))
        except BreakpointRefused as e:
            for bp in armed.breakpoints:
                bp.close()
            self.refused[e.strerror] = self.refused.get(e.strerror, 0) + 1
            self.done.add(obj)
            return
        armed.armed_ns = time.monotonic_ns()
        if not self.kernel and pid not in self.maps.maps:
            self.maps.read(pid)
        self.arm_seconds.append((armed.armed_ns - admitted_ns) / 1e9)
        armed.last = self._values_now(armed)
        self.armed.append(armed)
        self.history.append(armed)
        self.done.add(obj)

    def _values_now(self, armed: _Armed) -> dict:
        """Each word's value at arming: a program's memory, else the last snapshot."""
        out = {}
        if not self.kernel:
            try:
                with open(f"/proc/{armed.pid}/mem", "rb") as mem:
                    for w in self.plan.words:
                        mem.seek(armed.object + w.offset)
                        out[w.offset] = self._field_value(w, int.from_bytes(
                            mem.read(w.length), "little"))
                return out
            except (OSError, ValueError):
                pass
        snap = self.snapshots.get(armed.object, {})
        for w in self.plan.words:
            if snap.get(w.field) is not None and w.length >= w.field_size:
                out[w.offset] = snap[w.field]
        return out

    def _disarm(self, armed: _Armed, why: str) -> None:
        for bp in armed.breakpoints:
            bp.close()
        armed.breakpoints = []
        armed.disarmed_ns = time.monotonic_ns()
        armed.ended = why
        self.armed.remove(armed)
        self.pending_arms.append(armed)

    # -- writes ----------------------------------------------------------------

    def _field_value(self, w: WatchWord, word_value: int) -> int:
        """The field's bytes of a word's value, signed where the field is."""
        lo = max(w.field_offset, w.offset) - w.offset
        hi = min(w.field_offset + w.field_size, w.offset + w.length) - w.offset
        value = (word_value >> (8 * lo)) & ((1 << (8 * (hi - lo))) - 1)
        bits = 8 * (hi - lo)
        if self.signed.get(w.field) and value >= 1 << (bits - 1):
            value -= 1 << bits
        return value

    def _match(self, addr: int, ts: int) -> Optional[tuple[_Armed, WatchWord]]:
        for armed in reversed(self.history):
            if armed.armed_ns and armed.armed_ns - 5_000_000 > ts:
                continue
            if armed.disarmed_ns is not None and ts > armed.disarmed_ns:
                continue
            for w in self.plan.words:
                if armed.object + w.offset == addr:
                    return armed, w
        return None

    def on_write(self, raw: bytes) -> None:
        r = write_event.decode(raw)
        found = self._match(r.addr, r.ts_ns)
        if found is None:
            self.unmatched += 1
            return
        armed, w = found
        value = None if r.flags & write_event.WRITE_READ_FAILED else \
            self._field_value(w, r.value & ((1 << (8 * w.length)) - 1))
        old = armed.last.get(w.offset)
        unchanged = value is not None and old is not None and value == old
        armed.last[w.offset] = value
        armed.writes += 1
        self.count += 1
        self.unchanged += unchanged
        self.first_ns = r.ts_ns if self.first_ns is None else self.first_ns
        self.last_ns = r.ts_ns
        self.pending.append(writes.Write(r.ts_ns, r.cpu, r.pid, r.tid, armed.object, w.field,
                                         w.offset, w.length, r.ip, value, old, unchanged,
                                         r.stack))

    def flush(self, db) -> None:
        """Put the writes and finished armings into the trace file (committed with the
        events by the caller; the tables made on the first call)."""
        if not self._tables:
            writes.create(db)
            self._tables = True
        if self.pending:
            rows, self.pending = self.pending, []
            writes.add_writes(db, rows)
        if self.pending_arms:
            done, self.pending_arms = self.pending_arms, []
            writes.add_arms(db, [writes.Arm(a.object, a.pid, a.admitted_ns, a.armed_ns,
                                            a.disarmed_ns, a.writes, a.ended) for a in done])

    def close(self) -> None:
        """Disarm every breakpoint (the recording ended)."""
        for a in list(self.armed):
            self._disarm(a, "the recording ended")

    # -- the end ---------------------------------------------------------------

    def summary(self, seconds: float, lost: int, program_stats: Optional[tuple[int, int]]
                ) -> dict:
        objects = len(self.history)
        delays = sorted(self.arm_seconds)
        out = {
            "words": len(self.plan.words), "fields": self.plan.fields,
            "objects": objects, "writes": self.count, "unchanged": self.unchanged,
            "unmatched": self.unmatched, "lost": lost,
            "writes_per_second": round(self.count / seconds, 1) if seconds > 0 else None,
            "arm_delay_ms": ({"median": round(statistics.median(delays) * 1e3, 2),
                              "max": round(delays[-1] * 1e3, 2)} if delays else None),
            "refused": self.refused,
        }
        if program_stats and program_stats[1]:
            out["program_ns_per_write"] = round(program_stats[0] / program_stats[1])
            out["program_runs"] = program_stats[1]
        return out


def summary_line(watch: dict) -> str:
    """One line of the recording's summary (`ctracer.record.recorder.summary_lines`)."""
    delay = watch.get("arm_delay_ms") or {}
    cost = (f", {watch['program_ns_per_write']} ns of BPF program a write"
            if watch.get("program_ns_per_write") else "")
    refused = watch.get("refused") or {}
    line = (f"watch: {watch['words']} word{'s' if watch['words'] != 1 else ''} "
            f"({', '.join(watch['fields'])}) on {watch['objects']} object"
            f"{'s' if watch['objects'] != 1 else ''}: {watch['writes']} writes "
            f"({watch['unchanged']} left the value unchanged"
            f"{', ' + str(watch['lost']) + ' lost' if watch.get('lost') else ''}), "
            f"{watch['writes_per_second'] or 0:g}/s{cost}")
    if delay:
        line += f"; armed {delay['median']:g} ms after admission (median, max {delay['max']:g})"
    if refused:
        line += "; refused: " + "; ".join(f"{n}x {why}" for why, n in refused.items())
    if watch["objects"] and not watch["writes"]:
        line += ("; no write trapped while they were armed: the fields were not written "
                 "then, or this machine does not deliver the breakpoints (seen for kernel "
                 "addresses on a virtual machine whose kernel accepts them)")
    return line

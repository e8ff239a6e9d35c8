"""``ctracer trace --tail``: one line per event as it arrives, while the trace file is
written as usual (what nfs_trace's reader and bpftrace users expect).

A line is: seconds since the first event, the object as the report names it (its
address, ``0x…-2`` for the address's second lifetime: `ctracer.record.live_objects`
counts lifetimes by the report's rules as events arrive), the function (a tracepoint
as ``tp:NAME`` with its arguments by name), entry/exit, and the fields it changed since
the object's previous event, ``old → new`` (the first event of an object shows none:
there is nothing to compare with, nor has the first event of a new lifetime, and a hit
or a function's exit a rule says ends one is the last compared with).  A store a
tracepoint announces before it happens (`ctracer.plan.stores`) is shown on the
announcing hit, ``old → new (announced)``, as the report shows it.  Values are shown by
the ``formatter`` the command passes (`ctracer.report.values.ValueFormatter`: TCP
states, flag bits, addresses and devices by name), else as raw numbers.

Lines come in time order, as the report lists events: the ring buffer holds events in
the order they were reserved, and a CPU stamps its event's time after reserving it, so
an event can arrive after one another CPU stamped later (by any delay: a virtual CPU
may be descheduled between the two).  Arriving events wait in a heap; the reader says
until when every event stamped has arrived (`ctracer.record.bpf_runtime`: a read that
left no record reserved before it in the ring), and those are printed, earliest first.
Where that is not known (libbpf's consumer, or a ring that never empties), an event is
printed once it has waited `MAX_WAIT_NS` by the kernel's monotonic clock (the one that
stamps events).
"""

from __future__ import annotations

import heapq
import sys
import time
from typing import Any, Optional, Protocol, TextIO

from ctracer.plan import stores
from ctracer.host import kallsyms
from ctracer.record.live_objects import LiveObjects
from ctracer.event import (FLAG_HEAD_ONLY, FLAG_READ_FAILED, HEADER, PHASE_ENTRY,
                           PHASE_NAMES, PHASE_TRACEPOINT, args_offset, mini_offset)

#: changed fields shown on one line before the rest is counted
MAX_CHANGES_SHOWN = 8
#: the longest an event waits to be printed (ns) when the reader cannot say that every
#: event stamped before it has arrived
MAX_WAIT_NS = 1_000_000_000


class Formatter(Protocol):
    """What ``--tail`` needs to show a field's or a tracepoint argument's value."""

    def show(self, field: str, value: Any) -> str:
        """A field's value as shown."""

    def show_arg(self, name: str, value: Any, kind: Any = None, row: Any = None) -> str:
        """A tracepoint argument's value as shown (``row``: its function row)."""


class _Raw:
    def show(self, field: str, value: Any) -> str:
        return str(value)

    def show_arg(self, name: str, value: Any, kind: Any = None, row: Any = None) -> str:
        return str(value)


class Tail:
    """A ring buffer callback printing each event on one line."""

    def __init__(self, program, out: Optional[TextIO] = None,
                 formatter: Optional[Formatter] = None,
                 announced: Optional[dict[str, stores.Announced]] = None):
        self.out = out or sys.stdout
        self.fmt = formatter or _Raw()
        self.mini = program.mini
        self.nargs = program.nargs
        self.start = mini_offset(self.mini, self.nargs)
        self.names = {r.id: (f"tp:{r.name}" if r.route_kind == "tracepoint" else r.name)
                      for r in program.rows}
        self.args = program.args_by_row()
        self.tracepoint_names = {r.id: r.name for r in program.rows if r.route_kind == "tracepoint"}
        #: tracepoint name -> the lifetime rules naming it, the store it announces
        self.rules: dict[str, list] = {}
        ending = set()
        for rule in getattr(program, "rules", ()):
            if rule.probe == "function":
                ending.add(rule.function)
            else:
                self.rules.setdefault(rule.function, []).append(rule)
        #: rows of functions whose exit ends the object's life (a function's rule)
        self.ending_rows = {r.id for r in program.rows
                            if r.name in ending and r.route_kind == "direct"}
        #: which lifetime of its address each event's object is, named as the report names it
        self.objects = LiveObjects(program.rows, self.ending_rows,
                                   has_rules=bool(getattr(program, "rules", ())))
        self.announced = announced or {}
        self._kallsyms = None
        head = getattr(program, "head", None)
        #: the fields an event that read only the object's head carries, and the head
        self.head_fields = frozenset(head.fields) if head is not None else frozenset()
        self.head_member = head.member if head is not None else "the head"
        #: the head fields naming a head-only object (a time-wait socket's connection)
        self.identity = tuple(getattr(head, "identity", ()) or ()) if head is not None else ()
        self.last: dict[int, dict] = {}
        self.first_ns: Optional[int] = None
        #: events waiting to be printed: (time, arrival number, bytes), a heap
        self._waiting: list[tuple[int, int, bytes]] = []
        self._arrived = 0
        self._time = HEADER.field("ts_ns")

    def line(self, raw: bytes) -> str:
        h = HEADER.decode(raw)
        if self.first_ns is None:
            self.first_ns = h["ts_ns"]
        obj, fid, phase = h["object"], h["function_id"], h["phase"]
        what = self.names.get(fid, f"#{fid}")
        kind = PHASE_NAMES[phase]
        objects = self.objects
        objects.event(row=fid, phase=kind, tid=h["tid"], flags=h["flags"])
        new = objects.seen(obj, row=fid, phase=kind) if obj else False
        parts = [f"{(h['ts_ns'] - self.first_ns) / 1e9:12.6f}", "", what]
        args: dict[str, Any] = {}
        ends = False
        announced = None
        if phase == PHASE_TRACEPOINT:
            spec = self.args.get(fid, ())
            if spec:
                import struct
                raw_args = struct.unpack_from(f"<{self.nargs}Q", raw, args_offset())
                args = {a.name: a.value(v) for a, v in zip(spec, raw_args)}
                name = self.tracepoint_names.get(fid, "")
                announced = self.announced.get(name)
                if obj and announced is not None and announced.before \
                        and fid not in objects.held:
                    new = objects.announced(obj, args.get(announced.before),
                                            args.get(announced.argument)) or new
                for rule in self.rules.get(name, ()):
                    if not (obj and rule.param_index < len(raw_args)
                            and raw_args[rule.param_index] == obj and rule.applies(args)):
                        continue
                    if rule.effect == "starts":
                        new = objects.start(obj) or new
                    elif rule.effect == "ends":
                        ends = objects.end(obj) or ends
                show = self.fmt.show_arg
                parts.append("(" + ", ".join(
                    f"{a.name}={self._pointer(a.name, a.value(v))}" if a.kind == "pointer" else
                    f"{a.name}={show(a.name, a.value(v), a.kind, fid)}"
                    for a, v in zip(spec, raw_args)) + ")")
        else:
            parts.append("entry" if phase == PHASE_ENTRY else f"exit ret={h['retval']}")
            if phase != PHASE_ENTRY and fid in objects.creators and h["retval"]:
                returned = h["retval"] & 0xFFFFFFFFFFFFFFFF
                if returned < 0xFFFFFFFFFFFFF001:  # not an ERR_PTR
                    new = objects.returned(returned) or new
            if phase != PHASE_ENTRY and fid in self.ending_rows and obj:
                ends = objects.exit_ends(obj)
        comm = "".join(c if c.isprintable() and c != " " else "?" for c in h["comm"])
        parts.append(f"{comm}[{h['pid']}]")
        if h["flags"] & FLAG_READ_FAILED:
            parts.append("(object unreadable)")
        else:
            values = self.mini.decode(raw, self.start)
            head_only = h["flags"] & FLAG_HEAD_ONLY
            if head_only and obj and self.identity \
                    and all(n in values for n in self.identity):
                new = objects.identity(obj, tuple(values[n] for n in self.identity)) or new
            before = None if new else self.last.get(obj)  # never across lifetimes
            if head_only:
                parts.append(f"(only {self.head_member} read)")
                values = {k: v for k, v in values.items() if k in self.head_fields}
                if before is not None:  # the fields not read keep their last value read
                    values = {**before, **values}
            show = self.fmt.show
            changed = []
            if before is not None:
                changed = [f"{k}: {show(k, before[k])} → {show(k, v)}"
                           for k, v in values.items() if k in before and before[k] != v]
            if announced is not None and announced.field in values:
                values = dict(values)
                done = stores.apply(announced, values, args)
                if done is not None:
                    changed.insert(0, f"{announced.field}: {show(announced.field, done[0])}"
                                      f" → {show(announced.field, done[1])} (announced)")
            if ends:
                self.last.pop(obj, None)  # the address is a new object from its next hit
            else:
                self.last[obj] = values
            if changed:
                shown = changed[:MAX_CHANGES_SHOWN]
                if len(changed) > len(shown):
                    shown.append(f"… {len(changed) - len(shown)} more")
                if shown:
                    parts.append("| " + ", ".join(shown))
        parts[1] = objects.event_name(obj, row=fid, phase=kind)
        return " ".join(parts)

    def _pointer(self, name: str, value: int) -> str:
        """A pointer argument in hex; a code address (``location``) as symbol+off."""
        if name in kallsyms.TEXT_ARGUMENTS and value:
            if self._kallsyms is None:
                self._kallsyms = kallsyms.Kallsyms()
            text = self._kallsyms.name(value)
            if text:
                return f"{text} ({value:#x})"
        return f"{value:#x}"

    def __call__(self, raw: bytes) -> None:
        """Take an event as it arrives; it is printed by `release`."""
        ts = int.from_bytes(raw[self._time.offset:self._time.offset + 8], "little")
        heapq.heappush(self._waiting, (ts, self._arrived, raw))
        self._arrived += 1

    def release(self, final: bool = False, delivered_before_ns: Optional[int] = None) -> None:
        """Print, earliest first, the events stamped at or before ``delivered_before_ns``
        (until when every event stamped has arrived) or that have waited `MAX_WAIT_NS`;
        ``final``: every one."""
        waiting = self._waiting
        limit = None if final else max(delivered_before_ns or 0,
                                       time.monotonic_ns() - MAX_WAIT_NS)
        lines = []
        while waiting and (limit is None or waiting[0][0] <= limit):
            lines.append(self.line(heapq.heappop(waiting)[2]) + "\n")
        if lines:
            self.out.write("".join(lines))
            self.out.flush()

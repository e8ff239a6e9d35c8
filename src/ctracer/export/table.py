"""A trace file as one columnar table: one row per event, in time order.

The columns (`EVENT_COLUMNS`, `DERIVED_COLUMNS`, `TRACE_COLUMNS`; their types in exports:
`ctracer.export.schema`):

* the event: ``time_ns``, ``cpu``, ``pid``, ``tid``, ``comm``, ``function`` (tracepoints
  as ``tp:NAME``), ``phase`` (``entry``, ``exit``, ``tracepoint``), ``object`` (hex
  address, null when the event has none), ``lifetime`` (1 for the first object at an
  address, 2 after it was handed out again…, 0 without object), ``depth`` (open traced
  calls of the thread around the event), ``ret`` (the return value on exits of
  functions that return one), ``args`` (a tracepoint's arguments by name, as JSON;
  pointers as hex strings, ``"0xffff…"``, which jq and JavaScript keep exact);
* what the report derives: ``changed`` (the fields whose value differs from the
  object's previous snapshot) and ``changed_by`` (the function that made those changes:
  the exiting function, or at an entry the traced caller; at a tracepoint hit with no
  traced call running, the tracepoint that announced or showed them, ``tp:NAME``; null
  otherwise), ``unreadable`` (the probe could not read the object);
* the snapshot: one column per mini-struct field, named by its dotted member path as
  ``ctracer struct --mini`` prints it (``__sk_common.skc_state``; ``fields.PATH`` where
  the path is one of the names above, e.g. task_struct's ``pid``), raw values (null when
  the object could not be read);
* the trace: ``host``, ``kernel``, ``struct``, ``trace_id``.

Rows, objects, lifetimes, depths and changes come from the analysis stage
(`ctracer.analysis`), as the report's do: an event a call recorded twice (two ways to
one object) appears once, as in the report.  The snapshot columns are decoded from the
raw bytes of all events at once with a numpy structured dtype built from the event
layout (`ctracer.event.Layout.numpy_dtype`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

import numpy as np

from ctracer.analysis import Analysis
from ctracer.event import FLAG_HEAD_ONLY, FLAG_READ_FAILED, PHASE_EXIT, Layout, array_value

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: the event columns, in order (the snapshot's field columns and the trace columns follow)
EVENT_COLUMNS = ("time_ns", "cpu", "pid", "tid", "comm", "function", "phase", "object",
                 "lifetime", "depth", "ret", "args")
DERIVED_COLUMNS = ("changed", "changed_by", "unreadable")
TRACE_COLUMNS = ("host", "kernel", "struct", "trace_id")


@dataclass
class EventTable:
    """The table and what describes it."""

    table: "pa.Table"
    fields: dict[str, str]     # snapshot field path -> its column, in offset order
    trace_columns: dict[str, str]  # host, kernel, struct, trace_id
    incomplete: Optional[str]  # `Trace.incomplete`
    struct_name: str
    layout: Optional[Layout] = None  # the trace's mini layout: each field's kind

    def with_host(self, host: str) -> "EventTable":
        """The same table with ``host`` in its host column (`ctracer export --host`)."""
        import numpy as np
        column = self.table.column_names.index("host")
        zeros = np.zeros(self.table.num_rows, np.int32)
        table = self.table.set_column(column, "host", _dictionary(zeros, [host]))
        return dataclasses.replace(self, table=table,
                                   trace_columns={**self.trace_columns, "host": host})


def trace_id(a: Analysis) -> str:
    """The trace's id (`ctracer.tracefile.TraceMeta.trace_id`)."""
    return a.meta.trace_id


def column_name(field: str) -> str:
    """A snapshot field's column: its dotted path, or ``fields.PATH`` where the path
    is also the name of an event or trace column (task_struct has ``pid`` and ``comm``)."""
    taken = EVENT_COLUMNS + DERIVED_COLUMNS + TRACE_COLUMNS
    return f"fields.{field}" if field in taken else field


def _dictionary(indices, values: list[str], mask=None) -> "pa.Array":
    import pyarrow as pa
    return pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int32(), mask=mask), pa.array(values, type=pa.string()))


def function_names(a: Analysis) -> dict[int, str]:
    """Display name per function id; tracepoints as ``tp:NAME``."""
    out = {}
    for f in a.summary.functions:
        canon = a.canonical.get(f.id, f.id)
        out[canon] = f"tp:{f.name}" if f.route_kind == "tracepoint" else a.function_name(canon)
    return out


def _snapshot_columns(a: Analysis, rows: slice, valid,
                      head_only=None) -> tuple[list[str], list]:
    """Every mini field as a column, decoded from the snapshots of ``rows`` at once; null
    where the object was not read, and, in rows that read only its head
    (``head_only``), for the fields outside the head."""
    import numpy as np
    import pyarrow as pa

    mini = a.layout
    if not mini.fields:
        return [], []
    decoded = a.snapshots[rows].reshape(-1).view(mini.numpy_dtype()) if mini.size else \
        np.zeros(len(valid), mini.numpy_dtype())
    names, arrays = [], []
    head = a.head_fields or frozenset()
    for f in mini.ordered_fields:
        invalid = ~valid if head_only is None or f.name in head else ~valid | head_only
        column = decoded[f.name]
        if column.dtype.kind == "S":  # char[N]: text up to the first NUL
            uniques, inverse = np.unique(column, return_inverse=True)
            texts = [array_value(f.kind, u) for u in uniques.tolist()]
            array = _dictionary(inverse.astype(np.int32), texts, invalid).cast(pa.string())
        else:
            array = pa.array(np.ascontiguousarray(column), mask=invalid)
        names.append(f.name)
        arrays.append(array)
    return names, arrays


def _pointer_arguments(a: Analysis) -> dict[int, frozenset[str]]:
    """Per functions-table row, the names of its arguments that are pointers (meta
    ``tracepoint_args``)."""
    found = a.meta.tracepoint_args
    out = {}
    for row, spec in (found.items() if isinstance(found, dict) else ()):
        if str(row).isdigit() and isinstance(spec, list):
            names = frozenset(str(a.get("name")) for a in spec
                              if isinstance(a, dict) and a.get("kind") == "pointer")
            if names:
                out[int(row)] = names
    return out


def _hex_pointers(args: Optional[str], pointers: Optional[frozenset[str]]) -> Optional[str]:
    """A hit's arguments (JSON text) with its pointers as hex strings (``"0xffff…"``):
    64-bit addresses as JSON numbers lose digits in jq and JavaScript."""
    if args is None or not pointers:
        return args
    try:
        values = json.loads(args)
    except ValueError:
        return args
    if not isinstance(values, dict):
        return args
    for name in pointers & values.keys():
        if isinstance(values[name], int):
            values[name] = f"0x{values[name] & 0xFFFFFFFFFFFFFFFF:x}"
    return json.dumps(values, separators=(",", ":"))


def changed_lists(a: Analysis, rows: slice = slice(None)) -> tuple[list, list]:
    """Per event of ``rows``, the fields it changed (None: none) and who is credited
    for them."""
    ch = a.changes
    names = [f.name for f in a.layout.fields]
    start, end = a.change_rows(rows)
    changed: list = [None] * len(start)
    changed_by: list = [None] * len(start)
    for i in np.flatnonzero(end > start).tolist():
        lo, hi = int(start[i]), int(end[i])
        changed[i] = [names[j] for j in ch.field[lo:hi].tolist()]
        changed_by[i] = a.credited(lo)
    return changed, changed_by


#: rows an export writes at a time (`event_tables`): its memory beyond the analysis
#: stays bounded whatever the trace's size
BATCH_ROWS = 1 << 18
#: what one row of a batch costs while it is written, in bytes per byte of the event's
#: row in the trace (its snapshot and `ctracer.analysis.passes.ROW_BYTES`): the decoded
#: fields, their int64 copies in the export schema, masks and dictionaries, and for JSON
#: Lines the text DuckDB makes (struct sock's 408-byte snapshot: ~3.2 KB a line, written
#: to a scratch file whose dirty pages count against a memory limit too)
BATCH_BYTES_PER_ROW_BYTE = 8
#: the share of a memory limit one batch may take (the analysis holds the rest)
BATCH_SHARE_OF_LIMIT = 1 / 8
#: the fewest rows of a batch under any limit
MIN_BATCH_ROWS = 1 << 12


def rows_at_once(a: Analysis) -> int:
    """How many rows an export writes at a time: `BATCH_ROWS` without a memory limit (so
    an export's files do not depend on the machine), under one as many as
    `BATCH_SHARE_OF_LIMIT` of it holds at `BATCH_BYTES_PER_ROW_BYTE` (a kernel trace of
    every field of sock in 1 GB: about 35,000 rows; a user-space struct of a few fields keeps
    the analysis' slice, `ctracer.analysis.memory.at_once`)."""
    from ctracer.analysis.memory import at_once, memory_limit
    from ctracer.analysis.passes import ROW_BYTES

    rows = at_once(BATCH_ROWS)
    limit = memory_limit()
    if not limit:
        return rows
    per_row = BATCH_BYTES_PER_ROW_BYTE * (a.layout.size + ROW_BYTES)
    return max(MIN_BATCH_ROWS, min(rows, int(limit * BATCH_SHARE_OF_LIMIT) // per_row))


def event_table(a: Analysis) -> EventTable:
    """The whole trace as one `EventTable` (``a`` loaded with its snapshots)."""
    return next(event_tables(a, batch_rows=max(1, len(a.events))))


def event_tables(a: Analysis, batch_rows: int = BATCH_ROWS) -> Iterator[EventTable]:
    """The trace as `EventTable`s of ``batch_rows`` consecutive rows each, in time order
    (at least one, empty for a trace without events), made from the analysis' columns
    as they are written: the exports stream them (``a`` loaded with its snapshots)."""
    rows = _Rows(a)
    n = len(a.events)
    for lo in range(0, max(n, 1), batch_rows):
        yield rows.table(slice(lo, min(n, lo + batch_rows)))


class _Rows:
    """What every batch of rows shares: dictionaries of names, lifetimes per object,
    the trace's columns."""

    def __init__(self, a: Analysis):
        self.a = a
        ev = a.events
        names = function_names(a)
        fid_list = sorted(names)
        index_of = {f: i for i, f in enumerate(fid_list)}
        self.function_index = np.array(
            [index_of.get(f, 0) for f in range(int(ev.function.max(initial=0)) + 1)], np.int32)
        self.function_names = [names[f] for f in fid_list]
        self.tracepoint = np.array([a.route_kind.get(s) == "tracepoint" for s in range(
            int(ev.function_row.max(initial=0)) + 1)], bool)
        self.lifetimes = np.array([k.lifetime for k in a.objects.keys], np.int32)
        self.comm_values = sorted(set(ev.comms[c] for c in np.unique(ev.comm).tolist()))
        comm_index = {c: i for i, c in enumerate(self.comm_values)}
        self.comm_remap = np.array([comm_index.get(c, 0) for c in ev.comms], np.int32)
        self.pointers = _pointer_arguments(a)
        self.texts: dict[tuple[int, int], Optional[str]] = {}
        self.constants = {"host": a.meta.host, "kernel": a.meta.kernel_release,
                          "struct": a.summary.struct_name, "trace_id": trace_id(a)}

    def args(self, function_rows: np.ndarray, args: np.ndarray) -> list:
        """Each row's arguments as JSON text with pointers in hex (None: none)."""
        a, texts, pointers = self.a, self.texts, self.pointers
        values = []
        for function_row, k in zip(function_rows.tolist(), args.tolist()):
            if k < 0:
                values.append(None)
                continue
            text = texts.get((function_row, k), False)
            if text is False:
                text = texts[(function_row, k)] = _hex_pointers(
                    a.events.args_texts[k], pointers.get(function_row))
            values.append(text)
        return values

    def table(self, rows: slice) -> EventTable:
        import pyarrow as pa

        a, ev = self.a, self.a.events
        n = len(ev.seq[rows])
        function_row, phase, flags = ev.function_row[rows], ev.phase[rows], ev.flags[rows]
        address, obj_of = ev.address[rows], ev.object[rows]
        lifetime = np.zeros(n, np.int32)
        placed = obj_of >= 0
        lifetime[placed] = self.lifetimes[obj_of[placed]]
        changed, changed_by = changed_lists(a, rows)
        function = _dictionary(self.function_index[ev.function[rows]] if n else
                               np.zeros(0, np.int32), self.function_names)
        tracepoint = self.tracepoint[function_row] if n else np.zeros(0, bool)
        phase_index = np.where(tracepoint, 2, np.where(phase == PHASE_EXIT, 1, 0)).astype(np.int32)
        phase_names = _dictionary(phase_index, ["entry", "exit", "tracepoint"])
        uniques, inverse = np.unique(address, return_inverse=True)
        obj = _dictionary(inverse.reshape(-1).astype(np.int32),
                          [f"0x{v:x}" for v in uniques.tolist()], address == 0)
        comm = _dictionary(self.comm_remap[ev.comm[rows]] if n else np.zeros(0, np.int32),
                           self.comm_values)
        has_retval = ev.has_retval[rows]
        ret = pa.array(np.where(has_retval, ev.retval[rows], 0), mask=~has_retval)
        args = pa.array(self.args(function_row, ev.args[rows]), pa.string())

        read_failed = (flags & FLAG_READ_FAILED) != 0
        valid = ~read_failed & a.has_snapshot[rows]
        head_only = (flags & FLAG_HEAD_ONLY) != 0
        field_names, field_arrays = _snapshot_columns(a, rows, valid,
                                                      head_only if head_only.any() else None)
        zeros = np.zeros(n, np.int32)
        columns = {
            "time_ns": pa.array(ev.ts_ns[rows]), "cpu": pa.array(ev.cpu[rows]),
            "pid": pa.array(ev.pid[rows]), "tid": pa.array(ev.tid[rows]), "comm": comm,
            "function": function, "phase": phase_names, "object": obj,
            "lifetime": pa.array(lifetime), "depth": pa.array(ev.depth[rows]),
            "ret": ret, "args": args,
            "changed": pa.array(changed, pa.list_(pa.string())),
            "changed_by": pa.array(changed_by, pa.string()),
            "unreadable": pa.array(read_failed & (address != 0)),
        }
        fields = {name: column_name(name) for name in field_names}
        for name, array in zip(field_names, field_arrays):
            columns[fields[name]] = array
        for name, value in self.constants.items():
            columns[name] = _dictionary(zeros, [value])
        return EventTable(pa.table(columns), fields, dict(self.constants), a.incomplete,
                          a.summary.struct_name, a.layout)

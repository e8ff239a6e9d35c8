"""A trace file as one columnar table: one row per event, in time order.

The columns (`EVENT_COLUMNS`, `DERIVED_COLUMNS`, `TRACE_COLUMNS`; their types in exports:
`ctracer.export.schema`):

* the event: ``time_ns``, ``cpu``, ``pid``, ``tid``, ``comm``, ``function`` (tracepoints
  as ``tp:NAME``), ``probe`` (``entry``, ``exit``, ``tracepoint``), ``object`` (hex
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

Rows, objects, lifetimes, depths and changes come from the report stage's passes
(`ctracer.report.build`): an event a call recorded twice (two ways to one object)
appears once, as in the report.  The snapshot columns are decoded from the raw bytes of
all events at once with a numpy structured dtype built from the event layout
(`ctracer.event.Layout.numpy_dtype`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ctracer.event import FLAG_HEAD_ONLY, FLAG_READ_FAILED, PHASE_EXIT, Layout, array_value
from ctracer.report import build
from ctracer.report.snapshots import SnapshotColumn
from ctracer.tracefile import Trace

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: the event columns, in order (the snapshot's field columns and the trace columns follow)
EVENT_COLUMNS = ("time_ns", "cpu", "pid", "tid", "comm", "function", "probe", "object",
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


def trace_id(trace: Trace) -> str:
    """The trace's id (`Trace.trace_id`)."""
    return trace.trace_id


def column_name(field: str) -> str:
    """A snapshot field's column: its dotted path, or ``fields.PATH`` where the path
    is also the name of an event or trace column (task_struct has ``pid`` and ``comm``)."""
    taken = EVENT_COLUMNS + DERIVED_COLUMNS + TRACE_COLUMNS
    return f"fields.{field}" if field in taken else field


def _text(trace: Trace, key: str) -> str:
    v = trace.meta.get(key)
    if v is None:
        return ""
    try:
        d = json.loads(v)
    except ValueError:
        return v
    return d if isinstance(d, str) else v


def report_rows(trace: Trace):
    """The report stage's passes (`ctracer.report.build.run_passes`): rows (time order,
    one per event shown), their snapshots, and the function table."""
    passes = build.run_passes(trace)
    return passes.found.events.rows, passes.found.events.snapshots, passes.fns


def _dictionary(indices, values: list[str], mask=None) -> "pa.Array":
    import pyarrow as pa
    return pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int32(), mask=mask), pa.array(values, type=pa.string()))


def function_names(trace: Trace, fns) -> dict[int, str]:
    """Display name per function id; tracepoints as ``tp:NAME``."""
    out = {}
    for fid, f in trace.functions.items():
        canon = fns.canon.get(fid, fid)
        out[canon] = f"tp:{f.name}" if f.reach == "tracepoint" else fns.name(canon)
    return out


def _snapshot_columns(trace: Trace, snapshots: SnapshotColumn, valid,
                      head_only=None) -> tuple[list[str], list]:
    """Every mini field as a column, decoded from all snapshots at once; null where the
    object was not read, and, in rows that read only its head (``head_only``), for the
    fields outside the head."""
    import numpy as np
    import pyarrow as pa

    mini = trace.mini
    if not mini.fields:
        return [], []
    decoded = snapshots.table(mini)
    names, arrays = [], []
    head = trace.head_fields or frozenset()
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


def _pointer_arguments(trace: Trace) -> dict[int, frozenset[str]]:
    """Per functions-table row, the names of its arguments that are pointers (meta
    ``tracepoint_args``)."""
    found = trace.meta_json("tracepoint_args") or {}
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


def event_table(trace: Trace) -> EventTable:
    """The whole trace as an `EventTable`."""
    import numpy as np
    import pyarrow as pa

    rows, snapshots, fns = report_rows(trace)
    n = len(rows)
    names = function_names(trace, fns)
    reach = {fid: f.reach for fid, f in trace.functions.items()}

    # the report's values of each row (the one Python pass of the export)
    ts = np.fromiter((r.ts_ns for r in rows), np.int64, n)
    cpu = np.fromiter((r.cpu for r in rows), np.uint32, n)
    pid = np.fromiter((r.pid for r in rows), np.uint32, n)
    tid = np.fromiter((r.tid for r in rows), np.uint32, n)
    fid = np.fromiter((r.function_id for r in rows), np.int64, n)
    phase = np.fromiter((r.phase for r in rows), np.int8, n)
    tracepoint = np.fromiter((reach.get(r.slot) == "tracepoint" for r in rows), bool, n)
    address = np.fromiter((r.address & 0xFFFFFFFFFFFFFFFF for r in rows), np.uint64, n)
    lifetime = np.fromiter((r.obj.lifetime if r.obj else 0 for r in rows), np.int32, n)
    depth = np.fromiter((r.depth for r in rows), np.int32, n)
    flags = np.fromiter((r.flags for r in rows), np.uint8, n)
    rets = [r.retval for r in rows]
    comms = [r.comm for r in rows]
    changed = [[c.field for c in r.changes] if r.changes else None for r in rows]
    changed_by = [r.changes[0].credited if r.changes else None for r in rows]

    fid_list = sorted(names)
    index_of = {f: i for i, f in enumerate(fid_list)}
    function = _dictionary(np.array([index_of.get(f, 0) for f in fid.tolist()], np.int32)
                           if n else np.zeros(0, np.int32), [names[f] for f in fid_list])
    probe_index = np.where(tracepoint, 2, np.where(phase == PHASE_EXIT, 1, 0)).astype(np.int32)
    probe = _dictionary(probe_index, ["entry", "exit", "tracepoint"])
    uniques, inverse = np.unique(address, return_inverse=True)
    obj = _dictionary(inverse.astype(np.int32), [f"0x{a:x}" for a in uniques.tolist()],
                      address == 0)
    comm_values = sorted(set(comms))
    comm_index = {c: i for i, c in enumerate(comm_values)}
    comm = _dictionary(np.array([comm_index[c] for c in comms], np.int32), comm_values)
    has_ret = np.array([v is not None for v in rets], bool)
    ret = pa.array(np.array([v if v is not None else 0 for v in rets], np.int64),
                   mask=~has_ret)
    pointers = _pointer_arguments(trace)
    args = pa.array([_hex_pointers(r.args, pointers.get(r.slot)) for r in rows], pa.string())

    read_failed = (flags & FLAG_READ_FAILED) != 0
    valid = ~read_failed & snapshots.present_mask()
    head_only = (flags & FLAG_HEAD_ONLY) != 0
    field_names, field_arrays = _snapshot_columns(trace, snapshots, valid,
                                                  head_only if head_only.any() else None)

    host, kernel = _text(trace, "host"), _text(trace, "kernel_release")
    constants = {"host": host, "kernel": kernel, "struct": trace.struct_name,
                 "trace_id": trace_id(trace)}
    zeros = np.zeros(n, np.int32)
    columns = {
        "time_ns": pa.array(ts), "cpu": pa.array(cpu), "pid": pa.array(pid),
        "tid": pa.array(tid), "comm": comm, "function": function, "probe": probe,
        "object": obj, "lifetime": pa.array(lifetime), "depth": pa.array(depth),
        "ret": ret, "args": args,
        "changed": pa.array(changed, pa.list_(pa.string())),
        "changed_by": pa.array(changed_by, pa.string()),
        "unreadable": pa.array(read_failed & (address != 0)),
    }
    fields = {name: column_name(name) for name in field_names}
    for name, array in zip(field_names, field_arrays):
        columns[fields[name]] = array
    for name, value in constants.items():
        columns[name] = _dictionary(zeros, [value])
    table = pa.table(columns)
    return EventTable(table, fields, constants, trace.incomplete, trace.struct_name, trace.mini)

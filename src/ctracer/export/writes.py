"""The writes of ``--watch`` as a table beside an export's events: one row a write.

Columns: ``trace_id``, ``time_ns`` (ns since the trace's first event), ``object`` (its
name in the report and the events' ``object`` column), ``address`` (hex), ``field``,
``old`` and ``new`` (as the report shows them; old empty when unknown),
``unchanged``, ``writer`` (``file:line in fn`` where a line table said, else
``function+offset``), ``function``, ``offset``, ``file``, ``line``, ``inlined``,
``inlined_from`` (where that inlined function was inlined, and each outer one,
innermost first: ``file:line in fn, ...``), ``called_from`` (the callers, outermost first), ``cpu``, ``pid``, ``tid``.  Written as
``<output>.writes.jsonl``, ``.csv`` or ``.parquet`` beside the events' file.
"""

from __future__ import annotations

from typing import Optional

from ctracer.analysis import writes as watched
from ctracer.export.beside import write_beside


def writes_table(a, formatter=None):
    """A `pyarrow.Table` of the trace's writes, or None without any."""
    import pyarrow as pa

    view = watched.load(a)
    if view is None:
        return None
    from ctracer.export.table import trace_id
    show = formatter.show if formatter is not None else (lambda _f, v: str(v))
    labels = a.objects.labels
    rows: dict[str, list] = {k: [] for k in (
        "trace_id", "time_ns", "object", "address", "field", "old", "new", "unchanged",
        "writer", "function", "offset", "file", "line", "inlined", "inlined_from", "called_from", "cpu",
        "pid", "tid")}
    tid = trace_id(a)
    for i, w in enumerate(view.writes):
        site = view.writer_site(i)
        o = view.object_of[i]
        rows["trace_id"].append(tid)
        rows["time_ns"].append(w.ts_ns - a.start_ns)
        rows["object"].append(labels[o] if o >= 0 else None)
        rows["address"].append(f"{w.object:#x}")
        rows["field"].append(w.field)
        rows["old"].append(None if w.old is None else show(w.field, w.old))
        rows["new"].append(None if w.value is None else show(w.field, w.value))
        rows["unchanged"].append(w.unchanged)
        rows["writer"].append(view.writer_label(i))
        rows["function"].append(site.function if site else None)
        rows["offset"].append(site.offset if site else None)
        rows["file"].append(site.file if site else None)
        rows["line"].append(site.line if site else None)
        rows["inlined"].append(site.inlined or None if site else None)
        rows["inlined_from"].append(site.inlined_from or None if site else None)
        rows["called_from"].append(list(reversed(view.callers(i))))
        rows["cpu"].append(w.cpu)
        rows["pid"].append(w.pid)
        rows["tid"].append(w.tid)
    return pa.table(rows)


def writes_path(output: str, fmt: str) -> str:
    """Where the watched writes go beside an export written to ``output``
    (``NAME.writes.FMT``)."""
    base = output[:-len(f".{fmt}")] if output.endswith(f".{fmt}") else output.rstrip("/")
    return f"{base}.writes.{fmt}"


def write_writes(a, output: Optional[str], fmt: str, formatter=None) -> Optional[str]:
    """Write the writes' table beside ``output`` (None: the events went to stdout, so
    the writes go nowhere); its path, or None when there were none."""
    table = writes_table(a, formatter)
    if table is None or not output:
        return None
    path = writes_path(output, fmt)
    if fmt == "csv":
        import pyarrow as pa
        table = table.set_column(table.schema.get_field_index("called_from"), "called_from",
                                 pa.array([" → ".join(c) for c in
                                           table.column("called_from").to_pylist()]))
    return write_beside(table, path, output, fmt, "writes.parquet")

"""The calls ``--calls changes`` folded (`ctracer.analysis.folds`) as a table beside an
export's events: they were never events, so they are not rows of the events' table (its
columns and `ctracer.export.schema.SCHEMA_VERSION` are unchanged).

One row per object, function and caller: ``trace_id``, ``object`` (its name in the
report and the events' ``object`` column), ``address`` (hex), ``function``, ``caller``
(the traced function whose call they were made in on their thread, empty: none),
``caller_same_object`` (that call was on the same object: the edge of the object's own
call graph), ``calls``, ``total_ns`` (their summed durations), ``max_ns`` (the longest).
Written as ``<output>.folded-calls.jsonl``, ``.csv`` or ``.parquet`` beside the events'
file; a trace recorded with ``--calls all`` has none.
"""

from __future__ import annotations

from typing import Optional

from ctracer.export.beside import write_beside


def folded_calls_table(a):
    """A `pyarrow.Table` of the trace's folded calls, or None without any."""
    import pyarrow as pa

    f = a.folded
    if f is None or not len(f):
        return None
    from ctracer.export.table import trace_id
    labels, keys = a.objects.labels, a.objects.keys
    objects = f.object.tolist()
    return pa.table({
        "trace_id": [trace_id(a)] * len(f),
        "object": [labels[o] for o in objects],
        "address": [f"{keys[o].address:#x}" for o in objects],
        "function": [a.function_name(fid) for fid in f.function.tolist()],
        "caller": [a.function_name(c) if c >= 0 else None for c in f.caller.tolist()],
        "caller_same_object": f.same_object.tolist(),
        "calls": f.calls.tolist(),
        "total_ns": f.total_ns.tolist(),
        "max_ns": f.max_ns.tolist()})


def folded_calls_path(output: str, fmt: str) -> str:
    """Where the folded calls go beside an export written to ``output``
    (``NAME.folded-calls.FMT``)."""
    base = output[:-len(f".{fmt}")] if output.endswith(f".{fmt}") else output.rstrip("/")
    return f"{base}.folded-calls.{fmt}"


def write_folded_calls(a, output: Optional[str], fmt: str) -> Optional[str]:
    """Write the folded calls' table beside ``output`` (None: the events went to
    stdout, so the table goes nowhere); its path, or None when there were none."""
    table = folded_calls_table(a)
    if table is None or not output or fmt not in ("jsonl", "csv", "parquet"):
        return None
    path = folded_calls_path(output, fmt)
    return write_beside(table, path, output, fmt, "folded-calls.parquet")

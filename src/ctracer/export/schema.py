"""The export schema: one set of column types for every kernel and build of a struct.

A Parquet export (and `ctracer sql`'s view of a trace file) has the same column types
whatever kernel or build recorded it, so that the exports of many hosts merge in every
engine — Spark's ``mergeSchema``, DuckDB's ``union_by_name``, a Trino Hive table: a
field column's type depends only on what its member is (`FIELD_TYPES`, by the mini
layout's `ctracer.event.Field.kind`), never on the member's width or offset on one
kernel.  A member that one host's kernel lacks is simply a column that host's files do
not have, which every engine reads as NULL there.

* `HEADER`: the event and derived columns, first, in this order;
* then one column per snapshot field, by its dotted member path (quote it in SQL:
  ``"__sk_common.skc_state"`` in DuckDB and Trino, backquotes in Spark), followed by
  ``PATH:name`` (string) for an enum (its enumerator's name, NULL for a value the enum
  does not name) and ``PATH:bits`` (list of strings) for a flag word whose bits an enum
  names (the names of the bits set; the raw value keeps every bit);
* a network-order member is written as the pages, ``--tail`` and ``--where`` spell it
  (`ctracer.decode.display_of`): a ``__be16`` port as its int64 port number in host
  order, a ``__be32`` address as its dotted quad (string); the value as recorded
  (int64) sits beside it in ``PATH:raw``;
* `TRACE`: the recording's columns, last; in a Hive-partitioned export `PARTITIONS`
  come from the path (``host=H/struct=S/``), not from the file.

Integers of every width and sign are ``int64``; an unsigned 64-bit value above
2**63 - 1 is stored as its two's complement (the int64 with the same 64 bits: ``~0UL``
reads as -1; ``if(x < 0, x + 18446744073709551616, x)`` gives it back in DuckDB and
Spark), so bit tests (``x & 4``) work on flag words in every engine.  Addresses
(pointer members) are hex strings, ``0x0`` for NULL, as ``object`` is.

Each file says, in its key-value metadata, `SCHEMA_VERSION` (``ctracer.export_schema``),
the struct (``ctracer.struct``) and each field's kind and C type on the recording host
(``ctracer.fields``, JSON).  `check_file` refuses a file of a newer schema, and one filed
under another struct's partition, in one line.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Callable, Optional

from ctracer import decode
from ctracer.errors import InputFileError, OutputError
from ctracer.export.table import EventTable
from ctracer.files import safe_name

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: the version of this schema; a change of a column's name, type or meaning raises it
SCHEMA_VERSION = 3
#: the header column that schema 2 and older named ``probe``: `ctracer sql` reads it as
#: ``phase``, so old and new exports query together
OLD_NAMES = {"phase": "probe"}
META_SCHEMA = b"ctracer.export_schema"
META_STRUCT = b"ctracer.struct"
META_FIELDS = b"ctracer.fields"

#: (column, type, meaning), the first columns of every export
HEADER = (
    ("time_ns", "int64", "probe time, ns of the traced host's CLOCK_MONOTONIC"),
    ("cpu", "int32", "the CPU the probe ran on"),
    ("pid", "int32", "process id (thread group) of the thread"),
    ("tid", "int32", "thread id"),
    ("comm", "string", "the thread's command name"),
    ("function", "string", "the probed function; tracepoints as tp:NAME"),
    ("phase", "string", "entry, exit or tracepoint"),
    ("object", "string", "the object's address in hex; NULL: the event has none"),
    ("lifetime", "int32", "1, 2, ... for successive objects at one address; 0: none"),
    ("depth", "int32", "open traced calls of the thread around the event"),
    ("ret", "int64", "return value, on exits of functions returning one"),
    ("args", "string", "the call's or tracepoint's arguments by name, as a JSON object"),
    ("changed", "list<string>", "fields whose value differs from the object's previous event"),
    ("changed_by", "string", "the function credited with those changes"),
    ("unreadable", "bool", "the probe could not read the object"),
)
#: (column, type, meaning), the last columns; `PARTITIONS` of them from the path
TRACE = (
    ("host", "string", "the recording's host name, or export --host"),
    ("kernel", "string", "kernel release of the recording host"),
    ("struct", "string", "the traced struct"),
    ("trace_id", "string", "the recording's id, one per trace file"),
)
PARTITIONS = ("host", "struct")
#: a field column's type, by what the member is (`ctracer.event.Field.kind`)
FIELD_TYPES = {
    "int": "int64", "uint": "int64", "char": "int64", "enum": "int64",
    "bool": "bool", "float": "double", "pointer": "string", "text": "string",
    "ipv6": "string",
}
#: the columns beside a field's, and their types
ENUM_NAME, FLAG_BITS, RAW = ":name", ":bits", ":raw"
COMPANION_TYPES = {ENUM_NAME: "string", FLAG_BITS: "list<string>", RAW: "int64"}
#: the displays (`ctracer.decode.display_of`) whose column holds the value as shown,
#: with the recorded value in ``PATH:raw``: display -> (decoder, column type)
DECODED = {"port": (decode.port, "int64"), "ipv4": (decode.ipv4, "string")}


def arrow_type(name: str) -> "pa.DataType":
    """The Arrow type spelled ``name`` in the tables above."""
    import pyarrow as pa
    if name == "list<string>":
        return pa.list_(pa.string())
    return {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(),
            "bool": pa.bool_(), "double": pa.float64()}[name]


def _cast(data: "pa.Array", type_name: str) -> "pa.Array":
    import pyarrow as pa
    import pyarrow.compute as pc
    want = arrow_type(type_name)
    if pa.types.is_dictionary(data.type) and want == pa.string():
        return data  # written as a dictionary-encoded Parquet string
    if data.type == want:
        return data
    if want == pa.bool_() and pa.types.is_integer(data.type):
        return pc.not_equal(data, 0)
    return pc.cast(data, want, safe=False)  # u64 -> int64 keeps the bits


def _per_value(data: "pa.Array", text: Callable[[int], Any], type_name: str) -> "pa.Array":
    """``text(value)`` for every row's integer value (computed once per distinct value);
    NULL where the value is."""
    import pyarrow as pa
    import pyarrow.compute as pc
    values = pc.unique(data.drop_null())
    made = pa.array([text(v) for v in values.to_pylist()], arrow_type(type_name))
    return made.take(pc.index_in(data, value_set=values))


def _hex(value: int) -> str:
    return f"0x{value & 0xFFFFFFFFFFFFFFFF:x}"


def pointers_as_hex(f, data: "pa.Array") -> "pa.Array":
    """``data``, a snapshot field's column, with a pointer member's addresses as hex
    strings (``0x0`` for NULL), as every export writes them (a 64-bit kernel address
    as a JSON number is rounded by jq and JavaScript); other fields unchanged."""
    import pyarrow as pa
    if f is not None and f.kind == "pointer" and pa.types.is_integer(data.type):
        return _per_value(data, _hex, "string")
    return data


def as_shown(f, column: str, data: "pa.Array") -> Optional[list[tuple[str, "pa.Array"]]]:
    """For a network-order field (`DECODED`), its columns as every export writes them:
    ``column`` with the value as the pages and ``--where`` spell it (a port in host
    order, an IPv4 address as a dotted quad) and ``column:raw`` with the value as
    recorded; None for any other field."""
    import pyarrow as pa
    if f is None or not pa.types.is_integer(data.type):
        return None
    decoded = DECODED.get(decode.display_of(f))
    if decoded is None:
        return None
    decoder, type_name = decoded
    return [(column, _per_value(data, decoder, type_name)),
            (column + RAW, _cast(data, "int64"))]


def enum_names(f, data: "pa.Array") -> Optional["pa.Array"]:
    """An enum field's enumerator names per row (NULL for a value the enum does not
    name), the ``PATH:name`` column; None for another field."""
    import pyarrow as pa
    if f is None or f.kind != "enum" or not f.enumerators or not pa.types.is_integer(data.type):
        return None
    return _per_value(data, dict(f.enumerators).get, "string")


def _field_columns(column: str, f, data: "pa.Array") -> list[tuple[str, "pa.Array"]]:
    import pyarrow as pa
    kind = f.kind if f is not None else "int"
    type_name = FIELD_TYPES.get(kind, "int64")
    shown = as_shown(f, column, data)
    if shown is not None:
        return shown
    if kind == "pointer" and pa.types.is_integer(data.type):
        out = [(column, pointers_as_hex(f, data))]
    else:
        out = [(column, _cast(data, type_name))]
    if f is None or not pa.types.is_integer(data.type):
        return out
    named = enum_names(f, data)
    if named is not None:
        out.append((column + ENUM_NAME, named))
    bits = [(b, str(n)) for b, n in f.source.get("bits", ())
            if isinstance(b, int) and 0 <= b < 64]
    if bits:
        out.append((column + FLAG_BITS, _per_value(
            data, lambda v: [n for b, n in bits if v >> b & 1], "list<string>")))
    return out


def export_table(et: EventTable) -> "pa.Table":
    """``et`` in the export schema: `HEADER`, the field columns, `TRACE`."""
    import pyarrow as pa
    t = et.table
    layout = {f.name: f for f in et.layout.fields} if et.layout is not None else {}
    names, arrays = [], []
    for name, type_name, _ in HEADER:
        names.append(name)
        arrays.append(_cast(t.column(name).combine_chunks(), type_name))
    for field, column in et.fields.items():
        for name, array in _field_columns(column, layout.get(field),
                                          t.column(column).combine_chunks()):
            names.append(name)
            arrays.append(array)
    for name, _, _ in TRACE:
        names.append(name)
        arrays.append(t.column(name).combine_chunks())
    return pa.Table.from_arrays(arrays, names=names)


def file_metadata(et: EventTable) -> dict[bytes, bytes]:
    """The key-value metadata every export file carries."""
    layout = {f.name: f for f in et.layout.fields} if et.layout is not None else {}
    fields = [{"name": name, "column": column,
               "kind": layout[name].kind if name in layout else "int",
               "ctype": layout[name].ctype if name in layout else None}
              for name, column in et.fields.items()]
    return {META_SCHEMA: str(SCHEMA_VERSION).encode(),
            META_STRUCT: et.struct_name.encode("utf-8", "surrogatepass"),
            META_FIELDS: json.dumps(fields).encode()}


def partitions_of(path: str) -> dict[str, str]:
    """The Hive partition values a path names (``…/host=a/struct=sock/x`` →
    host a, struct sock)."""
    out = {}
    for part in os.path.abspath(path).split(os.sep):
        key, eq, value = part.partition("=")
        if eq and key in PARTITIONS:
            out[key] = value
    return out


def check_file(path: str) -> Optional[str]:
    """The struct of the export at ``path`` (None for a Parquet file ctracer did not
    write); raises `InputFileError` for a file this ctracer cannot read as an export:
    damaged, of a newer schema, or filed under another struct's partition."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        meta = pq.read_metadata(path).metadata or {}
    except (OSError, pa.ArrowException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputFileError(f"{path} is not a readable Parquet file: {first}") from None
    version = meta.get(META_SCHEMA)
    if version is not None:
        text = version.decode("utf-8", "replace")
        if not text.isdigit() or int(text) > SCHEMA_VERSION:
            raise InputFileError(
                f"{path} was written by a newer ctracer (export schema {text}; this one "
                f"reads schemas up to {SCHEMA_VERSION}): upgrade ctracer to read it")
    struct = meta.get(META_STRUCT)
    if struct is None:
        return None
    name = struct.decode("utf-8", "surrogatepass")
    filed = partitions_of(path).get("struct")
    if filed is not None and filed != safe_name(name, "struct"):
        raise InputFileError(f"{path} holds an export of struct {name} but is filed under "
                             f"struct={filed}")
    return name


def check_output_directory(output: str, struct_name: str) -> None:
    """Refuse ``-o DIR`` inside a dataset's partition folder (the export would nest
    ``host=…/struct=…/`` in it, which no engine reads) and a dataset holding files
    `check_file` refuses."""
    inside = partitions_of(output)
    if inside:
        key = "struct" if "struct" in inside else "host"
        other = inside.get("struct")
        what = (f"the partition of struct {other}, not {struct_name}"
                if other is not None and other != safe_name(struct_name, "struct")
                else "a partition folder of a dataset")
        raise OutputError(f"{output} is {what} ({key}={inside[key]}): export to the "
                          "dataset's root, which holds the host=…/ folders")
    if not os.path.isdir(output):
        return
    for root, _, files in os.walk(output):
        for name in sorted(files):
            if name.endswith(".parquet"):
                check_file(os.path.join(root, name))

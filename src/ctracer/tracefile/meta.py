"""The trace file's meta table read as values: `meta_json` and `meta_text` (one entry,
with a damaged entry reported in one line), `read_meta` (the table as it is, for a
quick look before opening the trace), `trace_id_of` (a trace's id, also for files older
than the ``trace_id`` entry)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any

from ctracer.errors import TraceFileError


def meta_json(meta: dict[str, str], key: str, path: str, default: Any = None) -> Any:
    """The meta entry ``key`` decoded from JSON (``default`` when absent); a
    `TraceFileError` when it is not JSON (the trace at ``path`` is damaged)."""
    v = meta.get(key)
    if v is None:
        return default
    try:
        return json.loads(v)
    except ValueError:  # found by tests/test_tracefile_fuzz.py
        raise TraceFileError(f"{path} is damaged: its meta entry {key!r} is not "
                             "JSON") from None


def meta_text(meta: dict[str, str], key: str) -> str:
    """The meta entry ``key`` as text: a JSON string decoded, anything else as written
    ("" when absent)."""
    v = meta.get(key)
    if v is None:
        return ""
    try:
        d = json.loads(v)
    except ValueError:
        return v
    return d if isinstance(d, str) else v


def read_meta(path: str) -> dict[str, str]:
    """The meta table of a trace file as it is, read without `Trace`'s checks and
    without finishing a killed recording's file (a reader must still open it as a
    `Trace`): for a quick look before the work; {} when it cannot be read."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
        finally:
            db.close()
    except (sqlite3.Error, ValueError):
        return {}


def trace_id_of(meta: dict[str, str]) -> str:
    """A trace's id: written by the recorder, or (older files) a digest of what
    identifies the recording."""
    tid = meta.get("trace_id")
    if tid:
        return tid
    key = "|".join(meta.get(k, "") for k in ("host", "start_time", "struct_name",
                                             "kernel_release", "argv"))
    return hashlib.sha256(key.encode()).hexdigest()[:32]

"""The trace file's meta table read as values: `TraceMeta`, the typed view every reader
uses (the entries ctracer reads, by name and type, and the table as written for a summary
that lists it all); `meta_json` and `meta_text` (one entry, with a damaged entry reported
in one line), `read_meta` (the table as it is, for a quick look before opening the
trace), `trace_id_of` (a trace's id, also for files older than the ``trace_id`` entry)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any, Iterator, Mapping, Optional

from ctracer.errors import TraceFileError
from ctracer.plan.watch import WatchPlan


def add_meta(path: str, **items: Any) -> None:
    """Write meta entries into a finished trace file (a trace recorded in a guest gets
    the guest's description once it has landed on the host)."""
    rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in items.items()]
    db = sqlite3.connect(path)
    try:
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)
        db.commit()
    except sqlite3.DatabaseError as e:
        raise TraceFileError(f"{path}: cannot write its meta: {e}") from None
    finally:
        db.close()


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


class TraceMeta(Mapping[str, str]):
    """A trace file's meta table: the entries ctracer reads, typed (JSON entries decoded
    when read; a damaged one is a `TraceFileError` naming the file), and every entry as
    written (a mapping of key → text, for the summary that lists them)."""

    def __init__(self, entries: Mapping[str, str], path: str = ""):
        self._entries = dict(entries)
        self.path = path

    def __getitem__(self, key: str) -> str:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def json(self, key: str, default: Any = None) -> Any:
        """Any entry decoded from JSON (`meta_json`)."""
        return meta_json(self._entries, key, self.path, default)

    def text(self, key: str) -> str:
        """Any entry as text (`meta_text`)."""
        return meta_text(self._entries, key)

    @property
    def struct_name(self) -> str:
        """The name of the struct traced."""
        return self._entries["struct_name"]

    @property
    def struct_kind(self) -> str:
        """``struct`` or ``union``."""
        return self._entries.get("struct_kind", "struct")

    @property
    def trace_id(self) -> str:
        """The trace's id (`trace_id_of`)."""
        return trace_id_of(self._entries)

    @property
    def host(self) -> str:
        """The recording host's name."""
        return self.text("host")

    @property
    def kernel_release(self) -> str:
        """The recording host's kernel release."""
        return self.text("kernel_release")

    @property
    def state(self) -> Optional[str]:
        """recording, finished or interrupted (`ctracer.tracefile.format`)."""
        return self._entries.get("state")

    @property
    def stopped_by(self) -> Optional[str]:
        """What ended the recording (None: not said)."""
        return self._entries.get("stopped_by")

    @property
    def traced(self) -> Optional[str]:
        """``kernel`` or ``user``."""
        return self._entries.get("traced")

    @property
    def tracepoint_args(self) -> dict:
        """Per function id, each tracepoint argument's name, C type, kind and type text."""
        return self.json("tracepoint_args") or {}

    @property
    def kernel_symbols(self) -> dict:
        """Hex code address → ``symbol+offset`` on the recording host."""
        return self.json("kernel_symbols") or {}

    @property
    def net_devices(self) -> Any:
        """Device index → name on the recording host, as written (None: not recorded)."""
        return self.json("net_devices")

    @property
    def announced_stores(self) -> Any:
        """The stores tracepoints announce (`ctracer.plan.stores`; None: none)."""
        return self.json("announced_stores")

    @property
    def lifetime_rules(self) -> Any:
        """The lifetime rules the trace was recorded with (`ctracer.plan.lifetime_rules`)."""
        return self.json("lifetime_rules") or ()

    @property
    def head_read(self) -> Any:
        """The fields an event reading only its object's head carries (None: no such rule)."""
        return self.json("head_read")

    @property
    def return_kinds(self) -> Any:
        """How each function's return value is shown (None: not recorded)."""
        return self.json("return_kinds") if "return_kinds" in self._entries else None

    @property
    def watch(self) -> Any:
        """What the write watchpoints of the recording saw (None: no watch)."""
        return self.json("watch")

    @property
    def watch_plan(self) -> Optional[WatchPlan]:
        """The write watchpoints the recording armed (None: none)."""
        data = self.json("watch_plan")
        if not data:
            return None
        try:
            return WatchPlan.from_dict(data)
        except ValueError as e:
            raise TraceFileError(f"{self.path} is damaged: its meta entry 'watch_plan' is "
                                 f"{e}") from None

    @property
    def summary_fields(self) -> Any:
        """The project file's columns of the report's object list (None: not given)."""
        return self.json("summary_fields")

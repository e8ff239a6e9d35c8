"""The trace file keeps what was written, refuses what it cannot read, and survives
an interrupted recording."""

import sqlite3

import pytest

from ctracer.errors import TraceFileError
from ctracer.event import PHASE_ENTRY, PHASE_EXIT, Field, Layout
from ctracer.tracefile import FunctionRow, Trace, TraceWriter

MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("state", "u8", 0, "uint"), Field("refcnt", "s32", 0, "int")])
KERNEL_ADDRESS = 0xFFFF888012345678


def write_trace(path, events):
    w = TraceWriter(str(path), batch=2)
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               argv=["ctracer", "trace", "struct", "sock"])
    w.add_functions([FunctionRow(1, "sock_alloc", reach="returns", address=0x1130),
                     FunctionRow(2, "sock_bind", reach="direct", via="param 1 sk")])
    for e in events:
        w.add_event(**e)
    return w


def event(seq, obj, phase, state, fn=2):
    return dict(ts_ns=1000 + seq, cpu=0, pid=10, tid=11, comm="demo", function_id=fn,
                phase=phase, object=obj, retval=None if phase == PHASE_ENTRY else 0,
                depth=0, flags=0, snapshot=MINI.encode({"state": state, "refcnt": -1}))


def test_round_trip(tmp_path):
    path = tmp_path / "t.ctrace"
    write_trace(path, [event(1, KERNEL_ADDRESS, PHASE_ENTRY, 1),
                       event(2, KERNEL_ADDRESS, PHASE_EXIT, 7),
                       event(3, 0x5000, PHASE_ENTRY, 2)]).close()
    t = Trace(str(path))
    assert t.struct_name == "sock" and t.mini == MINI
    assert t.meta_json("argv")[0] == "ctracer"
    assert t.functions[1].reach == "returns" and t.functions[1].address == 0x1130
    evs = list(t.events(object=KERNEL_ADDRESS))
    assert [e.object for e in evs] == [KERNEL_ADDRESS, KERNEL_ADDRESS]
    assert [t.values(e)["state"] for e in evs] == [1, 7]
    assert t.objects() == [(KERNEL_ADDRESS, 2), (0x5000, 1)]
    assert t.event_count() == 3


def test_unflushed_batches_are_committed_in_batches(tmp_path):
    path = tmp_path / "t.ctrace"
    w = write_trace(path, [event(i, 0x5000, PHASE_ENTRY, i) for i in range(5)])
    # the writer was not closed (as if the recorder was killed): full batches are on disk
    other = sqlite3.connect(str(path))
    assert other.execute("SELECT count(*) FROM events").fetchone()[0] == 4
    other.close()
    w.close()
    assert Trace(str(path)).event_count() == 5


def test_bad_files_are_refused_with_one_line(tmp_path):
    with pytest.raises(TraceFileError, match="no trace file"):
        Trace(str(tmp_path / "missing.ctrace"))
    junk = tmp_path / "junk.ctrace"
    junk.write_text("hello")
    with pytest.raises(TraceFileError, match="not a ctracer trace file"):
        Trace(str(junk))
    old = tmp_path / "old.ctrace"
    db = sqlite3.connect(str(old))
    db.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    db.execute("INSERT INTO meta VALUES ('schema_version', '0')")
    db.commit()
    db.close()
    with pytest.raises(TraceFileError, match="schema 0"):
        Trace(str(old))

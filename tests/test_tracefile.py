"""The trace file keeps what was written, refuses what it cannot read, and survives
an interrupted recording."""

from support.encoding import encode
import sqlite3

import pytest

from ctracer.errors import TraceFileError
from ctracer.event import PHASE_ENTRY, PHASE_EXIT, Field, Layout
from ctracer.tracefile import Trace, TraceWriter
from ctracer.event import FunctionRow

MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("state", "u8", 0, "uint"), Field("refcnt", "s32", 0, "int")])
KERNEL_ADDRESS = 0xFFFF888012345678


def write_trace(path, events):
    w = TraceWriter(str(path), batch=2)
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               argv=["ctracer", "trace", "struct", "sock"])
    w.add_functions([FunctionRow(1, "sock_alloc", route_kind="returns", address=0x1130),
                     FunctionRow(2, "sock_bind", route_kind="direct", route_text="param 1 sk")])
    for e in events:
        w.add_event(**e)
    return w


def event(seq, obj, phase, state, fn=2):
    return dict(ts_ns=1000 + seq, cpu=0, pid=10, tid=11, comm="demo", function_id=fn,
                phase=phase, object=obj, retval=None if phase == PHASE_ENTRY else 0,
                depth=0, flags=0, snapshot=encode(MINI, {"state": state, "refcnt": -1}))


def test_round_trip(tmp_path):
    path = tmp_path / "t.ctrace"
    write_trace(path, [event(1, KERNEL_ADDRESS, PHASE_ENTRY, 1),
                       event(2, KERNEL_ADDRESS, PHASE_EXIT, 7),
                       event(3, 0x5000, PHASE_ENTRY, 2)]).close()
    t = Trace(str(path))
    assert t.struct_name == "sock" and t.mini == MINI
    assert t.meta_json("argv")[0] == "ctracer"
    assert t.functions[1].route_kind == "returns" and t.functions[1].address == 0x1130
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


# ---- files: modes, no symlink followed, nothing destroyed --------------------------

def test_trace_file_is_private_and_an_existing_one_is_kept_as_old(tmp_path):
    path = tmp_path / "t.ctrace"
    write_trace(path, [event(1, 0x5000, PHASE_ENTRY, 1)]).close()
    assert (path.stat().st_mode & 0o777) == 0o600
    write_trace(path, [event(1, 0x6000, PHASE_ENTRY, 2), event(2, 0x6000, PHASE_EXIT, 3)]).close()
    assert (path.stat().st_mode & 0o777) == 0o600
    assert Trace(str(path)).event_count() == 2
    old = Trace(str(path) + ".old")
    assert [e.object for e in old.events()] == [0x5000]


def test_a_planted_symlink_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "t.ctrace"
    path.symlink_to(victim)
    w = write_trace(path, [event(1, 0x5000, PHASE_ENTRY, 1)])
    w.close()
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and Trace(str(path)).event_count() == 1
    assert (tmp_path / "t.ctrace.old").is_symlink()  # kept, not followed


def test_output_that_is_a_directory_is_one_line(tmp_path):
    from ctracer.errors import OutputError
    with pytest.raises(OutputError, match="is a directory"):
        TraceWriter(str(tmp_path))
    with pytest.raises(OutputError, match="no directory"):
        TraceWriter(str(tmp_path / "missing" / "t.ctrace"))


# ---- nothing committed is lost: a writer killed with SIGKILL -----------------------

_KILLED_WRITER = r'''
import sys
from ctracer.event import HEADER, PHASE_ENTRY, PHASE_EXIT, event_size, mini_offset
from ctracer.tracefile import TraceWriter
from ctracer.event import FunctionRow
sys.path.insert(0, sys.argv[2])
import test_tracefile as t

w = TraceWriter(sys.argv[1])
w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=t.MINI.to_json(),
           return_value_functions=[2], start_time="2026-12-01T05:00:00.000+00:00",
           start_monotonic_ns=0)
w.add_functions([FunctionRow(2, "sock_bind")])

def raw(i):
    header = t.encode(HEADER, dict(ts_ns=1000 + i, object=0xFFFF888000000000 + i % 3,
                                retval=-11, cpu=0, pid=10, tid=11, function_id=2, depth=0,
                                phase=i % 2, flags=0, comm="demo"))
    header += bytes(mini_offset(t.MINI) - len(header))
    return header + t.encode(t.MINI, {"state": i % 256, "refcnt": -i})

n = 0
for batch in range(6):
    w.add_raw(b"".join(raw(n + i) for i in range(500)))
    n += 500
print(n, flush=True)
sys.stdin.read()  # wait to be killed
'''


def _killed_writer(tmp_path):
    import os
    import subprocess
    import sys
    path = tmp_path / "killed.ctrace"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(path),
                              os.path.dirname(__file__)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    committed = int(child.stdout.readline())
    return path, child, committed


def test_sigkill_keeps_every_committed_event_and_says_where_it_ends(tmp_path):
    import signal
    path, child, committed = _killed_writer(tmp_path)
    try:
        live = Trace(str(path))  # the recorder still runs: read, never finish it
        assert "still running" in live.incomplete
        assert live.event_count() == committed  # every committed event reads, raw
        live.close()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    trace = Trace(str(path))
    assert trace.event_count() == committed == 3000
    assert trace.incomplete.startswith("incomplete: the recorder was killed")
    assert "3000 events" in trace.incomplete
    assert "2026-12-01T05:00:00.000" in trace.incomplete  # where it ends, in wall time
    events = list(trace.events())
    assert [e.ts_ns for e in events] == [1000 + i for i in range(3000)]
    assert [trace.values(e)["refcnt"] for e in events[:3]] == [0, -1, -2]
    assert [e.retval for e in events[:2]] == [None, -11]  # exits carry the return value
    assert trace.meta["stopped_by"].startswith("killed")
    assert trace.meta["end_time"].startswith("2026-12-01T05:00:00.000")  # its last event
    # the finished file is self-contained: no log left beside it
    import os
    assert not os.path.exists(str(path) + "-wal")
    # and it stays incomplete for every later reader
    assert Trace(str(path)).incomplete == trace.incomplete


def test_killed_trace_that_cannot_be_written_says_how_to_finish_it(tmp_path):
    """Opened by a user who may read the file but not write it (root may write anything,
    so the reader runs as nobody)."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to read the file as another user")
    path, child, _ = _killed_writer(tmp_path)
    shared = tempfile.mkdtemp(prefix="ctracer-ro-")
    try:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(str(path) + suffix):
                shutil.copy(str(path) + suffix, os.path.join(shared, "k.ctrace" + suffix))
                os.chmod(os.path.join(shared, "k.ctrace" + suffix), 0o644)
        os.chmod(shared, 0o755)
        child.send_signal(signal.SIGKILL)
        child.wait()
        code = ("import sys\nfrom ctracer.tracefile import Trace\n"
                "from ctracer.errors import TraceFileError\n"
                "try:\n    Trace(sys.argv[1])\nexcept TraceFileError as e:\n    print(e)\n")
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-c", code, os.path.join(shared, "k.ctrace")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": src},
                           timeout=60)
        assert "killed and cannot be finished here" in r.stdout, r.stdout + r.stderr
        assert "copy it somewhere writable" in r.stdout
    finally:
        child.kill()
        shutil.rmtree(shared)


# ---- damaged, newer, or not a trace: each its own one line --------------------------

def _good(tmp_path):
    path = tmp_path / "good.ctrace"
    write_trace(path, [event(i, 0x5000 + i % 7, PHASE_ENTRY, i % 256)
                       for i in range(3000)]).close()
    return path


def test_truncated_trace(tmp_path):
    path = _good(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(TraceFileError, match=r"is damaged: truncated to \d+ of \d+ bytes"):
        Trace(str(path))


def test_damaged_trace(tmp_path):
    path = _good(tmp_path)
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    page = 65536 if page == 1 else page  # how SQLite's header spells 64 KiB
    for at in range(page, len(data), page):  # every page after the first: b-tree headers
        data[at:at + 12] = b"\xa5" * 12
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFileError, match="is damaged"):
        t = Trace(str(path))
        list(t.events())


def test_trace_from_a_newer_ctracer(tmp_path):
    path = _good(tmp_path)
    db = sqlite3.connect(str(path))
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(TraceFileError, match="written by a newer ctracer .trace schema 99"):
        Trace(str(path))


@pytest.mark.parametrize("value", [99, 2.5, b"1"])
def test_schema_version_of_another_sqlite_type(tmp_path, value):
    """Found by the fuzz suite: a meta value that is not text (an integer) is the trace's
    error, not an AttributeError."""
    path = _good(tmp_path)
    db = sqlite3.connect(str(path))
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (value,))
    db.commit()
    db.close()
    with pytest.raises(TraceFileError):
        Trace(str(path))


def test_files_that_are_not_traces(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(TraceFileError, match="is empty"):
        Trace(str(empty))
    other = tmp_path / "other.db"
    db = sqlite3.connect(str(other))
    db.execute("CREATE TABLE t(x)")
    db.commit()
    db.close()
    with pytest.raises(TraceFileError, match="an SQLite database but not a ctracer trace"):
        Trace(str(other))
    # tables named as ours, columns not ours: not a trace (was "damaged: no such column")
    lookalike = tmp_path / "lookalike.db"
    db = sqlite3.connect(str(lookalike))
    db.execute("CREATE TABLE events(a)")
    db.execute("CREATE TABLE meta(x)")
    db.commit()
    db.close()
    with pytest.raises(TraceFileError, match="an SQLite database but not a ctracer trace "
                                             r"file \(its meta table is not a trace's\)"):
        Trace(str(lookalike))
    with pytest.raises(TraceFileError, match="is a directory"):
        Trace(str(tmp_path))


@pytest.mark.parametrize("schema", [3, 4, 5])
def test_raw_events_stay_raw_or_the_first_reader_decodes_them(tmp_path, schema):
    """A recording's raw events stay raw in the file (schema 4) and every reader decodes
    them; a schema 3 file whose recorder left some raw has them decoded into rows by
    whoever opens it first, once.  Either way the same events read back."""
    import os
    from ctracer.event import HEADER, mini_offset
    path = tmp_path / "left.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               schema_version=schema)
    w.add_functions([FunctionRow(2, "sock_bind")])
    w.expect_raw()

    def raw(i):
        header = encode(HEADER, dict(ts_ns=i, object=0x5000 + i % 5, retval=0, cpu=0, pid=1,
                                    tid=1, function_id=2, depth=0, phase=0, flags=0,
                                    comm="flood"))
        return header + bytes(mini_offset(MINI) - len(header)) + encode(MINI,
            {"state": i % 256, "refcnt": i})

    for batch in range(3):
        w.add_raw(b"".join(raw(batch * 5000 + i) for i in range(5000)))
    w.close()
    db = sqlite3.connect(str(path))
    assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM spool").fetchone()[0] > 0
    db.close()
    assert not os.path.exists(str(path) + "-wal")  # finished: one self-contained file
    seen = []
    trace = Trace(str(path), progress=seen.append)
    assert trace.incomplete is None and trace.event_count() == 15000
    assert (seen[-1] == 15000) if schema == 3 else not seen
    assert [trace.values(e)["refcnt"] for e in trace.events()] == list(range(15000))
    assert trace.event_columns()["seq"].tolist() == list(range(1, 15001))
    trace.close()
    seen.clear()
    assert Trace(str(path), progress=seen.append).event_count() == 15000 and not seen
    rows = sqlite3.connect(str(path)).execute("SELECT count(*) FROM events").fetchone()[0]
    assert rows == (15000 if schema == 3 else 0)


def test_the_log_is_copied_into_the_file_while_recording(tmp_path):
    """`TraceWriter.checkpoint_in_background`: while the writer commits, a thread copies
    the log into the file, so the file itself (read without its log) holds the events
    committed so far and closing has little left to fold in; the trace reads whole."""
    import time
    from ctracer.event import HEADER, mini_offset
    path = tmp_path / "live.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json())
    w.add_functions([FunctionRow(2, "sock_bind")])
    w.expect_raw()
    w.checkpoint_in_background(every_s=0.01)

    def raw(i):
        header = encode(HEADER, dict(ts_ns=i, object=0x5000, retval=0, cpu=0, pid=1, tid=1,
                                    function_id=2, depth=0, phase=0, flags=0, comm="x"))
        return header + bytes(mini_offset(MINI) - len(header)) + encode(MINI,
            {"state": 1, "refcnt": i})

    for batch in range(4):
        w.add_raw(b"".join(raw(batch * 1000 + i) for i in range(1000)))
    in_file = 0
    deadline = time.monotonic() + 60  # a liveness bound, not a speed check
    while in_file < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
        # immutable=1: the file alone, its log ignored
        db = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
        try:
            in_file = db.execute("SELECT count(*) FROM spool").fetchone()[0]
        except sqlite3.DatabaseError:
            in_file = 0  # caught between two page writes of a checkpoint
        finally:
            db.close()
    assert in_file == 4
    w.close()
    trace = Trace(str(path))
    assert [trace.values(e)["refcnt"] for e in trace.events()] == list(range(4000))


@pytest.mark.parametrize("late", [[2, 1, 3, 4], [3, 1, 2, 4], [4, 3, 2, 1]])
def test_events_recorded_out_of_time_order_keep_their_objects(tmp_path, late):
    # two CPUs' events reach the ring out of time order: put back in time order, every
    # column moves with its event (each object once: the object column used to move twice)
    path = tmp_path / "t.ctrace"
    events = [dict(event(seq, 0x5000 + 0x170 * seq, PHASE_ENTRY, seq), ts_ns=1000 + at)
              for seq, at in enumerate(late, 1)]
    write_trace(path, events).close()
    t = Trace(str(path))
    got = [(e.ts_ns, e.object, t.values(e)["state"]) for e in t.events()]
    assert sorted(got) == [(1000 + at, 0x5000 + 0x170 * seq, seq)
                           for seq, at in sorted(enumerate(late, 1), key=lambda p: p[1])]
    c = t.event_columns()
    assert c["ts_ns"].tolist() == sorted(c["ts_ns"].tolist())
    assert [(c["object"][i] - 0x5000) // 0x170 for i in range(4)] == c["seq"].tolist()


def test_raw_batches_decode_arguments_and_commands_once_per_distinct_value():
    """A batch's tracepoint arguments become one JSON text per distinct row of values
    (a signed slot read as signed) and commands one name per distinct comm; columns and
    rows agree, events without arguments have none."""
    import json

    import numpy as np
    from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT, event_dtype
    from ctracer.tracefile import RawDecoder

    decoder = RawDecoder(MINI, (), {"1": [{"name": "old", "ctype": "s64"},
                                          {"name": "new", "ctype": "u64"}],
                                    "3": [{"name": "len", "ctype": "u64"}], "2": []})
    a = np.zeros(7, event_dtype(MINI, decoder.nargs))
    a["function_id"] = [1, 2, 1, 3, 1, 3, 2]  # 2: a tracepoint without arguments
    a["phase"] = [PHASE_TRACEPOINT, PHASE_ENTRY] + [PHASE_TRACEPOINT] * 4 + [PHASE_ENTRY]
    a["comm"] = [b"a", b"b", b"a", b"a", b"c", b"a", b"a"]
    a["args"][:, 0] = [2**64 - 1, 0, 5, 1500, 2**64 - 1, 1500, 9]
    a["args"][:, 1] = [4, 0, 4, 0, 4, 0, 9]
    want = ['{"old": -1, "new": 4}', None, '{"old": 5, "new": 4}', '{"len": 1500}',
            '{"old": -1, "new": 4}', '{"len": 1500}', None]
    columns = decoder.columns(a.tobytes(), 1)
    texts, index = columns["args_texts"], columns["args"].tolist()
    assert [texts[i] if i >= 0 else None for i in index] == want
    assert len(texts) == 3 and all(json.loads(t) for t in texts)
    comms = [columns["comm_texts"][i] for i in columns["comm"].tolist()]
    assert comms == ["a", "b", "a", "a", "c", "a", "a"]
    rows = decoder.rows(a.tobytes())
    assert [r[4] for r in rows] == comms and [r[12] for r in rows] == want
    one = decoder.columns(a[[0, 2, 3]].tobytes(), 1)  # one command: its fast path
    assert one["comm_texts"] == ["a"] and one["comm"].tolist() == [0, 0, 0]


def test_a_batchs_commands_are_numpys_unique_ones():
    """The distinct commands of a batch (one compared, several sorted) are what
    `np.unique` finds, with the same index per event."""
    import numpy as np
    from ctracer.tracefile import RawDecoder

    decoder = RawDecoder(MINI)
    names = [b"abc", b"abd", b"kworker/0:1", b"a" * 16, b"", b"zz", b"kworker/0:10",
             b"\xff\xfe"]
    rng = np.random.default_rng(1)
    for _ in range(100):
        comm = np.array([names[i] for i in rng.integers(0, rng.integers(1, 9),
                                                        rng.integers(0, 500))], "S16")
        texts, index = decoder._comms_of(comm)
        found, inverse = np.unique(comm, return_inverse=True)
        assert texts == [decoder._comm(c) for c in found.tolist()]
        assert index.tolist() == inverse.reshape(-1).tolist()

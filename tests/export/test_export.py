"""`ctracer export` and `ctracer sql` against a simulation whose truth is known
(`synthetic_trace`): every event once, in time order, with the report's lifetimes,
depths and change attribution; Perfetto slices nest per track; Parquet files of two
hosts read as one table by DuckDB with the counts the simulation made."""

from __future__ import annotations

from support.encoding import encode
import collections
import csv
import itertools
import json
import os
import random
import sqlite3

import pytest

from support.analysis_view import view_of
from ctracer.tracefile import Trace
from ctracer.export import schema
from support.cli import ctracer
from support.synthetic_trace import MINI, TCP_STATES, write_synthetic_trace

JSONL_KEYS = ["time_ns", "cpu", "pid", "tid", "comm", "function", "phase", "object",
              "lifetime", "depth", "ret", "args", "fields"]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    path = d / "sim.ctrace"
    truth = write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=6, seed=7)
    return path, truth


def _lines(path):
    return [json.loads(line) for line in open(path)]


def test_jsonl_is_the_report_event_by_event(simulated, tmp_path):
    path, truth = simulated
    r = ctracer("export", path, "--format", "jsonl", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert all(list(e) == JSONL_KEYS for e in lines)
    report = view_of(Trace(str(path)))
    assert len(lines) == len(report.rows) == truth.events
    trace = Trace(str(path))
    snapshots = {e.seq: e.snapshot for e in trace.events()}
    for e, row in zip(lines, report.rows):
        assert e["time_ns"] == row.ts_ns and e["tid"] == row.tid and e["comm"] == row.comm
        assert e["function"] == report.function_names[row.function_id]
        assert e["phase"] == ("entry" if row.phase == 0 else "exit")
        assert e["object"] == (f"0x{row.address:x}" if row.address else None)
        assert e["lifetime"] == (row.obj.lifetime if row.obj else 0)
        assert e["depth"] == row.depth and e["ret"] == row.retval and e["args"] is None
        snapshot = snapshots[row.seq]
        decoded = {} if snapshot is None else MINI.decode(snapshot)
        expected = {k: f"0x{v:x}" if MINI.field(k).kind == "pointer" else v  # hex strings
                    for k, v in decoded.items()}
        for k, v in decoded.items():  # an enum's name beside its value, as in Parquet
            if MINI.field(k).kind == "enum":
                expected[k + ":name"] = dict(MINI.field(k).enumerators).get(v)
        assert e["fields"] == (None if snapshot is None else expected)
    # every lifetime of every address, as the simulation made them
    per_object = collections.Counter((e["object"], e["lifetime"]) for e in lines if e["fields"])
    assert set(per_object) == {(f"0x{a:x}", n) for a, n in truth.lifetimes}
    assert any(n > 1 for _, n in per_object)
    assert "sk_common.skc_state" in lines[-1]["fields"]  # dotted member paths


def test_csv_has_fields_as_columns(simulated, tmp_path):
    path, truth = simulated
    out = tmp_path / "sim.csv"
    r = ctracer("export", path, "--format", "csv", "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == truth.events
    assert {f.name for f in MINI.fields} <= set(rows[0])
    assert {"host", "kernel", "struct", "trace_id", "changed_by"} <= set(rows[0])
    changes = sum(len(json.loads(r["changed"])) for r in rows if r["changed"])
    assert changes == len(truth.changes)
    assert (os.stat(out).st_mode & 0o777) == 0o600


def test_perfetto_tracks_slices_and_changes(simulated, tmp_path):
    path, truth = simulated
    out = tmp_path / "sim.json"
    r = ctracer("export", path, "--format", "perfetto", "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.load(open(out))
    events = data["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert len(names) == len(truth.lifetimes)  # a track per object
    # each track named as the report names the object (and its folder): 0x…, 0x…-2
    assert sorted(names.values()) == sorted(
        f"struct sock 0x{a:x}" + (f"-{n}" if n > 1 else "") for a, n in truth.lifetimes)
    assert any(n.endswith("-2") for n in names.values())
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == sum(truth.calls.values())  # every call seen whole is a slice
    # slices of one track nest like calls: each starts after and ends before its parent
    by_track = collections.defaultdict(list)
    for s in slices:
        by_track[(s["pid"], s["tid"])].append(s)
    for track in by_track.values():
        stack = []
        for s in sorted(track, key=lambda s: (s["ts"], -s["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= s["ts"]:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert s["ts"] + s["dur"] <= parent["ts"] + parent["dur"] + 1e-6, (s, parent)
            stack.append(s)
    shown = sum(len(e["args"].get("changes", {})) for e in events if e["ph"] in "Xi")
    assert shown == len(truth.changes)
    some = next(e for e in slices if e["args"].get("changes"))
    assert all(" → " in v for v in some["args"]["changes"].values())


# What Perfetto's JSON importer does (google/perfetto, src/trace_processor/...), as rules
# a file must keep to load whole and with each slice on its object's track:
#  - importers/json/json_trace_tokenizer.cc: a top-level key it does not know, before
#    traceEvents, ended the parse in older versions; an event value that is an array made
#    the whole trace fail ("unsupported JSON dictionary with array"); an event other
#    than metadata without a numeric ts is dropped; ts is microseconds, read from its
#    text (older: digits shifted, so truncated to the ns) or as a double times 1000
#    rounded (newer: llround);
#  - importers/json/json_utils.cc (older): dur of an X event is a double times 1000,
#    truncated;
#  - sorter/trace_sorter.h: all events are sorted by ts; at equal ts, newer versions put
#    longer X events first and instants after them, older ones keep the file's order;
#  - importers/common/slice_tracker.cc (MaybeCloseStack): on a track, an open slice ends
#    before a later one starts at its end; a slice that starts inside another and ends
#    after it is dropped (slice_drop_overlapping_complete_event);
#  - importers/common/process_tracker.cc: threads are kept by tid and found again by
#    (tid, pid), each process gets a main thread whose tid is its pid; older parsers
#    (importers/json/json_trace_parser*.cc) named a thread (thread_name) by tid alone;
#  - util/json_parser.h (ScanString): a quote after a backslash is taken as escaped, so a
#    string ending in an escaped backslash is misread;
#  - util/json_utils.cc: args are flattened (nested dicts as dotted keys), null is
#    skipped, strings, int64, doubles and bools are kept.
INT64 = (-2 ** 63, 2 ** 63 - 1)


def _ns_readings(text):
    """The nanoseconds Perfetto's readers make of a JSON number written as ``text``."""
    assert "e" not in text.lower()
    whole, _, frac = text.partition(".")
    shifted = int((whole + (frac + "000")[:3]).lstrip("-") or "0")  # tokenizer, older
    d = float(text)
    truncated = int(d * 1000.0)                                       # json_utils, older
    rounded = int(d) * 1000 if d == int(d) else round(d * 1000.0)     # newer
    return {shifted, truncated, rounded}


def _ns(value):
    readings = _ns_readings(value if isinstance(value, str) else repr(value))
    assert len(readings) == 1, (value, readings)
    return readings.pop()


def _check_times_order_nesting(timed):
    """Times read back alike by every reader (set in ns on the events), in the sorter's
    order, and slices nesting on each track as the slice tracker stacks them."""
    for e in timed:
        e["ts"] = _ns(e["ts"])
        e["dur"] = _ns(e["dur"]) if e["ph"] == "X" else 0
    key = [(e["ts"], e["ph"] == "i", -e["dur"]) for e in timed]
    assert key == sorted(key)
    stacks = collections.defaultdict(list)
    for e in timed:
        stack = stacks[e["pid"], e["tid"]]
        while stack and (stack[-1]["ts"] + stack[-1]["dur"] < e["ts"] or (
                stack[-1]["ts"] + stack[-1]["dur"] == e["ts"]
                and not (stack[-1]["dur"] == 0 and e["dur"] == 0))):
            stack.pop()
        if stack:
            end = stack[-1]["ts"] + stack[-1]["dur"]
            assert not (e["ts"] < end < e["ts"] + e["dur"]), (e, stack[-1])
        stack.append(e)


def check_perfetto_file(text):
    """Assert ``text`` keeps the rules above; the events with times in ns."""
    data = json.loads(text, parse_float=str)
    assert list(data)[0] == "traceEvents"
    assert isinstance(data.get("metadata", {}), dict)
    assert "\\\\" not in text and "\x7f" not in text
    events = data["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    timed = [e for e in events if e["ph"] != "M"]
    assert events[:len(meta)] == meta  # names first
    for e in events:
        assert not any(isinstance(v, list) for v in e.values()), e
        assert all(0 <= e[k] < 2 ** 32 for k in ("pid", "tid")), e
    process_names = {e["pid"] for e in meta if e["name"] == "process_name"}
    # process metadata names the process's main thread, tid = pid (a missing tid is pid)
    assert all(e.get("tid", e["pid"]) == e["pid"] for e in meta if e["name"] != "thread_name")
    thread_names = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    # a tid belongs to one process and is no process's pid (its main thread)
    owner = {}
    for e in timed + [e for e in meta if e["name"] == "thread_name"]:
        assert owner.setdefault(e["tid"], e["pid"]) == e["pid"], e
    assert not set(owner) & process_names
    assert all((e["pid"], e["tid"]) in thread_names for e in timed)
    assert {e["pid"] for e in timed} <= process_names
    for e in timed:
        assert e["ph"] in ("X", "i") and (e["ph"] == "X" or e["s"] == "t"), e
    _check_times_order_nesting(timed)
    def leaves(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from leaves(v)
        else:
            yield value
    for e in events:
        for v in leaves(e.get("args", {})):
            assert isinstance(v, (str, bool, int)), (e, v)
            assert not isinstance(v, int) or INT64[0] <= v <= INT64[1], e
    return timed


def test_perfetto_file_loads_as_perfetto_reads_it(simulated, tmp_path):
    path, truth = simulated
    out = tmp_path / "sim.json"
    r = ctracer("export", path, "--format", "perfetto", "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    timed = check_perfetto_file(open(out, encoding="utf-8").read())
    # the simulation has real threads that touch several objects: each gets its own
    # thread track in each object's process, its real tid in the args
    objects_of = collections.defaultdict(set)
    for e in timed:
        objects_of[e["args"]["tid"]].add(e["pid"])
    assert max(map(len, objects_of.values())) > 1
    tracks = {(e["pid"], e["args"]["tid"]): e["tid"] for e in timed}
    assert len(set(tracks.values())) == len(tracks)


def test_perfetto_microseconds_read_back_exactly():
    from ctracer.export.perfetto import _us
    rng = random.Random(3)
    for ns in itertools.chain(range(0, 200_000), (rng.randrange(10 ** 15) for _ in range(20_000))):
        assert _ns(_us(ns)) == ns, ns
    # the plain quotient falls short of some: Perfetto's truncating reader lost 1 ns
    assert any(int(ns / 1000.0 * 1000.0) != ns for ns in range(0, 200_000))


def test_perfetto_order_and_nesting_on_a_track():
    from ctracer.export.perfetto import _in_order

    def ev(ph, name, tid=7):
        return {"ph": ph, "name": name, "pid": 1, "tid": tid, "args": {}}
    timed = [(100, 50, ev("X", "child")), (100, -1, ev("i", "mark")), (0, 300, ev("X", "parent")),
             (100, 200, ev("X", "mid")), (250, 100, ev("X", "crosses mid")),
             (300, 0, ev("X", "at end")), (120, 500, ev("X", "other track", tid=8))]
    out = _in_order(timed)
    assert [e["name"] for e in out] == ["parent", "mid", "child", "mark", "other track",
                                        "crosses mid", "at end"]
    crossing = out[5]
    assert _ns(crossing["ts"]) == 250 and _ns(crossing["dur"]) == 50  # cut at mid's end
    assert crossing["args"]["dur_ns"] == 100
    assert _ns(out[4]["dur"]) == 500 and "dur_ns" not in out[4]["args"]
    _check_times_order_nesting(json.loads(json.dumps(out), parse_float=str))


def test_perfetto_strings_perfetto_scans_safely(monkeypatch):
    from ctracer.export import perfetto
    tricky = {"traceEvents": [], "metadata": {"a": "ends in \\", "b": "del \x7f", "c": "q\\\"",
                                              "d": "\\\\n → ok"}}
    monkeypatch.setattr(perfetto, "perfetto_events", lambda trace: tricky)
    text = perfetto.perfetto_json(None)
    assert json.loads(text) == tricky
    assert "\\\\" not in text and "\x7f" not in text
    # a closing quote follows a backslash only when the quote is part of the string
    assert text.count('\\"') == 1 and '"q\\u005c\\""' in text


def test_parquet_file_schema(simulated, tmp_path):
    import pyarrow.parquet as pq
    path, truth = simulated
    out = tmp_path / "sim.parquet"
    r = ctracer("export", path, "--format", "parquet", "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t = pq.read_table(out)
    assert t.num_rows == truth.events
    want = ["time_ns", "cpu", "pid", "tid", "comm", "function", "phase", "object", "lifetime",
            "depth", "ret", "args", "changed", "changed_by", "unreadable"]
    assert t.column_names[:len(want)] == want
    assert t.column_names[-4:] == ["host", "kernel", "struct", "trace_id"]
    fields = [[f.name] + ([f.name + ":name"] if f.kind == "enum" else [])
              for f in MINI.ordered_fields]
    assert sum(fields, []) == t.column_names[len(want):-4]
    types = {f.name: str(f.type) for f in t.schema}
    assert types["time_ns"] == "int64" and types["pid"] == "int32"
    # a field's type is its kind's, whatever its width: u8, u16, s32 and u64 alike
    assert {types[n] for n in ("sk_common.skc_state", "sk_common.skc_family", "sk_refcnt",
                               "sk_stats.tx_bytes", "sk_prio_class")} == {"int64"}
    assert (types["sk_common.skc_reuse"], types["sk_user_data"], types["sk_name"],
            types["sk_common.skc_state:name"]) == ("bool", "string", "string", "string")
    states = dict(zip(t.column("sk_common.skc_state").to_pylist(),
                      t.column("sk_common.skc_state:name").to_pylist()))
    assert states and all(name == dict(TCP_STATES).get(v) for v, name in states.items()
                          if v is not None)
    assert {v[:2] for v in t.column("sk_user_data").to_pylist() if v} == {"0x"}
    assert pq.read_metadata(out).metadata[b"ctracer.export_schema"] == str(schema.SCHEMA_VERSION).encode()
    assert set(t.column("host").to_pylist()) == {"synthetic-host"}
    assert len(set(t.column("trace_id").to_pylist())) == 1


def test_two_hosts_hive_partitioned_and_queried_together(tmp_path):
    dataset = tmp_path / "dataset"
    truths = {}
    for n, host in enumerate(["web-1", "db-2"]):
        trace = tmp_path / f"{host}.ctrace"
        truths[host] = write_synthetic_trace(str(trace), threads=2, lifecycles=3 + n,
                                             seed=11 + n, host=host)
        r = ctracer("export", trace, "--format", "parquet", "-o", dataset, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    files = sorted(str(p.relative_to(dataset)) for p in dataset.rglob("*.parquet"))
    assert [f.rsplit("/", 1)[0] for f in files] == ["host=db-2/struct=sock",
                                                    "host=web-1/struct=sock"]
    # the common question: which function changed a field most, per host
    query = ("SELECT host, changed_by, field, count(*) AS changes "
             "FROM (SELECT host, changed_by, unnest(changed) AS field FROM events) "
             "GROUP BY ALL ORDER BY host, changes DESC, changed_by, field")
    r = ctracer("sql", "--json", query, dataset, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = {(d["host"], d["changed_by"], d["field"]): d["changes"]
           for d in map(json.loads, r.stdout.splitlines())}
    expected = collections.Counter((host, c.function, c.field)
                                   for host, t in truths.items() for c in t.changes)
    assert got == dict(expected)
    # events per host: a trace file and the other host's Parquet, together
    r = ctracer("sql", "--csv", "SELECT host, count(*) AS n FROM events GROUP BY 1 ORDER BY 1",
                tmp_path / "web-1.ctrace", dataset / "host=db-2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == [f"db-2,{truths['db-2'].events}",
                                         f"web-1,{truths['web-1'].events}"]


def test_names_from_the_trace_never_leave_the_output_directory(tmp_path):
    trace = tmp_path / "evil.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=1, host="../../escaped")
    db = sqlite3.connect(str(trace))
    db.execute("UPDATE meta SET value = '../../x' WHERE key = 'struct_name'")
    db.commit()
    db.close()
    dataset = tmp_path / "a" / "b" / "dataset"
    dataset.parent.mkdir(parents=True)
    r = ctracer("export", trace, "--format", "parquet", "-o", dataset, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != trace]
    assert written and all(dataset in p.parents for p in written), written
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in written)
    assert all((d.stat().st_mode & 0o777) == 0o700 for d in dataset.rglob("*") if d.is_dir())


def test_existing_output_is_kept_and_a_symlink_not_followed(simulated, tmp_path):
    path, _ = simulated
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out.jsonl"
    out.symlink_to(victim)
    r = ctracer("export", path, "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious" and not out.is_symlink()
    assert (tmp_path / "out.jsonl.old").is_symlink()


def test_incomplete_and_damaged_traces(simulated, tmp_path):
    path, _ = simulated
    killed = tmp_path / "killed.ctrace"
    killed.write_bytes(path.read_bytes())
    db = sqlite3.connect(str(killed))
    db.execute("UPDATE meta SET value = 'interrupted' WHERE key = 'state'")
    db.commit()
    db.close()
    r = ctracer("export", killed, "-o", tmp_path / "k.jsonl", cwd=tmp_path)
    assert r.returncode == 0 and "incomplete: the recorder was killed" in r.stderr
    junk = tmp_path / "junk.ctrace"
    junk.write_bytes(path.read_bytes()[:5000])
    for args in (["export", junk], ["sql", "SELECT 1", junk]):
        r = ctracer(*args, cwd=tmp_path)
        assert r.returncode != 0
        assert r.stderr.count("\n") == 1 and "is damaged: truncated" in r.stderr, r.stderr
    r = ctracer("sql", "SELEC nonsense", path, cwd=tmp_path)
    assert r.returncode != 0 and r.stderr.startswith("ctracer: error: SQL: ")


def test_tracepoint_hits_are_named_tp_with_their_arguments(tmp_path):
    from ctracer.event import PHASE_TRACEPOINT, Field, Layout
    from ctracer.tracefile import TraceWriter
    from ctracer.event import FunctionRow
    mini = Layout.packed_in_order("ctracer__mini_sock", [
        Field("__sk_common.skc_state", "u8", 0, "uint"),
        Field("__sk_common.skc_num", "u16", 0, "uint")])
    path = tmp_path / "tp.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=mini.to_json(),
               tracepoint_args={"1": [{"name": "oldstate", "ctype": "s64"},
                                      {"name": "newstate", "ctype": "s64"}]})
    w.add_functions([FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint")])
    for i, (old, new) in enumerate([(7, 2), (2, 1), (1, 4)]):
        w.add_event(ts_ns=100 + i, cpu=0, pid=0, tid=0, comm="swapper/0", function_id=1,
                    phase=PHASE_TRACEPOINT, object=0xFFFF888001234000, retval=None, depth=0,
                    flags=0, snapshot=encode(mini, {"__sk_common.skc_state": old,
                                                   "__sk_common.skc_num": 8080}),
                    args={"oldstate": old, "newstate": new})
    w.close()
    r = ctracer("export", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["function"] for e in lines] == ["tp:inet_sock_set_state"] * 3
    assert [e["phase"] for e in lines] == ["tracepoint"] * 3
    assert [e["args"] for e in lines] == [{"oldstate": 7, "newstate": 2},
                                          {"oldstate": 2, "newstate": 1},
                                          {"oldstate": 1, "newstate": 4}]
    assert all(e["fields"]["__sk_common.skc_state"] == e["args"]["oldstate"] for e in lines)
    assert {e["object"] for e in lines} == {"0xffff888001234000"}

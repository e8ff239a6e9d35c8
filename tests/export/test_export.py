"""`ctracer export` and `ctracer sql` against a simulation whose truth is known
(`synthetic_trace`): every event once, in time order, with the report's lifetimes,
depths and change attribution; Perfetto slices nest per track; Parquet files of two
hosts read as one table by DuckDB with the counts the simulation made."""

from __future__ import annotations

import collections
import csv
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from ctracer.report.build import build_report
from ctracer.tracefile import Trace
from synthetic_trace import MINI, write_synthetic_trace

JSONL_KEYS = ["time_ns", "cpu", "pid", "tid", "comm", "function", "probe", "object",
              "lifetime", "depth", "ret", "args", "fields"]


def ctracer(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "ctracer", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r


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
    report = build_report(Trace(str(path)))
    assert len(lines) == len(report.rows) == truth.events
    trace = Trace(str(path))
    snapshots = {e.seq: e.snapshot for e in trace.events()}
    for e, row in zip(lines, report.rows):
        assert e["time_ns"] == row.ts_ns and e["tid"] == row.tid and e["comm"] == row.comm
        assert e["function"] == report.function_names[row.function_id]
        assert e["probe"] == ("entry" if row.phase == 0 else "exit")
        assert e["object"] == (f"0x{row.address:x}" if row.address else None)
        assert e["lifetime"] == (row.obj.lifetime if row.obj else 0)
        assert e["depth"] == row.depth and e["ret"] == row.retval and e["args"] is None
        snapshot = snapshots[row.seq]
        assert e["fields"] == (None if snapshot is None else MINI.decode(snapshot))
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
    assert all(n.startswith("struct sock 0x") for n in names.values())
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


def test_parquet_file_schema(simulated, tmp_path):
    import pyarrow.parquet as pq
    path, truth = simulated
    out = tmp_path / "sim.parquet"
    r = ctracer("export", path, "--format", "parquet", "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t = pq.read_table(out)
    assert t.num_rows == truth.events
    want = ["time_ns", "cpu", "pid", "tid", "comm", "function", "probe", "object", "lifetime",
            "depth", "ret", "args", "changed", "changed_by", "unreadable"]
    assert t.column_names[:len(want)] == want
    assert t.column_names[-4:] == ["host", "kernel", "struct", "trace_id"]
    assert [f.name for f in MINI.ordered_fields] == t.column_names[len(want):-4]
    assert str(t.schema.field("time_ns").type) == "int64"
    assert str(t.schema.field("sk_stats.tx_bytes").type) == "uint64"
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
    from ctracer.tracefile import FunctionRow, TraceWriter
    mini = Layout.packed_in_order("ctracer__mini_sock", [
        Field("__sk_common.skc_state", "u8", 0, "uint"),
        Field("__sk_common.skc_num", "u16", 0, "uint")])
    path = tmp_path / "tp.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=mini.to_json(),
               tracepoint_args={"1": [{"name": "oldstate", "ctype": "s64"},
                                      {"name": "newstate", "ctype": "s64"}]})
    w.add_functions([FunctionRow(1, "inet_sock_set_state", reach="tracepoint")])
    for i, (old, new) in enumerate([(7, 2), (2, 1), (1, 4)]):
        w.add_event(ts_ns=100 + i, cpu=0, pid=0, tid=0, comm="swapper/0", function_id=1,
                    phase=PHASE_TRACEPOINT, object=0xFFFF888001234000, retval=None, depth=0,
                    flags=0, snapshot=mini.encode({"__sk_common.skc_state": old,
                                                   "__sk_common.skc_num": 8080}),
                    args={"oldstate": old, "newstate": new})
    w.close()
    r = ctracer("export", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["function"] for e in lines] == ["tp:inet_sock_set_state"] * 3
    assert [e["probe"] for e in lines] == ["tracepoint"] * 3
    assert [e["args"] for e in lines] == [{"oldstate": 7, "newstate": 2},
                                          {"oldstate": 2, "newstate": 1},
                                          {"oldstate": 1, "newstate": 4}]
    assert all(e["fields"]["__sk_common.skc_state"] == e["args"]["oldstate"] for e in lines)
    assert {e["object"] for e in lines} == {"0xffff888001234000"}

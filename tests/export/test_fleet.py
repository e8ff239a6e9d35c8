"""Fleet exports: one Parquet schema for every kernel and build, as docs/exports-and-fleet.md documents
it (the tables are read from that page and compared with the code and with real
files); `export --host`; the docs' fleet questions run by `ctracer sql` over many
hosts' exports, against the truth of simulations; bad datasets refused in one line.

Two traces of one struct whose layouts differ as two kernels' do — a member widened
(u16 on one, u32 on the other), one member only on the second — are written here
directly (`TraceWriter`); Spark reads real recordings of two builds in test_spark.py.
"""

from __future__ import annotations

from support.encoding import encode
import collections
import csv
import io
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ctracer.event import PHASE_ENTRY, PHASE_EXIT, Field, Layout
from ctracer.export import schema
from ctracer.tracefile import TraceWriter
from ctracer.event import FunctionRow
from support.synthetic_trace import write_synthetic_trace

DOC = Path(__file__).resolve().parents[2] / "docs" / "exports-and-fleet.md"


def ctracer(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "ctracer", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def one_line_error(r):
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("ctracer: error: "), r.stderr
    return r.stderr


# -- the docs' text -----------------------------------------------------------------

def doc_section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"### {title}")
    end = re.compile(r"\n#{2,4} ").search(text, start + 1)  # the next heading
    return text[start:end.start() if end else None]


def doc_table(section: str, first_header: str) -> list[list[str]]:
    """The rows of the Markdown table in ``section`` whose first header is ``first_header``."""
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def doc_code(title: str, lang: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", doc_section(title), re.S)
    assert len(blocks) == 1, blocks
    return blocks[0]


def doc_sql_commands() -> list[str]:
    """The queries of the docs' `ctracer sql` examples in "Fleet questions"."""
    words = shlex.split(doc_code("Fleet questions", "sh"), comments=True)
    queries = [words[i + 2] for i, w in enumerate(words) if w == "ctracer" and words[i + 1] == "sql"]
    assert len(queries) == 2
    return queries


def doc_spark_statements(location: str) -> list[str]:
    """The docs' Spark SQL, its dataset at ``location``, one statement each."""
    text = doc_code("Fleet questions", "sql")
    assert text.count("'s3://traces/dataset/'") == 1
    text = text.replace("'s3://traces/dataset/'", "'" + location + "'")
    text = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    return [s.strip() for s in text.split(";") if s.strip()]


def test_the_docs_give_the_schema_the_code_writes():
    section = doc_section("The export schema")
    assert f"(version {schema.SCHEMA_VERSION})" in section.splitlines()[0]
    header = [(c.strip("`"), t, m) for c, t, m in doc_table(section, "column")]
    assert header == [tuple(h) for h in schema.HEADER]
    by_member = {m: (t, extra) for m, t, extra in doc_table(section, "member")}
    kinds = {"signed integer": ["int"], "unsigned integer": ["uint"], "char": ["char"],
             "enum": ["enum"], "bool": ["bool"], "float, double": ["float"],
             "pointer (`--pointers`)": ["pointer"],
             "char array, `struct in6_addr`": ["text", "ipv6"]}
    decoded = {"port": "port in network order", "ipv4": "IPv4 address in network order"}
    for display, (_, type_name) in schema.DECODED.items():
        member = next(m for m in by_member if m.startswith(decoded[display]))
        written, beside = by_member.pop(member)
        assert written == type_name, member
        assert f"`PATH{schema.RAW}` {schema.COMPANION_TYPES[schema.RAW]}" in beside
    for member, (type_name, _) in by_member.items():
        for kind in kinds.get(member, ["uint"]):  # the flag word's row: an unsigned integer
            assert schema.FIELD_TYPES[kind] == type_name, member
    assert set(sum(kinds.values(), [])) == set(schema.FIELD_TYPES)
    assert f"`PATH{schema.ENUM_NAME}` {schema.COMPANION_TYPES[schema.ENUM_NAME]}" \
        in by_member["enum"][1]
    flags = next(extra for member, (_, extra) in by_member.items() if member.startswith("flag"))
    assert f"`PATH{schema.FLAG_BITS}` {schema.COMPANION_TYPES[schema.FLAG_BITS]}" in flags
    prose = " ".join(section.split())
    for name, type_name, _ in schema.TRACE:
        assert f"`{name}` ({type_name}" in prose, name
    assert "the partition keys `host` and `struct`" in prose and schema.PARTITIONS == (
        "host", "struct")


# -- two layouts of one struct -----------------------------------------------------------

TCP = ((1, "TCP_ESTABLISHED"), (7, "TCP_CLOSE"))
BITS = [[0, "SOCK_DEAD"], [1, "SOCK_DONE"], [63, "SOCK_TOP"]]


def layout(wide: bool) -> Layout:
    fields = [
        Field("sk_common.skc_state", "u8", 0, "enum", TCP),
        Field("sk_window", "u32" if wide else "u16", 0, "uint"),
        Field("sk_err", "s16" if wide else "s32", 0, "int"),
        Field("sk_flags", "u64", 0, "uint", source={"bits": BITS}),
        Field("sk_dead", "u8", 0, "bool"),
        Field("sk_rate", "double", 0, "float"),
        Field("sk_user_data", "u64", 0, "pointer"),
        Field("sk_name", "char[8]" if wide else "char[4]", 0, "text"),
        Field("sk_v6", "char[16]", 0, "ipv6"),
        Field("sk_prio", "u8", 0, "char"),
    ]
    if wide:
        fields.append(Field("sk_ino", "u64", 0, "uint"))
    return Layout.packed_in_order("ctracer__mini_sock", fields)


def values(wide: bool, i: int) -> dict:
    v = {"sk_common.skc_state": (7, 1, 9)[i % 3], "sk_window": 70000 + i if wide else 1000 + i,
         "sk_err": -i, "sk_flags": (1 << 63) | (i & 3), "sk_dead": i & 1,
         "sk_rate": 0.5 * i, "sk_user_data": 0xFFFF888000000000 + i if i else 0,
         "sk_name": f"n{i}", "sk_v6": "::1", "sk_prio": 65 + i}
    if wide:
        v["sk_ino"] = 2 ** 64 - 1
    return v


def write_layout_trace(path, wide: bool, calls: int, kernel: str) -> list[dict]:
    mini = layout(wide)
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=mini.to_json(),
               host="same-name", kernel_release=kernel)
    w.add_functions([FunctionRow(1, "tcp_set_state"), FunctionRow(2, "tcp_close")])
    written = []
    for i in range(calls):
        before, after = values(wide, 2 * i), values(wide, 2 * i + 1)
        fid = 1 + i % 2
        for phase, v, ts in ((PHASE_ENTRY, before, 2 * i), (PHASE_EXIT, after, 2 * i + 1)):
            w.add_event(ts_ns=1000 + ts, cpu=0, pid=7, tid=7, comm="app", function_id=fid,
                        phase=phase, object=0xFFFF888001234000, depth=0, flags=0,
                        retval=0 if phase == PHASE_EXIT else None, snapshot=encode(mini, v))
            written.append(v)
    w.close()
    return written


@pytest.fixture(scope="module")
def two_layouts(tmp_path_factory):
    """A dataset of two hosts named alike (`--host` keeps them apart): host narrow,
    kernel 6.1, 3 calls; host wide, kernel 6.12, 4 calls."""
    d = tmp_path_factory.mktemp("fleet")
    dataset = d / "dataset"
    written = {}
    for host, wide, calls, kernel in (("narrow", False, 3, "6.1.0-a"), ("wide", True, 4, "6.12.0-b")):
        trace = d / f"{host}.ctrace"
        written[host] = write_layout_trace(trace, wide, calls, kernel)
        r = ctracer("export", trace, "--format", "parquet", "--host", host, "-o", dataset, cwd=d)
        assert r.returncode == 0, r.stderr
    return dataset, written


def test_a_column_has_one_type_whatever_the_width_and_missing_members_are_null(two_layouts):
    import pyarrow.parquet as pq
    dataset, written = two_layouts
    files = sorted(dataset.rglob("*.parquet"))
    assert [f.parent.relative_to(dataset).as_posix() for f in files] == [
        "host=narrow/struct=sock", "host=wide/struct=sock"]
    schemas = [{f.name: str(f.type) for f in pq.read_schema(p)} for p in files]
    narrow, wide = schemas
    assert set(wide) - set(narrow) == {"sk_ino"}
    assert {k: v for k, v in wide.items() if k != "sk_ino"} == narrow  # same names, same types
    header = {name: type_name for name, type_name, _ in schema.HEADER}
    want = {**{n: header[n].replace("list<string>", "list<element: string>") for n in header},
            "sk_common.skc_state": "int64", "sk_common.skc_state:name": "string",
            "sk_window": "int64", "sk_err": "int64", "sk_flags": "int64",
            "sk_flags:bits": "list<element: string>", "sk_dead": "bool", "sk_rate": "double",
            "sk_user_data": "string", "sk_name": "string", "sk_v6": "string",
            "sk_prio": "int64", "sk_ino": "int64", "kernel": "string", "trace_id": "string"}
    assert wide == want
    for p in files:
        meta = pq.read_metadata(p).metadata
        assert meta[b"ctracer.export_schema"] == str(schema.SCHEMA_VERSION).encode()
        assert meta[b"ctracer.struct"] == b"sock"
        ctypes = {f["name"]: f["ctype"] for f in json.loads(meta[b"ctracer.fields"])}
        assert ctypes["sk_window"] == ("u32" if "wide" in str(p) else "u16")

    # DuckDB, union by name: both hosts, each value as recorded, NULL where a member is missing
    query = ('SELECT host, kernel, "sk_window", "sk_err", "sk_flags", "sk_flags:bits", '
             '"sk_common.skc_state", "sk_common.skc_state:name", "sk_dead", "sk_rate", '
             '"sk_user_data", "sk_name", "sk_v6", "sk_prio", "sk_ino", '
             'if("sk_ino" < 0, "sk_ino" + 18446744073709551616, "sk_ino") AS ino_unsigned '
             "FROM events ORDER BY host, time_ns")
    r = ctracer("sql", "--json", query, dataset, cwd=dataset.parent)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    expected = []
    names = dict(TCP)
    for host, kernel in (("narrow", "6.1.0-a"), ("wide", "6.12.0-b")):
        for v in written[host]:
            flags = v["sk_flags"]
            expected.append({
                "host": host, "kernel": kernel, "sk_window": v["sk_window"],
                "sk_err": v["sk_err"], "sk_flags": flags - 2 ** 64,  # two's complement
                "sk_flags:bits": [n for b, n in BITS if flags >> b & 1],
                "sk_common.skc_state": v["sk_common.skc_state"],
                "sk_common.skc_state:name": names.get(v["sk_common.skc_state"]),
                "sk_dead": bool(v["sk_dead"]), "sk_rate": v["sk_rate"],
                "sk_user_data": f"0x{v['sk_user_data']:x}",
                "sk_name": v["sk_name"][:4 if host == "narrow" else 8], "sk_v6": "::1",
                "sk_prio": v["sk_prio"],
                "sk_ino": -1 if host == "wide" else None,
                "ino_unsigned": 2 ** 64 - 1 if host == "wide" else None})
    assert rows == expected
    assert any(r["sk_window"] > 65535 for r in rows)  # the widened member's values
    assert any(r["sk_common.skc_state:name"] is None for r in rows)  # 9: no enumerator


def test_a_trace_file_queries_in_the_export_schema(two_layouts, tmp_path):
    dataset, _ = two_layouts
    trace = tmp_path / "w.ctrace"
    write_layout_trace(trace, True, 2, "6.12.0-b")
    query = "SELECT column_name, column_type FROM (DESCRIBE events) ORDER BY column_name"
    from_trace = ctracer("sql", "--csv", query, trace, cwd=tmp_path)
    from_export = ctracer("sql", "--csv", query, dataset / "host=wide", cwd=tmp_path)
    assert from_trace.returncode == 0 and from_export.returncode == 0
    assert from_trace.stdout == from_export.stdout
    assert "sk_window,BIGINT" in from_trace.stdout.splitlines()


def test_the_docs_fleet_questions_over_many_hosts(tmp_path):
    dataset = tmp_path / "dataset"
    truths = {}
    hosts = (("web-1", "6.1.0-50-amd64"), ("web-2", "6.12.43+deb12-amd64"),
             ("db-1", "6.12.43+deb12-amd64"))
    for n, (host, kernel) in enumerate(hosts):
        trace = tmp_path / f"{host}.ctrace"
        truths[host, kernel] = write_synthetic_trace(
            str(trace), threads=2, lifecycles=2 + n, seed=21 + n, host="box", kernel=kernel)
        r = ctracer("export", trace, "--format", "parquet", "--host", host, "-o", dataset,
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    calls_query, changes_query = doc_sql_commands()

    r = ctracer("sql", "--json", calls_query, dataset, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line) for line in r.stdout.splitlines()]
    expected = sorted(({"host": h, "kernel": k, "function": f, "calls": c}
                       for (h, k), t in truths.items() for f, c in t.calls.items()),
                      key=lambda d: (d["host"], d["kernel"], -d["calls"], d["function"]))
    assert got == expected

    r = ctracer("sql", "--json", changes_query, dataset, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = {(d["host"], d["kernel"], d["field"]): (d["changed_by"], d["changes"])
           for d in map(json.loads, r.stdout.splitlines())}
    expected = {}
    for (h, k), t in truths.items():
        per = collections.Counter((c.field, c.function) for c in t.changes)
        for field in {c.field for c in t.changes}:
            ranked = sorted(((n, fn) for (f, fn), n in per.items() if f == field),
                            key=lambda p: (-p[0], p[1] is None, p[1] or ""))
            expected[h, k, field] = (ranked[0][1], ranked[0][0])
    assert got == expected
    assert len({k for _, k, _ in got}) == 2


def _as_schema_2(path: Path) -> None:
    """Rewrite the export at ``path`` as ctracer wrote it with export schema 2: the
    event's kind in a column named ``probe``, the file saying schema 2."""
    import pyarrow.parquet as pq
    table = pq.read_table(path)
    assert "probe" not in table.column_names
    table = table.rename_columns(["probe" if n == "phase" else n for n in table.column_names])
    meta = dict(pq.read_metadata(path).metadata)
    meta[b"ctracer.export_schema"] = b"2"
    with pq.ParquetWriter(path, table.schema, store_schema=False) as w:
        w.write_table(table)
        w.add_key_value_metadata(meta)


def test_exports_of_schema_2_and_3_merge_into_one_phase_column(two_layouts, tmp_path):
    dataset, written = two_layouts
    mixed = tmp_path / "dataset"
    for p in dataset.rglob("*.parquet"):
        target = mixed / p.relative_to(dataset)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(p.read_bytes())
    old = next((mixed / "host=narrow").rglob("*.parquet"))
    _as_schema_2(old)
    query = ("SELECT kernel, phase, count(*) AS n FROM events GROUP BY ALL "
             "ORDER BY kernel, phase")
    want = [{"kernel": k, "phase": p, "n": len(written[h]) // 2}
            for h, k in (("narrow", "6.1.0-a"), ("wide", "6.12.0-b")) for p in ("entry", "exit")]
    # the directory (one union_by_name read) and the two files named one by one
    for inputs in ([mixed], [old, next((mixed / "host=wide").rglob("*.parquet"))]):
        r = ctracer("sql", "--json", query, *inputs, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert [json.loads(line) for line in r.stdout.splitlines()] == want, inputs
    # one column, where the new schema puts it; the old name is gone from the view
    r = ctracer("sql", "--csv", "SELECT column_name FROM (DESCRIBE events)", mixed, cwd=tmp_path)
    columns = r.stdout.split()[1:]
    assert "probe" not in columns and columns.index("phase") == [
        name for name, _, _ in schema.HEADER].index("phase")
    # an old file alone reads the same way
    r = ctracer("sql", "--csv", "SELECT DISTINCT phase FROM events ORDER BY 1", old, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["phase", "entry", "exit"], r.stderr


# -- bad input ---------------------------------------------------------------------------

def test_export_into_another_structs_partition_is_one_line(two_layouts, tmp_path):
    dataset, _ = two_layouts
    trace = tmp_path / "s.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=1)
    db = sqlite3.connect(str(trace))
    db.execute("UPDATE meta SET value = 'sk_buff' WHERE key = 'struct_name'")
    db.commit()
    db.close()
    before = sorted(dataset.rglob("*"))
    err = one_line_error(ctracer("export", trace, "-f", "parquet", "-o",
                                 dataset / "host=wide" / "struct=sock", cwd=tmp_path))
    assert "the partition of struct sock, not sk_buff" in err
    err = one_line_error(ctracer("export", trace, "-f", "parquet", "-o",
                                 dataset / "host=wide", cwd=tmp_path))
    assert "a partition folder of a dataset (host=wide)" in err
    assert sorted(dataset.rglob("*")) == before


def test_a_file_filed_under_another_struct_is_one_line(two_layouts, tmp_path):
    dataset, _ = two_layouts
    copy = tmp_path / "dataset"
    source = next((dataset / "host=wide" / "struct=sock").glob("*.parquet"))
    (copy / "host=wide" / "struct=sk_buff").mkdir(parents=True)
    (copy / "host=wide" / "struct=sk_buff" / source.name).write_bytes(source.read_bytes())
    err = one_line_error(ctracer("sql", "SELECT count(*) FROM events", copy, cwd=tmp_path))
    assert "holds an export of struct sock but is filed under struct=sk_buff" in err


def _rewrite_version(path: Path, version: str) -> None:
    import pyarrow.parquet as pq
    table = pq.read_table(path)
    meta = dict(pq.read_metadata(path).metadata)
    meta[b"ctracer.export_schema"] = version.encode()
    with pq.ParquetWriter(path, table.schema, store_schema=False) as w:
        w.write_table(table)
        w.add_key_value_metadata(meta)


def test_a_schema_from_a_newer_ctracer_is_one_line(two_layouts, tmp_path):
    dataset, _ = two_layouts
    copy = tmp_path / "dataset"
    for p in dataset.rglob("*.parquet"):
        target = copy / p.relative_to(dataset)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(p.read_bytes())
    newer = next(copy.rglob("*.parquet"))
    _rewrite_version(newer, str(schema.SCHEMA_VERSION + 1))
    for inputs in ([copy], [newer]):
        err = one_line_error(ctracer("sql", "SELECT count(*) FROM events", *inputs, cwd=tmp_path))
        assert f"written by a newer ctracer (export schema {schema.SCHEMA_VERSION + 1}" in err
    # and an export into that dataset is refused before writing
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=1)
    err = one_line_error(ctracer("export", trace, "-f", "parquet", "-o", copy, cwd=tmp_path))
    assert "newer ctracer" in err
    assert not any("synthetic-host" in str(p) for p in copy.rglob("*"))
    _rewrite_version(newer, "two")
    err = one_line_error(ctracer("sql", "SELECT 1", newer, cwd=tmp_path))
    assert "export schema two" in err


def test_host_option_is_checked(tmp_path):
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=1)
    for fmt, host, says in (("parquet", "../up", "a host name is letters"),
                            ("parquet", "", "a host name is letters"),
                            ("jsonl", "web-1", "jsonl has none")):
        err = one_line_error(ctracer("export", trace, "-f", fmt, "--host", host, "-o",
                                     tmp_path / "out", cwd=tmp_path))
        assert says in err, err
    assert not os.path.exists(tmp_path / "out")
    r = ctracer("export", trace, "-f", "csv", "--host", "web-1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert rows and {row["host"] for row in rows} == {"web-1"}

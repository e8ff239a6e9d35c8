"""Spark (pyspark, local mode, Debian's JDK) reads many hosts' exports as one table.

Two builds of one C program (tests/fixtures/export/conn.c) whose struct differs as two
kernels' structs do — ``-DWIDE`` widens ``window`` from unsigned short to unsigned int
and adds ``retrans`` — are recorded with real uprobes, exported with ``--host`` into one
directory, and read by Spark with ``mergeSchema`` running the docs' own Spark SQL
("Fleet questions"), whose answers must equal `ctracer sql`'s running the docs'
DuckDB queries, and the calls the program made.  One local SparkSession serves the
module (its JVM start is most of the cost).
"""

from __future__ import annotations

from support import bpfcheck
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c
from sparkrun import spark, spark_answers as _spark_answers  # noqa: F401 (a fixture)
from test_fleet import doc_spark_statements, doc_sql_commands

pytestmark = pytest.mark.bpf

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "export" / "conn.c"
#: (host, build flags, connections, sends per connection)
BUILDS = (("build-narrow", (), 3, 4), ("build-wide", ("-DWIDE",), 5, 2))


def ctracer(*args, cwd, env=None):
    r = subprocess.run([sys.executable, "-m", "ctracer", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, timeout=300, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _bpf_skip_reason(exe: Path) -> str:
    if os.geteuid() != 0:
        return "not root: loading BPF programs and uprobes needs root"
    from ctracer.errors import CtracerError
    from ctracer.record import bpf_runtime
    try:
        bpfcheck.uprobe_self_test(str(exe), "main")
    except CtracerError as e:
        return str(e)
    return ""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Both builds recorded (real uprobes) and exported into one directory."""
    started = time.monotonic()
    d = tmp_path_factory.mktemp("spark")
    env = {**os.environ, "XDG_CACHE_HOME": str(d / "cache")}
    out = d / "dataset"
    for host, flags, conns, sends in BUILDS:
        exe = d / host
        compile_c(SOURCE, exe, Build(opt=2, flags=flags))
        reason = _bpf_skip_reason(exe)
        if reason:
            pytest.skip(reason)
        trace = d / f"{host}.ctrace"
        r = ctracer("trace", "conn", "--binary", exe, "-o", trace, "--", exe, conns, sends,
                    cwd=d, env=env)
        assert r.returncode == 0, r.stderr
        r = ctracer("export", trace, "--format", "parquet", "--host", host, "-o", out, cwd=d)
        assert r.returncode == 0, r.stderr
    print(f"dataset: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return out


def test_spark_reads_two_layouts_as_ctracer_sql_does(spark, dataset, tmp_path):
    started = time.monotonic()
    calls, changes = _spark_answers(spark, str(dataset))
    spark_seconds = time.monotonic() - started

    # the calls the programs made, per host
    kernel = os.uname().release
    truth = sorted(({"host": host, "kernel": kernel, "function": f, "calls": n}
                    for host, _, conns, sends in BUILDS
                    for f, n in (("conn_open", conns), ("conn_send", conns * sends),
                                 ("conn_close", conns))),
                   key=lambda d: (d["host"], d["kernel"], -d["calls"], d["function"]))
    assert calls == truth

    duck_calls, duck_changes = [
        [json.loads(line) for line in ctracer("sql", "--json", q, dataset, cwd=tmp_path)
         .stdout.splitlines()] for q in doc_sql_commands()]
    assert duck_calls == calls
    assert duck_changes == changes
    best = {(d["host"], d["field"]): (d["changed_by"], d["changes"]) for d in changes}
    assert best["build-wide", "retrans"] == ("conn_send", 5)   # only the wide build has it
    assert ("build-narrow", "retrans") not in best
    assert best["build-narrow", "bytes"] == ("conn_send", 12)
    print(f"the docs' Spark SQL: {spark_seconds:.1f} s", file=sys.stderr)


def test_spark_merged_schema_has_one_type_per_member(spark, dataset):
    statements = doc_spark_statements(str(dataset))
    for statement in statements[:2]:  # the SET and the view
        spark.sql(statement)
    types = dict(spark.table("events").dtypes)
    assert (types["window"], types["retrans"], types["state"], types["state:name"],
            types["ready"], types["name"], types["host"]) == (
        "bigint", "bigint", "bigint", "string", "boolean", "string", "string")
    assert types["peer.port"] == "bigint"
    rows = spark.sql("SELECT host, max(window) AS top, count(retrans) AS retrans, "
                     "count(*) AS events, collect_set(`state:name`) AS states, "
                     "max(`peer.port`) AS port FROM events GROUP BY host ORDER BY host").collect()
    got = [(r.host, r.top, r.retrans, r.events, sorted(r.states), r.port) for r in rows]
    states = ["CONN_CLOSED", "CONN_IDLE", "CONN_OPEN"]
    assert got == [("build-narrow", 1002, 0, 2 * 3 * 6, states, 8002),
                   ("build-wide", 70004, 2 * 5 * 4, 2 * 5 * 4, states, 8004)]

"""Two kernels' exports read as one fleet: Debian's 6.1 and 6.12 guests each export their
tracepoint trace of ``struct sock`` (tests/vm/test_trace.py,
``test_export_shared_for_the_fleet``, ``--host guest-KERNEL``) into their share
directory; here, once both guests have finished, Spark (local mode, ``mergeSchema``)
runs the docs' fleet SQL over both exports as one dataset, whose struct sock differs
between the kernels (members only one has, members whose width changed), and its
answers must equal ``ctracer sql``'s over the same files and the hits each guest's trace
holds; a member one kernel lacks reads as NULL on that host's rows."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from sparkrun import spark, spark_answers  # noqa: F401 (a fixture)
from test_fleet import doc_spark_statements, doc_sql_commands

pytestmark = pytest.mark.after_guests
SHARED_BY = "test_export_shared_for_the_fleet"  # the guests whose shares this reads


@pytest.fixture(scope="module")
def fleet(guest_shares, tmp_path_factory):
    """Both guests' exports under one directory, and what each guest's trace held."""
    out = tmp_path_factory.mktemp("fleet") / "dataset"
    facts = {}
    for kernel, share in guest_shares.items():
        found = share / f"fleet-{kernel}.json"
        if not found.exists():
            pytest.fail(f"the {kernel} guest shared no export (its "
                        "test_export_shared_for_the_fleet did not pass; see its vm tests)")
        facts[kernel] = json.loads(found.read_text())
        shutil.copytree(share / "fleet", out, dirs_exist_ok=True)
    if len(facts) < 2:
        pytest.skip(f"only the {', '.join(facts)} guest ran in this session")
    return out, facts


def _ctracer_sql(query: str, dataset) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "ctracer", "sql", "--json", query, str(dataset)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_spark_reads_two_kernels_as_ctracer_sql_does(fleet, spark):
    dataset, facts = fleet
    calls, changes = spark_answers(spark, str(dataset))
    truth = sorted(({"host": f["host"], "kernel": f["kernel"], "function": fn, "calls": n}
                    for f in facts.values() for fn, n in f["calls"].items()),
                   key=lambda d: (d["host"], d["kernel"], -d["calls"], d["function"]))
    assert calls == truth
    duck_calls, duck_changes = [_ctracer_sql(q, dataset) for q in doc_sql_commands()]
    assert duck_calls == calls
    assert duck_changes == changes
    # the state of a socket is changed where the tracepoint announces it, on both kernels
    state = {d["host"]: d["changed_by"] for d in changes if d["field"] == "__sk_common.skc_state"}
    assert state == {f["host"]: "tp:inet_sock_set_state" for f in facts.values()}


def test_a_member_one_kernel_lacks_reads_null_on_its_rows(fleet, spark):
    dataset, facts = fleet
    for statement in doc_spark_statements(str(dataset))[:2]:  # the SET and the view
        spark.sql(statement)
    (a, fa), (b, fb) = sorted(facts.items())
    only = {k: sorted(set(f["fields"]) - set(other["fields"]))
            for k, f, other in ((a, fa, fb), (b, fb, fa))}
    assert only[a] or only[b], "the two kernels' struct sock have the same members"
    columns = set(spark.table("events").columns)
    for kernel, members in only.items():
        other = fb["host"] if kernel == a else fa["host"]
        for member in members[:5]:
            assert member in columns, member
            row = spark.sql(f"SELECT count(`{member}`) AS n FROM events "
                            f"WHERE host = '{other}'").collect()[0]
            assert row.n == 0, (member, other)
    print(f"members only in {a}: {only[a][:8]}; only in {b}: {only[b][:8]}")

"""One option name, one meaning across subcommands (docs/architecture.md, "Command-line
words"), and the old spellings a released version used still accepted as hidden aliases:
``ctracer callgraph`` for ``ctracer report``, ``trace --max-objects`` for
``trace --max-followed``, ``sql --csv``/``--json`` for ``sql --format csv|json``,
``functions --reach`` for ``functions --route-kind``."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from ctracer import cli
from support.synthetic_trace import write_synthetic_trace


def ctracer(tmp_path, *args):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("CTRACER_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("words") / "synthetic.ctrace"
    write_synthetic_trace(str(path), lifecycles=4)
    return path


# -- report, and callgraph its old name ---------------------------------------------------

@pytest.mark.parametrize("name", ["report", "callgraph"])
def test_report_and_its_old_name_render_the_same_report(tmp_path, trace, name):
    out = tmp_path / name
    r = ctracer(tmp_path, name, str(trace), "-o", str(out), "--no-plots", "--max-objects", "1")
    assert r.returncode == 0, r.stderr
    index = (out / "index.html").read_text()
    # --max-objects in the report is the page limit: pages for the busiest object only
    assert "pages were written for the 1 busiest of" in index


def test_help_lists_report_and_callgraph_only_as_its_old_name(tmp_path):
    r = ctracer(tmp_path, "--help")
    assert r.returncode == 0
    assert "report (callgraph)" in r.stdout
    assert "ctracer report sock.ctrace" in r.stdout and "ctracer callgraph" not in r.stdout
    assert cli._subcommand(["callgraph", "x.ctrace"]) == "report"
    assert cli._subcommand(["--debug", "report", "x.ctrace"]) == "report"


# -- trace --max-followed, and --max-objects its old spelling -----------------------------

def _trace_args(*words):
    return cli.build_parser("trace").parse_args(["trace", "struct", "sock", *words])


def test_trace_max_followed_and_its_old_spelling_set_the_admission_limit():
    assert _trace_args("--max-followed", "3").max_followed == 3
    assert _trace_args("--max-objects", "4").max_followed == 4
    assert _trace_args().max_followed is None
    from ctracer.commands.trace import request_from_args
    args = _trace_args("--max-followed", "5")
    assert request_from_args(args, None, "sock").max_objects == 5


def test_trace_help_names_max_followed_not_the_old_spelling(tmp_path):
    r = ctracer(tmp_path, "trace", "--help")
    assert r.returncode == 0
    assert "--max-followed N" in r.stdout and "--max-objects" not in r.stdout


def test_trace_max_followed_is_refused_for_a_program_by_its_new_name(tmp_path):
    for spelling in ("--max-followed", "--max-objects"):
        r = ctracer(tmp_path, "trace", "struct", "sock", "--print-bpf",
                    "--binary", sys.executable, spelling, "2")
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "--max-followed select kernel objects" in r.stderr, r.stderr


# -- sql --format, and --csv/--json its old spellings --------------------------------------

QUERY = "SELECT function, count(*) AS n FROM events GROUP BY 1 ORDER BY 1"


def test_sql_format_csv_json_table(tmp_path, trace):
    as_csv = ctracer(tmp_path, "sql", "--format", "csv", QUERY, str(trace))
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows[0] == ["function", "n"] and len(rows) > 2
    as_json = ctracer(tmp_path, "sql", "-f", "json", QUERY, str(trace))
    assert as_json.returncode == 0, as_json.stderr
    objects = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [[o["function"], str(o["n"])] for o in objects] == rows[1:]
    table = ctracer(tmp_path, "sql", QUERY, str(trace))
    assert table.stdout == ctracer(tmp_path, "sql", "--format", "table", QUERY, str(trace)).stdout
    assert table.stdout != as_csv.stdout and rows[1][0] in table.stdout


@pytest.mark.parametrize("old, new", [("--csv", "csv"), ("--json", "json")])
def test_sql_old_flags_are_aliases_of_format(tmp_path, trace, old, new):
    a = ctracer(tmp_path, "sql", old, QUERY, str(trace))
    b = ctracer(tmp_path, "sql", "--format", new, QUERY, str(trace))
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout


def test_sql_help_names_format_not_the_old_flags(tmp_path):
    r = ctracer(tmp_path, "sql", "--help")
    assert "--format {table,csv,json}" in r.stdout
    assert "--csv" not in r.stdout.replace("--format csv", "") and "--json" not in r.stdout


@pytest.mark.parametrize("words", [["--format", "xml"], ["--csv", "--format", "json"]])
def test_sql_bad_format_is_one_line(tmp_path, trace, words):
    r = ctracer(tmp_path, "sql", *words, QUERY, str(trace))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- functions --route-kind, and --reach its old spelling -----------------------------------

def test_functions_route_kind_and_its_old_spelling_choose_the_same_kinds():
    def kinds(*words):
        from ctracer.commands.functions import _route_kinds
        return _route_kinds(cli.build_parser("functions").parse_args(
            ["functions", "sock", *words]))
    assert kinds("--route-kind", "holder", "--route-kind", "returns,alias") == [
        "holder", "returns", "alias"]
    assert kinds("--reach", "holder", "--reach", "returns,alias") == ["holder", "returns", "alias"]
    assert kinds() is None


def test_functions_help_names_route_kind_not_the_old_spelling(tmp_path):
    r = ctracer(tmp_path, "functions", "--help")
    assert r.returncode == 0
    assert "--route-kind KIND" in r.stdout and "--reach" not in r.stdout

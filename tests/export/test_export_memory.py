"""An export under a memory limit: its batches sized by the limit and the row's width,
and DuckDB running out of the memory it may use said in one line, nothing written;
progress on a terminal, none otherwise.

(Exports of a trace several times bigger than a real memory cgroup's limit:
tests/export/test_export_memory_limit.py.)"""

import os
import subprocess
import sys

import pytest

from ctracer import analysis
from ctracer.analysis import memory
from ctracer.cli import main
from ctracer.export import table, text
from ctracer.export.table import BATCH_ROWS, MIN_BATCH_ROWS, event_table, rows_at_once
from support.synthetic_trace import write_synthetic_trace
from support.terminal import run_on_a_terminal

MB = 1 << 20


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory") / "sim.ctrace"
    write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=6, seed=7, raw=True)
    return str(path)


def _limit(monkeypatch, limit):
    monkeypatch.setattr(memory, "memory_limit", lambda: limit)
    monkeypatch.setattr(text, "memory_limit", lambda: limit)


class _Layout:
    def __init__(self, size):
        self.size = size


class _Analysis:
    def __init__(self, size):
        self.layout = _Layout(size)


def test_batches_keep_their_size_without_a_limit_and_shrink_with_wide_rows(monkeypatch):
    _limit(monkeypatch, None)
    assert rows_at_once(_Analysis(408)) == BATCH_ROWS  # the files never depend on the machine
    _limit(monkeypatch, 1 << 30)
    assert rows_at_once(_Analysis(24)) > 150_000  # a few fields: most of a batch
    wide = rows_at_once(_Analysis(408))  # every field of struct sock
    assert 16_000 < wide < 40_000, wide
    _limit(monkeypatch, 256 * MB)
    assert rows_at_once(_Analysis(408)) < wide
    _limit(monkeypatch, 8 * MB)
    assert rows_at_once(_Analysis(4096)) == MIN_BATCH_ROWS


def test_duckdb_out_of_memory_is_one_line_and_nothing_written(trace, tmp_path, monkeypatch,
                                                              capsys):
    _limit(monkeypatch, 64 * MB)
    monkeypatch.setattr(text, "duckdb_limit", lambda limit: 1 * MB)  # far too little
    out = tmp_path / "out" / "sim.jsonl"
    out.parent.mkdir()
    status = main(["export", trace, "--format", "jsonl", "-o", str(out)])
    err = capsys.readouterr().err
    assert status != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ctracer: error: out of memory: DuckDB, which writes the "
                               "jsonl export, ran out of the 1 MB it may use"), lines[0]
    assert "internal error" not in err and "try more memory" in lines[0]
    assert os.listdir(out.parent) == []  # no output, no staged copy left


def test_a_small_limit_writes_the_same_bytes_in_more_batches(trace, tmp_path, monkeypatch):
    analysed = analysis.load(trace, snapshots=True)
    whole = tmp_path / "whole.jsonl"
    text.write_jsonl(event_table(analysed), str(whole))
    _limit(monkeypatch, 256 << 10)
    monkeypatch.setattr(table, "MIN_BATCH_ROWS", 16)  # a test trace's size
    assert 1 < rows_at_once(analysed) * 3 < len(analysed.events)  # several batches
    small = tmp_path / "small.jsonl"
    assert main(["export", trace, "--format", "jsonl", "-o", str(small)]) == 0
    assert small.read_bytes() == whole.read_bytes()


def test_progress_on_a_terminal_and_quiet_otherwise(trace, tmp_path):
    n = len(analysis.load(trace).events)
    argv = [sys.executable, "-m", "ctracer", "export", trace, "--format", "parquet", "-o"]
    status, shown = run_on_a_terminal(argv + [str(tmp_path / "tty.parquet")])
    assert status == 0, shown
    for stage in ("reading events", f"read {n} events", "finding field changes",
                  f"writing events: {n} of {n} (100%)"):
        assert stage in shown, (stage, shown)
    assert "\r\033[Kctracer: wrote" in shown  # the progress line cleared first
    piped = subprocess.run(argv + [str(tmp_path / "pipe.parquet")], capture_output=True,
                           text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr.startswith("ctracer: wrote") and "\r" not in piped.stderr, piped.stderr

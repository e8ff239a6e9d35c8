"""Fuzzing the trace-file readers: damaged trace files meet only ctracer's own errors.

A real trace file (written by `ctracer.tracefile.TraceWriter` from the socket simulation)
is mutated by hypothesis — bytes overwritten, the file cut short, or its SQLite content
changed (meta values replaced or removed, event columns given any value or type, rows
and tables deleted, garbage in the spool of a recording that looks killed) — and every
reader a user reaches runs on it: `Trace` (open, incomplete, counts, every event
decoded), the analysis (`ctracer.analysis.load`), the HTML pages without plots and the export
table.  Allowed outcomes: success, or a `CtracerError` (one line for the user).  Anything
else fails, as does an example running past `EXAMPLE_BOUND_S` (a hang) or memory past
`MEMORY_LIMIT` (the worker runs with that address-space limit, so a blow-up is a
MemoryError).

The campaign runs in a child process (the limits must not touch pytest) with a fixed
seed and stops running new cases after `BUDGET_S` seconds (``CTRACER_FUZZ_SECONDS``, the
readers' fuzz budget too; default 45) or `EXAMPLES` cases (``CTRACER_FUZZ_EXAMPLES``,
default 400), so it takes a bounded time in CI; raise both for a longer campaign.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

import pytest

EXAMPLES = int(os.environ.get("CTRACER_FUZZ_EXAMPLES", "400"))
BUDGET_S = float(os.environ.get("CTRACER_FUZZ_SECONDS", "45"))
EXAMPLE_BOUND_S = 20.0
MEMORY_LIMIT = 3 << 30

META_KEYS = ["schema_version", "state", "mini_layout", "struct_name", "struct_kind",
             "events", "lost_events", "return_value_functions", "start_time", "end_time",
             "start_monotonic_ns", "end_monotonic_ns", "stopped_by", "argv", "command",
             "tracepoint_args", "recorder_pid", "host", "full_layout"]
EVENT_COLUMNS = ["ts_ns", "cpu", "pid", "tid", "comm", "function_id", "phase", "object",
                 "retval", "depth", "flags", "snapshot"]
FUNCTION_COLUMNS = ["id", "name", "unit", "reach", "via", "address", "attached"]


def test_damaged_trace_files_meet_only_ctracers_errors(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(__file__)] + os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    bound = BUDGET_S + 4 * EXAMPLE_BOUND_S + 120  # the campaign, a slow last case, start-up
    r = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                       text=True, env=env, timeout=bound)
    print(r.stdout[-3000:])
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["examples"] >= 20, summary  # the budget let a real campaign run
    assert summary["rejected"] > 0 and summary["read"] > 0, summary  # both kinds were met


# -- the worker -------------------------------------------------------------------------------

class Hang(BaseException):
    """An example ran past EXAMPLE_BOUND_S (BaseException: no reader may swallow it)."""


def _alarm(signum, frame):
    raise Hang(f"a reader ran longer than {EXAMPLE_BOUND_S} s")


def _seed_trace(folder: str) -> str:
    from support.synthetic_trace import write_synthetic_trace
    path = os.path.join(folder, "seed.ctrace")
    write_synthetic_trace(path, threads=2, lifecycles=3)
    return path


def _apply_sql(path: str, statements) -> None:
    db = sqlite3.connect(path)
    try:
        for sql, params in statements:
            try:
                db.execute(sql, params)
            except sqlite3.Error:
                pass  # e.g. a table already dropped: the file is as damaged as it gets
        db.commit()
    finally:
        db.close()


def _read_everything(path: str, out_dir: str) -> None:
    """Every reader a user reaches, on ``path``."""
    from ctracer import analysis
    from ctracer.export.table import event_table
    from ctracer.report import render_report
    from ctracer.tracefile import Trace

    trace = Trace(path)
    try:
        trace.incomplete
        trace.event_count()
        trace.objects()
        for e in trace.events():
            trace.values(e)
        event_table(analysis.load(trace, lambda _message: None, snapshots=True))
    finally:
        trace.close()
    render_report(path, out_dir, plots=False, max_objects=3)


def main(workdir: str) -> int:
    import resource

    from hypothesis import HealthCheck, given, settings, strategies as st

    from ctracer.errors import CtracerError

    seed = _seed_trace(workdir)
    data = open(seed, "rb").read()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, _alarm)
    stats = {"examples": 0, "read": 0, "rejected": 0}
    ends = time.monotonic() + BUDGET_S

    any_value = st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1),
                          st.integers(-3, 300), st.text(max_size=40),
                          st.binary(max_size=300), st.floats(allow_nan=True))
    meta_text = st.one_of(st.text(max_size=60), st.sampled_from(
        ['{"', "[]", "null", "1e999", "-1", "99", '"x"', "{}", '[{"name": 1}]',
         '{"name": "m", "size": -8, "fields": [{}]}', "recording", "finished"]))
    statement = st.one_of(
        st.tuples(st.just("UPDATE meta SET value = ? WHERE key = ?"),
                  st.tuples(meta_text, st.sampled_from(META_KEYS))),
        st.tuples(st.just("DELETE FROM meta WHERE key = ?"),
                  st.tuples(st.sampled_from(META_KEYS))),
        st.builds(lambda col, k, v: (f"UPDATE events SET {col} = ? WHERE seq % ? = 0", (v, k)),
                  st.sampled_from(EVENT_COLUMNS), st.integers(1, 7), any_value),
        st.builds(lambda k: ("DELETE FROM events WHERE seq % ? = 0", (k,)), st.integers(1, 5)),
        st.builds(lambda col, v: (f"UPDATE functions SET {col} = ? WHERE id % 2 = 0", (v,)),
                  st.sampled_from(FUNCTION_COLUMNS), any_value),
        st.builds(lambda t: (f"DROP TABLE {t}", ()),
                  st.sampled_from(["events", "functions", "meta", "spool"])),
        st.builds(lambda raw: ("INSERT INTO spool(raw) VALUES (?)", (raw,)),
                  st.binary(max_size=2000)),
        st.just(("UPDATE meta SET value = 'recording' WHERE key = 'state'", ())),
    )
    mutation = st.one_of(
        st.tuples(st.just("bytes"), st.lists(st.tuples(st.integers(0, len(data) - 1),
                                                       st.integers(0, 255)),
                                             min_size=1, max_size=12)),
        st.tuples(st.just("truncate"), st.integers(0, len(data) - 1)),
        st.tuples(st.just("sql"), st.lists(statement, min_size=1, max_size=4)),
    )

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(mutation)
    def campaign(m):
        if time.monotonic() > ends:
            return  # the budget is spent: the remaining draws pass without running
        stats["examples"] += 1
        case = tempfile.mkdtemp(dir=workdir)
        try:
            path = os.path.join(case, "t.ctrace")
            kind, what = m
            if kind == "bytes":
                damaged = bytearray(data)
                for at, value in what:
                    damaged[at] = value
                open(path, "wb").write(damaged)
            elif kind == "truncate":
                open(path, "wb").write(data[:what])
            else:
                shutil.copy(seed, path)
                _apply_sql(path, what)
            signal.setitimer(signal.ITIMER_REAL, EXAMPLE_BOUND_S)
            try:
                _read_everything(path, os.path.join(case, "report"))
                stats["read"] += 1
            except CtracerError as e:
                assert "\n" not in str(e), f"a multi-line error: {e!r}"
                stats["rejected"] += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            shutil.rmtree(case, ignore_errors=True)

    campaign()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps({**stats, "peak_rss_mb": peak_mb}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""`ctracer diff`'s computation on synthetic traces with a known truth (no BPF needed):
a trace's profile holds what the simulation did (calls, durations, who changed which
field, lifetimes, events per lifetime), a trace compared with itself has no difference,
a run that is one of the repeats is within their noise, counts are per lifetime or per
call of a named function, the page's sentences say what changed, and a signal while the
models are built ends the diff in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from ctracer.analysis.diff import CALLS, CHANGES, FUNCTION, compare
from ctracer.report.profiles import read_profile, read_profiles
from ctracer.analysis.profile import NO_FUNCTION
from ctracer.errors import UsageError
from ctracer.report.diff_page import describe
from support.synthetic_trace import write_synthetic_trace
from support.terminal import as_from_a_terminal


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Three runs of the simulation (another seed each: other random choices), and one
    whose lifecycles send twice as often."""
    d = tmp_path_factory.mktemp("diff")
    out = {}
    for name, seed, sends in (("a", 1, 6), ("b", 2, 6), ("c", 3, 6), ("busy", 1, 12)):
        path = str(d / f"{name}.ctrace")
        out[name] = (path, write_synthetic_trace(path, threads=2, lifecycles=5, sends=sends,
                                                 seed=seed))
    return out


def _percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def test_a_profile_holds_what_the_simulation_did(traces):
    path, truth = traces["a"]
    p = read_profile(path)
    assert p.struct == "struct sock" and p.lifetimes == len(truth.lifetimes)
    assert p.calls == truth.calls
    assert {fn: (t.timed, t.p50_ns, t.p95_ns) for fn, t in p.timings.items()} == {
        fn: (len(d), _percentile(d, 50), _percentile(d, 95))
        for fn, d in truth.durations.items()}
    assert p.changes == Counter((c.field, c.function or NO_FUNCTION) for c in truth.changes)
    # each event is on one lifetime: those that showed the object, and the entries of
    # sk_alloc and lookups, whose object is known at their exit
    assert len(p.events_per_lifetime) == p.lifetimes
    assert sum(p.events_per_lifetime) == truth.events == p.events
    assert all(n > shown for n, shown in zip(p.events_per_lifetime,
                                             sorted(truth.lifetimes.values())))
    assert sum(p.started.values()) == sum(p.ended.values()) == p.lifetimes
    # every lifetime ends with sk_free's exit: it is the last call of each lifecycle
    assert p.ended == {"last seen in sk_free": p.lifetimes}
    refcnt = p.final["sk_refcnt"]
    assert refcnt.shown == {"0": p.lifetimes} and refcnt.median == 0


def test_a_trace_against_itself_has_no_difference(traces):
    path = traces["a"][0]
    diff = compare(*([p] for p in read_profiles([path, path])))
    assert diff.differences == [] and diff.layout == []


def test_a_run_that_is_one_of_the_repeats_is_within_their_noise(traces):
    a, b = (traces[n][0] for n in "ab")
    profiles = read_profiles([a, b, b])
    diff = compare(profiles[:2], profiles[2:])
    assert diff.noise_measured and diff.differences
    assert all(d.noise is True for d in diff.differences)
    assert diff.counts() == {"differences": 0, "noise_unknown": 0,
                             "within_noise": len(diff.differences)}
    # the same runs one a side: the seeds' random choices differ, noise unknown
    diff = compare(profiles[:1], profiles[1:2])
    assert all(d.noise is None for d in diff.differences)
    assert any(d.kind == CALLS for d in diff.differences)


def test_counts_are_per_lifetime_or_per_call_of_a_named_function(traces):
    (a, ta), (busy, tb) = traces["a"], traces["busy"]
    before, after = read_profiles([a, busy])
    diff = compare([before], [after])
    sends = {d.subject: (d.before, d.after) for d in diff.differences if d.kind == CALLS}
    lifetimes = len(ta.lifetimes)
    assert sends["tcp_sendmsg"] == (ta.calls["tcp_sendmsg"] / lifetimes,
                                    tb.calls["tcp_sendmsg"] / len(tb.lifetimes))
    assert sends["tcp_sendmsg"][1] == 2 * sends["tcp_sendmsg"][0]
    # per send: tcp_poll follows every send in both runs, so it does not differ
    diff = compare([before], [after], per="tcp_sendmsg")
    subjects = {(d.kind, d.subject) for d in diff.differences}
    assert (CALLS, "tcp_poll") not in subjects and (CALLS, "tcp_sendmsg") not in subjects
    assert ("lifetimes", "lifetimes") in subjects  # half as many sockets per send
    with pytest.raises(UsageError, match="has no call of it"):
        compare([before], [after], per="no_such_function")


def test_each_difference_reads_as_one_sentence(traces):
    (a, _), (busy, _) = traces["a"], traces["busy"]
    diff = compare(*([p] for p in read_profiles([a, busy])))
    texts = [describe(d, diff.unit) for d in diff.differences]
    assert all("\n" not in t for t in texts)
    sent = next(t for t, d in zip(texts, diff.differences)
                if d.kind == CALLS and d.subject == "tcp_sendmsg")
    assert sent.startswith("tcp_sendmsg: ") and "calls per lifetime" in sent
    changes = [t for t, d in zip(texts, diff.differences) if d.kind == CHANGES]
    assert any(t.startswith("sk_stats.tx_bytes: changed by tcp_sendmsg ") for t in changes)
    assert not any(d.kind == FUNCTION for d in diff.differences)  # the same functions


@pytest.fixture(scope="module")
def big_traces(tmp_path_factory):
    """Two traces whose models take a while (~200k events each)."""
    d = tmp_path_factory.mktemp("big")
    paths = [str(d / f"{n}.ctrace") for n in ("before", "after")]
    for seed, path in enumerate(paths, 1):
        write_synthetic_trace(path, threads=4, lifecycles=135, sends=66, seed=seed)
    return paths


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_traces_are_read_is_one_line(big_traces, tmp_path, sig, status):
    """Ctrl-C (to the terminal's process group) or SIGTERM once the helpers build the
    models: one line, the shell's status, no helper left, nothing written."""
    p = subprocess.Popen([sys.executable, "-m", "ctracer", "diff", *big_traces, "-o",
                          str(tmp_path / "d")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 240
    helpers: list[str] = []
    while len(helpers) < 2:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        helpers = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
        time.sleep(0.02)
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)  # as a terminal does: every process of the group
    else:
        p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert p.returncode == status, err
    assert lines == ["ctracer: interrupted: the traces were not all read: no diff written"]
    assert "Traceback" not in err and out == ""
    assert not any(os.path.exists(f"/proc/{h}") and
                   open(f"/proc/{h}/stat").read().split()[2] != "Z" for h in helpers)
    assert not (tmp_path / "d").exists()


def test_a_trace_that_lost_events_diffs_with_a_warning(traces, tmp_path):
    lossy = str(tmp_path / "lossy.ctrace")
    write_synthetic_trace(lossy, threads=2, lifecycles=5, sends=6, seed=1, lost_events=7)
    r = subprocess.run([sys.executable, "-m", "ctracer", "diff", traces["a"][0], lossy,
                        "-o", str(tmp_path / "d")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"ctracer: warning: {lossy}: 7 events lost while recording: its counts are short"]
    assert "7 events lost while recording" in (tmp_path / "d" / "index.html").read_text()
    assert "open file://" in r.stdout and "Traceback" not in r.stderr

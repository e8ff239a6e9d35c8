"""A big trace's arrays in mapped files (`ctracer.analysis.mapped`): the analysis is the
same as on the heap, its columns live in unnamed files (nothing left in the directory),
and no one can write through them once the analysis is done."""

import os

import numpy as np
import pytest

from ctracer import analysis
from ctracer.analysis import mapped
from synthetic_trace import write_synthetic_trace


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mapped") / "sim.ctrace"
    # raw events from several CPUs: the columns are reordered by time (`take`)
    write_synthetic_trace(str(path), threads=3, lifecycles=5, sends=6,
                          addresses_per_thread=2, seed=11, raw=True)
    return str(path)


def _analyses(trace_path, spill, monkeypatch):
    on_heap = analysis.load(trace_path, snapshots=True)
    monkeypatch.setattr(mapped, "MAPPED_FROM_BYTES", 0)
    monkeypatch.setattr(mapped, "MIN_BYTES", 0)
    in_files = analysis.load(trace_path, snapshots=True, spill_dir=str(spill))
    return on_heap, in_files


def test_mapped_analysis_equals_the_heap_one(trace_path, tmp_path, monkeypatch):
    on_heap, in_files = _analyses(trace_path, tmp_path, monkeypatch)
    assert len(on_heap.events) > 300 and len(on_heap.changes) > 100
    mapped_columns = [n for n in in_files.events.names
                      if mapped.is_mapped(getattr(in_files.events, n))]
    # every per-event column the passes make (and the trace's own) is in a file
    assert {"ts_ns", "address", "depth", "caller", "duration_ns", "object",
            "object_depth", "object_caller", "thread_caller"} <= set(mapped_columns)
    assert mapped.is_mapped(in_files.snapshots)
    for name in on_heap.events.names:
        assert np.array_equal(getattr(on_heap.events, name), getattr(in_files.events, name)), name
    for name in on_heap.changes.names:
        assert np.array_equal(getattr(on_heap.changes, name), getattr(in_files.changes, name)), name
    assert on_heap.objects.keys == in_files.objects.keys
    assert on_heap.objects.started_by == in_files.objects.started_by
    assert np.array_equal(on_heap.snapshots, in_files.snapshots)
    assert on_heap.counts == in_files.counts


def test_mapped_columns_leave_no_file_and_cannot_be_written(trace_path, tmp_path, monkeypatch):
    _, in_files = _analyses(trace_path, tmp_path, monkeypatch)
    assert os.listdir(tmp_path) == []  # unnamed files: gone with the mapping
    with pytest.raises(ValueError):
        in_files.events.depth[0] = 7  # a forked helper writing here would change ours


def test_a_small_trace_stays_on_the_heap(trace_path, tmp_path):
    loaded = analysis.load(trace_path, spill_dir=str(tmp_path))
    assert not any(mapped.is_mapped(getattr(loaded.events, n)) for n in loaded.events.names)


def test_call_counts_a_slice_at_a_time_equal_all_at_once(trace_path, monkeypatch):
    """The call graphs' counts of a big trace are made a slice of events at a time; with
    slices of 7 events they are the counts of one pass (order of first call kept)."""
    from ctracer.analysis import callgraph

    loaded = analysis.load(trace_path)
    ev = loaded.events
    rows = np.arange(len(ev))
    whole = callgraph.call_counts(ev, rows, ev.thread_caller)
    per_object = [callgraph.call_counts(ev, loaded.objects.events(o), ev.object_caller)
                  for o in range(len(loaded.objects))]
    monkeypatch.setattr(callgraph, "COUNTED_AT_ONCE", 7)
    assert len(whole.edges) > 3 and sum(whole.calls) > 100
    assert callgraph.call_counts(ev, rows, ev.thread_caller) == whole
    assert [callgraph.call_counts(ev, loaded.objects.events(o), ev.object_caller)
            for o in range(len(loaded.objects))] == per_object

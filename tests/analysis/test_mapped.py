"""A big trace's arrays in mapped files (`ctracer.analysis.mapped`): the analysis is the
same as on the heap, its columns live in unnamed files (nothing left in the directory),
and no one can write through them once the analysis is done."""

import os
import re

import numpy as np
import pytest

from ctracer import analysis
from ctracer.analysis import mapped
from support.synthetic_trace import write_synthetic_trace


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mapped") / "sim.ctrace"
    # raw events from several CPUs: the columns are reordered by time (`take`)
    write_synthetic_trace(str(path), threads=3, lifecycles=5, sends=6,
                          addresses_per_thread=2, seed=11, raw=True)
    return str(path)


def _map_everything(monkeypatch):
    monkeypatch.setattr(mapped, "MAPPED_FROM_BYTES", 0)
    monkeypatch.setattr(mapped, "MIN_BYTES", 0)
    monkeypatch.setattr(mapped, "SETTLED_FROM_BYTES", 0)


def _analyses(trace_path, spill, monkeypatch):
    on_heap = analysis.load(trace_path, snapshots=True)
    _map_everything(monkeypatch)
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
    # the finished arrays the passes left on the heap were moved into files
    assert all(mapped.is_mapped(getattr(in_files.events, n)) for n in in_files.events.names)
    assert all(mapped.is_mapped(getattr(in_files.changes, n)) for n in in_files.changes.names)
    assert mapped.is_mapped(in_files.objects._events.positions)
    assert mapped.is_mapped(in_files.objects._changes.positions)
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
    with pytest.raises(ValueError):
        in_files.changes.new[0] = 7


def test_per_event_change_rows_in_slices_equal_the_heap_ones(trace_path, tmp_path,
                                                             monkeypatch):
    from ctracer.analysis import model

    on_heap, in_files = _analyses(trace_path, tmp_path, monkeypatch)
    monkeypatch.setattr(model, "_SLICE", 7)
    for rows in (slice(None), slice(5, 123)):
        heap_rows, file_rows = on_heap.change_rows(rows), in_files.change_rows(rows)
        assert all(mapped.is_mapped(a) for a in file_rows)
        assert [a.tolist() for a in heap_rows] == [a.tolist() for a in file_rows]
    starts, ends = on_heap.change_rows()
    assert (ends - starts).sum() == len(on_heap.changes)
    assert in_files.changes_by_seq().tolist() == on_heap.changes_by_seq().tolist()


def test_a_report_of_mapped_arrays_is_the_heap_ones(trace_path, tmp_path, monkeypatch):
    from ctracer.report import render_report

    render_report(trace_path, str(tmp_path / "heap"), plots=False)
    _map_everything(monkeypatch)
    render_report(trace_path, str(tmp_path / "files"), plots=False)
    pages = sorted(p.relative_to(tmp_path / "heap") for p in (tmp_path / "heap").rglob("*")
                   if p.is_file())
    assert len(pages) > 20
    assert pages == sorted(p.relative_to(tmp_path / "files")
                           for p in (tmp_path / "files").rglob("*") if p.is_file())
    footer = re.compile(rb"rendered 20[0-9-]+ [0-9:]+")
    for page in pages:
        assert footer.sub(b"", (tmp_path / "heap" / page).read_bytes()) == \
            footer.sub(b"", (tmp_path / "files" / page).read_bytes()), page


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


@pytest.mark.parametrize("at_once", [1 << 20, 40, 1])
def test_grouped_call_counts_equal_one_object_at_a_time(trace_path, monkeypatch, at_once):
    """Every object's call counts made together (`grouped_call_counts`: slices of many
    objects, or one object alone when it fills a slice) are each object's own counts."""
    from ctracer.analysis import callgraph

    loaded = analysis.load(trace_path)
    ev, objects = loaded.events, loaded.objects
    alone = [callgraph.call_counts(ev, objects.events(o), ev.object_caller)
             for o in range(len(objects))]
    positions, offsets = objects.event_groups(list(range(len(objects))))
    monkeypatch.setattr(callgraph, "COUNTED_AT_ONCE", at_once)
    together = callgraph.grouped_call_counts(ev, positions, offsets, ev.object_caller)
    assert len(alone) > 10 and any(len(c.edges) > 2 for c in alone)
    assert together == alone


@pytest.mark.parametrize("at_once", [1 << 20, 50])
def test_grouped_call_counts_of_random_events(monkeypatch, at_once):
    """Tracepoint hits, exits before any entry, untimed events and empty groups, at
    random: counted together or alone, the same counts."""
    from types import SimpleNamespace

    from ctracer.analysis import callgraph
    from ctracer.analysis.model import NO_DURATION
    from ctracer.event import PHASE_ENTRY, PHASE_EXIT, PHASE_TRACEPOINT

    rng = np.random.default_rng(5)
    n = 3000
    ev = SimpleNamespace(
        function=rng.integers(0, 9, n).astype(np.int32),
        phase=rng.choice([PHASE_ENTRY, PHASE_EXIT, PHASE_TRACEPOINT], n).astype(np.uint8),
        duration_ns=np.where(rng.random(n) < 0.5, NO_DURATION, rng.integers(1, 10**6, n)))
    callers = rng.integers(-1, 9, n).astype(np.int32)
    positions = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), 80, replace=False))
    offsets = np.r_[0, cuts, cuts[:5], n]  # five empty groups among them
    offsets.sort()
    for g in range(len(offsets) - 1):  # each group's events in order, as an object's are
        positions[offsets[g]:offsets[g + 1]].sort()
    alone = [callgraph.call_counts(ev, positions[offsets[g]:offsets[g + 1]], callers)
             for g in range(len(offsets) - 1)]
    monkeypatch.setattr(callgraph, "COUNTED_AT_ONCE", at_once)
    together = callgraph.grouped_call_counts(ev, positions, offsets, callers)
    assert any(c.hits for c in alone) and sum(not c.functions for c in alone) == 5
    assert together == alone


def test_counts_per_group():
    from ctracer.analysis.model import counts_per_group

    values = np.array([3, 1, 3, -1, 2, 2, 7, 0], np.int64)
    offsets = np.array([0, 4, 4, 8])
    assert counts_per_group(values, offsets) == [{1: 1, 3: 2}, {}, {0: 1, 2: 2, 7: 1}]
    assert counts_per_group(np.zeros(0, np.int64), np.array([0, 0])) == [{}]


def test_groups_of_some_objects_are_their_own(trace_path):
    """`Objects.event_groups` of a subset of objects: each chosen one's events, in the
    order chosen; of every object, the groups themselves."""
    objects = analysis.load(trace_path).objects
    chosen = [3, 0, 5]
    positions, offsets = objects.event_groups(chosen)
    assert [positions[offsets[k]:offsets[k + 1]].tolist() for k in range(3)] == \
        [objects.events(o).tolist() for o in chosen]
    positions, offsets = objects.change_groups(chosen)
    assert [positions[offsets[k]:offsets[k + 1]].tolist() for k in range(3)] == \
        [objects.changes(o).tolist() for o in chosen]
    every = list(range(len(objects)))
    positions, offsets = objects.event_groups(every)
    assert np.concatenate([objects.events(o) for o in every]).tolist() == positions.tolist()
    assert objects.event_groups([])[1].tolist() == [0]


def test_written_back_arrays_leave_the_process_and_keep_their_values(tmp_path, monkeypatch):
    """After `ArraySpace.writing_back`, the mapped arrays' pages are on disk and out of
    the process (a memory limit can drop them), and reading them gives the values."""
    monkeypatch.setattr(mapped, "MIN_BYTES", 0)
    space = mapped.ArraySpace(str(tmp_path))
    with space.writing_back():
        a = space.zeros(8 << 20, np.int64)  # 64 MB
        a[:] = np.arange(len(a))
        address = a.__array_interface__["data"][0]
    assert _resident_kb(address) == 0
    assert int(a[12345]) == 12345 and int(a[-1]) == len(a) - 1


def _resident_kb(address: int) -> int:
    """The Rss of the mapping that holds ``address``, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError("no mapping holds the array")

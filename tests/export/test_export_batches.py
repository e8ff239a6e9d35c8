"""Exports stream: the event table is made and written a batch of rows at a time
(`ctracer.export.table.event_tables`), and what is written is the same as from one
table of every row (JSON Lines and CSV byte for byte; Parquet the same schema, metadata
and rows, a row group per batch)."""

import pyarrow.parquet as pq
import pytest

from ctracer import analysis
from ctracer.export import parquet, text
from ctracer.export.table import event_table, event_tables
from support.synthetic_trace import write_synthetic_trace

BATCH = 37  # rows: the trace below holds several batches, the last one short


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    path = tmp_path_factory.mktemp("batches") / "sim.ctrace"
    write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=6, seed=7, raw=True,
                          attach_failures=True)
    return analysis.load(str(path), snapshots=True)


def test_batches_are_bounded_and_cover_every_row_in_order(analysed):
    tables = list(event_tables(analysed, batch_rows=BATCH))
    n = len(analysed.events)
    assert n > 3 * BATCH
    assert len(tables) == -(-n // BATCH)
    assert all(t.table.num_rows <= BATCH for t in tables)
    times = [v for t in tables for v in t.table.column("time_ns").to_pylist()]
    assert times == event_table(analysed).table.column("time_ns").to_pylist()


@pytest.mark.parametrize("writer", [text.write_jsonl, text.write_csv])
def test_text_exports_in_batches_are_byte_identical(analysed, writer, tmp_path):
    whole, batched = tmp_path / "whole", tmp_path / "batched"
    writer(event_table(analysed), str(whole))
    writer(event_tables(analysed, batch_rows=BATCH), str(batched))
    assert whole.read_bytes() == batched.read_bytes()
    assert len(whole.read_bytes().splitlines()) >= len(analysed.events)


def test_parquet_in_batches_has_a_row_group_each_and_the_same_rows(analysed, tmp_path):
    whole, batched = str(tmp_path / "whole.parquet"), str(tmp_path / "batched.parquet")
    parquet.write_parquet(event_table(analysed), whole)
    parquet.write_parquet(event_tables(analysed, batch_rows=BATCH), batched)
    assert pq.read_metadata(whole).num_row_groups == 1
    assert pq.read_metadata(batched).num_row_groups == -(-len(analysed.events) // BATCH)
    assert pq.read_metadata(whole).metadata == pq.read_metadata(batched).metadata
    a, b = pq.read_table(whole), pq.read_table(batched)
    assert a.schema.equals(b.schema) and a.equals(b)


def test_hive_partitioned_parquet_in_batches(analysed, tmp_path):
    written = parquet.write_parquet(event_tables(analysed, batch_rows=BATCH),
                                    str(tmp_path / "dataset"))
    t = pq.read_table(written)
    assert t.num_rows == len(analysed.events)
    assert "host" not in t.column_names and "struct" not in t.column_names

"""Side tables written beside an export's events (`ctracer.export.beside`): each format
reads back as the table written."""

import json

import pyarrow as pa
import pyarrow.csv as csv
import pyarrow.parquet as pq

from ctracer.export.beside import write_beside

TABLE = pa.table({"function": ["tcp_sendmsg", "tcp_ack"], "calls": [3, 5]})


def test_jsonl_csv_and_parquet_read_back(tmp_path):
    out = str(tmp_path / "events.jsonl")
    path = write_beside(TABLE, str(tmp_path / "t.jsonl"), out, "jsonl", "t.parquet")
    assert [json.loads(x) for x in open(path)] == TABLE.to_pylist()
    path = write_beside(TABLE, str(tmp_path / "t.csv"), out, "csv", "t.parquet")
    assert csv.read_csv(path).to_pylist() == TABLE.to_pylist()
    path = write_beside(TABLE, str(tmp_path / "t.parquet"), out, "parquet", "t.parquet")
    assert pq.read_table(path).to_pylist() == TABLE.to_pylist()


def test_parquet_into_a_directory_takes_its_own_name(tmp_path):
    path = write_beside(TABLE, str(tmp_path / "x.parquet"), str(tmp_path), "parquet",
                        "folded-calls.parquet")
    assert path == str(tmp_path / "folded-calls.parquet")
    assert pq.read_table(path).num_rows == 2


def test_a_format_without_side_tables_writes_nothing(tmp_path):
    assert write_beside(TABLE, str(tmp_path / "t.txt"), str(tmp_path), "text", "t") is None
    assert list(tmp_path.iterdir()) == []

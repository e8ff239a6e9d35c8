"""Tables an export writes beside its events' file (the writes of ``--watch``, the
folded calls of ``--calls changes``), in the events' format: JSON Lines, CSV or
Parquet (a Parquet export into a directory puts the table there under its own name).
"""

from __future__ import annotations

import os
from typing import Optional


def write_beside(table, path: str, output: str, fmt: str, parquet_name: str) -> Optional[str]:
    """Write the pyarrow ``table`` to ``path`` as ``fmt`` (to ``output/parquet_name``
    when ``output`` is a Parquet directory); the path written, or None for a format
    that has no side tables."""
    if fmt == "jsonl":
        import orjson
        with open(path, "wb") as out:
            for row in table.to_pylist():
                out.write(orjson.dumps(row) + b"\n")
    elif fmt == "csv":
        import pyarrow.csv as csv
        csv.write_csv(table, path)
    elif fmt == "parquet":
        import pyarrow.parquet as pq
        if os.path.isdir(output):
            path = os.path.join(output, parquet_name)
        pq.write_table(table, path)
    else:
        return None
    return path

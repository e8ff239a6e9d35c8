"""The report tree is private (0700 directories, 0600 files: it holds addresses, argv and
traced strings) and stays inside its directory whatever names the trace carries."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

from support.synthetic_trace import write_synthetic_trace


def test_report_tree_is_private_and_contained(tmp_path):
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=2)
    db = sqlite3.connect(str(trace))
    db.execute("UPDATE meta SET value = '../../escaped' WHERE key = 'struct_name'")
    db.commit()
    db.close()
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([sys.executable, "-m", "ctracer", "callgraph", str(trace), "-q"],
                       capture_output=True, text=True, cwd=work, timeout=300,
                       env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert r.returncode == 0, r.stderr
    root = work / "callgraph"
    written = list(work.rglob("*"))
    assert written and all(p == root or root in p.parents for p in written)
    files = [p for p in written if p.is_file()]
    dirs = [p for p in written if p.is_dir()]
    assert any(p.suffix == ".png" for p in files)
    assert any('class="callgraph"' in p.read_text() for p in files if p.suffix == ".html")
    assert [str(p) for p in files if p.stat().st_mode & 0o777 != 0o600] == []
    assert [str(p) for p in dirs if p.stat().st_mode & 0o777 != 0o700] == []

"""``trace --calls changes`` on kernel functions, in the 6.12 guest: with kprobe probes it
is refused in one line before anything is compiled (their programs with the fold go past
BPF's 512-byte stack, where clang ends the process without a word).

The comparison of folded counts with bpftrace's per-call counts is not here yet: in the
6.12 guest, with fentry, even ``--calls all`` counted more calls per socket than the
bpftrace script printing one line per call (e.g. 152 against 129), a difference not yet
explained (see docs/calls.md).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.vm(kernels=("6.12",))

CTRACER = [sys.executable, "-m", "ctracer"]


def test_calls_changes_with_kprobes_is_refused_in_one_line(vm_kernel, tmp_path):
    run = subprocess.run(CTRACER + ["trace", "struct", "sock", "--functions", "tcp_sendmsg",
                                    "--function-probes", "kprobe", "--calls", "changes",
                                    "-d", "1", "-o", str(tmp_path / "k.ctrace")],
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "512-byte stack" in lines[0], run.stderr
    assert not (tmp_path / "k.ctrace").exists()

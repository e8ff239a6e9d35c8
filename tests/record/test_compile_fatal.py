"""A compile that LLVM ends itself (its error handler calls ``exit(1)``: "BPF stack limit
... exceeded") still says why, in one line naming the program and clang's error, with a
non-zero status (`ctracer.record.bpf_runtime._captured_output`: a watcher process prints
what the dead process kept); an ordinary compile error is said once, by the process;
a program that compiles leaves nothing on stderr.  Compiles only (no program loaded)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.bpf

#: a program whose stack goes past BPF's 512 bytes: clang's BPF backend ends the process
TOO_BIG = """
int ctracer_too_big(void *ctx)
{
	char buf[1024];

	bpf_probe_read_kernel(buf, sizeof(buf), ctx);
	return buf[100] + buf[1000];
}
"""
NOT_C = "int ctracer_not_c(void *ctx) { return undeclared_name; }\n"
FINE = "int ctracer_fine(void *ctx) { return 0; }\n"

_COMPILE = """
import sys
from ctracer.errors import CtracerError
from ctracer.record import bpf_runtime
try:
    bpf_runtime.verify_programs(sys.stdin.read(), [])
except CtracerError as e:
    print(f"ctracer: error: {e}", file=sys.stderr)
    sys.exit(1)
print("compiled")
"""


def _compile(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _COMPILE], input=text, capture_output=True,
                          text=True, timeout=300)


def test_a_compile_llvm_ends_is_said_in_one_line(bpf):
    r = _compile(TOO_BIG)
    assert r.returncode != 0 and "compiled" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ctracer: error: bcc could not compile"), lines
    assert "in program ctracer_too_big" in lines[0] and "stack limit" in lines[0], lines


def test_an_ordinary_compile_error_is_said_once(bpf):
    r = _compile(NOT_C)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "undeclared_name" in lines[0], r.stderr


def test_a_program_that_compiles_says_nothing(bpf):
    r = _compile(FINE)
    assert r.returncode == 0 and r.stdout.strip() == "compiled" and r.stderr == "", r

"""The tier check (tests/support/tiers.py): collection fails on a test that loads BPF or
reads the running kernel without its marker, passes once it is marked, and the fixtures
``bpf`` and ``live_kernel`` mark the tests that use them (even through another fixture)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# split so that the check does not find them in this file's own source
SKIP = "bpf_or" "_skip"
BTF = "/sys/" "kernel/btf/vmlinux"


def _collect(tmp_path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["support.tiers"]\n')
    (tmp_path / "test_sample.py").write_text("import pytest\n\n" + body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", "/dev/null", "-m", "not bpf and not kernel",
         str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})


def test_an_unmarked_test_that_loads_bpf_fails_collection(tmp_path):
    r = _collect(tmp_path, "from support import kernelrun as kr\n\n"
                           f"def _traced():\n    kr.{SKIP}()\n\n"
                           "def test_x():\n    _traced()\n")
    assert r.returncode != 0
    assert f"test_sample.py::test_x: uses '{SKIP}' but is not marked 'bpf'" in r.stdout + r.stderr


def test_an_unmarked_test_reading_the_kernels_btf_fails_collection(tmp_path):
    r = _collect(tmp_path, f'BTF = "{BTF}"\n\n'
                           "@pytest.fixture\ndef model():\n    return open(BTF)\n\n"
                           "def test_y(model):\n    pass\n")
    assert r.returncode != 0
    assert f"test_y: uses '\"{BTF[:12]}' but is not marked 'kernel'" in r.stdout + r.stderr


def test_marked_tests_and_fixture_users_pass_and_are_deselected(tmp_path):
    r = _collect(tmp_path, "from support import kernelrun as kr\n\n"
                           "@pytest.fixture\ndef traced(bpf):\n    pass\n\n"
                           f"@pytest.mark.bpf\ndef test_marked():\n    kr.{SKIP}()\n\n"
                           "def test_through_a_fixture(traced):\n    pass\n\n"
                           "def test_btf(live_kernel):\n    pass\n\n"
                           "def test_anywhere():\n    pass\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_sample.py::test_anywhere" in r.stdout
    assert "1/4 tests collected (3 deselected)" in r.stdout


def test_a_helper_of_tests_support_that_loads_bpf_is_followed(tmp_path):
    r = _collect(tmp_path, "from support import kernelrun as kr\n\n"
                           "def test_z(tmp_path):\n"
                           "    kr.trace_with_observer(tmp_path, 'sock', 0, '')\n")
    assert r.returncode != 0
    assert f"test_sample.py::test_z: uses '{SKIP}' but is not marked 'bpf'" in r.stdout + r.stderr

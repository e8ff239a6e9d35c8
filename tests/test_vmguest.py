"""The vm plugin (tests/support/vmguest.py) on the host, where no guest boots: a test marked vm
is parametrized once per kernel, skipped saying why when QEMU cannot start, and neither
its fixtures nor its body run here; ``-m "not vm"`` deselects it.  (Its guest side, and
the host reporting the guest's outcomes, are exercised by every run of the vm tests.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

VM_TEST = '''
import pytest

@pytest.fixture
def changes_the_machine(tmp_path):
    (tmp_path.parent / "FIXTURE-RAN").write_text("")
    yield

@pytest.mark.vm
def test_in_a_guest(vm_kernel, changes_the_machine, tmp_path):
    (tmp_path.parent / "BODY-RAN").write_text("")
    assert False, "the body ran on the host"

def test_on_the_host(vm_kernel):
    assert vm_kernel is None
'''


def run_pytest(tmp_path, *args: str, path: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_guesty.py").write_text(VM_TEST)
    env = dict(os.environ, PATH=path, PYTHONPATH=str(TESTS))
    env.pop("CTRACER_VM_KERNEL", None)
    env.pop("PYTEST_ADDOPTS", None)   # the outer run's options are not the inner one's
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "support.vmguest", "-p",
                           "no:cacheprovider", "-rs", "-v", f"--basetemp={tmp_path / 'bt'}",
                           *args, str(tmp_path / "test_guesty.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


def test_without_qemu_a_vm_test_is_skipped_per_kernel_saying_why(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    r = run_pytest(tmp_path, path=str(empty))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_in_a_guest[6.1] SKIPPED" in r.stdout, r.stdout
    assert "test_in_a_guest[6.12] SKIPPED" in r.stdout, r.stdout
    assert "test_on_the_host PASSED" in r.stdout, r.stdout
    # vm items run after the host's (their guests boot in the background meanwhile)
    assert r.stdout.index("test_on_the_host PASSED") < r.stdout.index("test_in_a_guest[6.1]")
    why = ("qemu-system-x86_64 is not installed" if os.geteuid() == 0
           else "booting a guest (scripts/vm-run) needs root")
    assert f"SKIPPED [2] " in r.stdout and f"no guest can start here: {why}" in r.stdout, \
        r.stdout
    assert f"vm: no guest can start here: {why}" in r.stdout  # said once, as it happens
    assert not list((tmp_path / "bt").rglob("*-RAN"))   # neither fixture nor body ran


def test_not_vm_deselects_them_before_anything_boots(tmp_path):
    r = run_pytest(tmp_path, "-m", "not vm", path=os.environ["PATH"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 deselected" in r.stdout and "1 passed" in r.stdout, r.stdout
    assert "vm: booting" not in r.stdout

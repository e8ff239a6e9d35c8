"""scripts/vm-run refuses bad input in one line with a non-zero exit (an unknown kernel,
no network to fetch one, no QEMU), and a guest that hangs ends in exit 124 with one line.

The network is taken away from apt alone: ``APT_CONFIG`` names a file (read after
/etc/apt/apt.conf.d) sending apt's HTTP through a closed port, so ``apt-get download``
fails to connect as it would without a network, with the package lists left as they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from support import vmguest

VM_RUN = str(vmguest.VM_RUN)


def vm_run(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, VM_RUN, *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def one_line(r) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("vm-run: "), r.stderr
    return lines[0]


def test_an_unknown_kernel_is_refused_in_one_line():
    r = vm_run("--kernel", "5.10", "--", "true")
    assert r.returncode == 2
    line = one_line(r)
    assert "'5.10'" in line and "6.1" in line and "6.12" in line, line
    r = vm_run("--fetch-only", "5.10")
    assert r.returncode == 2 and "'5.10'" in one_line(r)


def test_a_kernel_image_path_that_does_not_exist_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("vm-run says it needs root before it looks at the image")
    r = vm_run("--kernel", str(tmp_path / "vmlinuz-none"), "--", "true")
    assert r.returncode == 2
    assert "no such kernel image" in one_line(r)


def test_no_qemu_is_said_in_one_line_before_any_download(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("vm-run says it needs root before it looks for QEMU")
    empty = tmp_path / "bin"
    empty.mkdir()
    # an empty cache too: were QEMU looked for after the kernel, this would download one
    r = vm_run("--kernel", "6.1", "--", "true",
               env={"PATH": str(empty), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 4, r.stderr
    assert "qemu-system-x86_64 not found" in one_line(r)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("series", ["6.1", "7.2"])
def test_no_network_to_fetch_a_kernel_is_said_in_one_line(tmp_path, series):
    """6.1 from this machine's package lists; 7.2 from Debian unstable's, read into the
    cache (this machine's apt lists untouched)."""
    if not shutil.which("apt-get"):
        pytest.skip("no apt-get here")
    conf = tmp_path / "apt.conf"
    conf.write_text('Acquire::http::Proxy "http://127.0.0.1:9";\n'
                    'Acquire::https::Proxy "http://127.0.0.1:9";\n'
                    'Acquire::Retries "0";\n')
    lists = sorted(os.listdir("/var/lib/apt/lists"))
    r = vm_run("--fetch-only", series, env={"APT_CONFIG": str(conf),
                                            "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 3, r.stderr
    line = one_line(r)
    if series == "6.1":
        assert "cannot fetch linux-image-6.1" in line or "no 6.1 kernel package" in line, line
    else:
        assert "cannot read Debian's sid package lists" in line, line
    assert sorted(os.listdir("/var/lib/apt/lists")) == lists
    assert not list((tmp_path / "cache").rglob("*.deb"))
    assert not list((tmp_path / "cache").rglob(".complete"))


def test_a_hanging_guest_ends_with_124_and_one_line(tmp_path):
    """Costs one boot (~40-60 s of TCG)."""
    why = vmguest.qemu_unavailable()
    if why:
        pytest.skip(f"no guest can start here: {why}")
    start = time.monotonic()
    r = vm_run("--kernel", "6.12", "--out", str(tmp_path), "--timeout", "60", "--",
               "sleep", "600", timeout=300)
    took = time.monotonic() - start
    assert r.returncode == 124, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("vm-run: Linux 6.12."), r.stderr   # which kernel, which accel
    assert len(lines) == 2 and lines[1].startswith(
        "vm-run: the guest did not finish within 60 s; console: "), r.stderr
    assert str(tmp_path / ".vm-run" / "console.log") in lines[1]
    assert 60 <= took < 120, took
    assert not processes_naming(str(tmp_path)), "vng or QEMU still running"


def processes_naming(text: str) -> list[str]:
    import glob
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found

"""The kernel writers' lines of ``--watch`` (`ctracer.record.write_sites` with a
vmlinux): a running kernel's addresses are moved back by its KASLR offset (the
running ``_text`` less the file's ``.text``) before the file's line table is read.

No vmlinux of this host's kernel is at hand, so watchdemo (an ELF with DWARF and
``.debug_aranges``, as a Debian -dbg vmlinux has) stands in for it, with a kallsyms file
placing its functions where a randomized kernel would; binutils' addr2line on the file's
own addresses is the oracle.  The guests check the same against a real vmlinux
(tests/vm/test_watch_kernel.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from support import groundtruth as gt
from ctracer.host.kallsyms import Kallsyms
from ctracer.record.write_sites import resolve
from ctracer.tracefile.writes import Write

WATCHDEMO = os.path.join(gt.ROOT, "samples", "watch", "build", "watchdemo")
SLIDE = 0xFFFFFFFF80000000 - 0x1000 + 0x2A00000   # any page-aligned kernel offset


def _functions() -> dict[str, int]:
    text = subprocess.run(["nm", WATCHDEMO], capture_output=True, text=True,
                          check=True).stdout
    return {p[2]: int(p[0], 16) for p in (ln.split() for ln in text.splitlines())
            if len(p) == 3 and p[1] in "Tt"}


@pytest.fixture(scope="module")
def kallsyms(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples", "watch")], check=True)
    text = subprocess.run(["readelf", "-SW", WATCHDEMO], capture_output=True, text=True,
                          check=True).stdout
    dot_text = next(int(ln.split()[ln.split().index(".text") + 2], 16)
                    for ln in text.splitlines() if " .text " in ln)
    path = tmp_path_factory.mktemp("kallsyms") / "kallsyms"
    rows = [(dot_text, "_text")] + sorted((a, n) for n, a in _functions().items())
    path.write_text("".join(f"{a + SLIDE:016x} T {n}\n" for a, n in rows))
    return Kallsyms(str(path))


def _addr2line(address: int) -> tuple[str, int]:
    out = subprocess.run(["addr2line", "-e", WATCHDEMO, f"{address:#x}"], capture_output=True,
                         text=True, check=True).stdout.strip()
    file, _, line = out.rpartition(":")
    return os.path.relpath(file, os.path.dirname(os.path.dirname(WATCHDEMO))), \
        int(line.split()[0])


def test_kernel_writers_lines_are_the_files_after_the_kaslr_offset(kallsyms):
    functions = _functions()
    wanted = [functions[f] + d for f in ("account_open", "account_work", "account_close")
              for d in (4, 9, 17)]
    rows = [Write(0, 0, 0, 0, 0, "balance", 0, 8, a + SLIDE + 1, None, None, False, ())
            for a in wanted]   # a trap's ip: just after the writing instruction
    sites = {s.address - SLIDE - 1: s for s in
             resolve(rows, kernel=True, vmlinux=WATCHDEMO, kallsyms=kallsyms)}
    for address in wanted:
        site = sites[address]
        assert (site.file, site.line) == _addr2line(address), hex(address)
        function = min((a for a in functions.values() if a <= address),
                       key=lambda a: address - a)
        name = next(n for n, a in functions.items() if a == function)
        assert (site.function, site.offset) == (name, address + 1 - function)


def test_without_a_vmlinux_kernel_writers_are_function_and_offset(kallsyms):
    address = _functions()["account_work"] + 9
    row = Write(0, 0, 0, 0, 0, "balance", 0, 8, address + SLIDE + 1, None, None, False, ())
    site, = resolve([row], kernel=True, kallsyms=kallsyms)
    assert (site.function, site.offset, site.file, site.line) == ("account_work", 10, None,
                                                                  None)

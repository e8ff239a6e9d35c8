"""`ctracer.debuginfo.code.CodeMap` names a line's file by its path below the compile
directory (``lib/account.h``, as a kernel's ``include/net/sock.h``), not its base name,
in DWARF 4 and 5 line tables alike; binutils' addr2line on the same addresses is the
oracle."""

from __future__ import annotations

import os
import subprocess

import pytest

from ctracer.debuginfo.code import CodeMap

HEADER = """
static inline void account_add(long *balance, long amount)
{
	*balance += amount;
}
"""

PROGRAM = """
#include "lib/account.h"
long balance;
int main(int argc, char **argv)
{
	for (int i = 0; i < argc * 1000; i++)
		account_add(&balance, i);
	return (int)balance;
}
"""


def _addr2line(binary: str, addresses: list[int], root: str) -> dict[int, tuple[str, int]]:
    """Each address's (file below ``root``, line), for those addr2line finds a row of."""
    out = subprocess.run(["addr2line", "-e", binary] + [f"{a:#x}" for a in addresses],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    found = {}
    for address, row in zip(addresses, out):
        file, _, line = row.strip().rpartition(":")
        line = line.split()[0]
        if line.isdigit() and int(line):   # "??:?" or line 0: no row
            found[address] = (os.path.relpath(file, root), int(line))
    return found


def _line_addresses(binary: str) -> list[int]:
    text = subprocess.run(["objdump", "--dwarf=decodedline", binary], capture_output=True,
                          text=True, check=True).stdout
    out = []
    for row in text.splitlines():
        parts = row.split()
        if len(parts) >= 3 and parts[0].endswith((".c", ".h")) and parts[2].startswith("0x"):
            out.append(int(parts[2], 16))
    return out


@pytest.mark.parametrize("dwarf", ["-gdwarf-4", "-gdwarf-5"])
def test_a_lines_file_is_its_path_below_the_compile_directory(tmp_path, dwarf):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "account.h").write_text(HEADER)
    (tmp_path / "main.c").write_text(PROGRAM)
    binary = str(tmp_path / "main")
    subprocess.run(["gcc", "-O2", dwarf, "-o", binary, "main.c"], cwd=tmp_path, check=True)
    code = CodeMap(binary)
    try:
        expected = _addr2line(binary, _line_addresses(binary), str(tmp_path))
        for address, where in expected.items():
            assert code.line(address) == where, hex(address)
        files = {file for file, _ in expected.values()}
    finally:
        code.close()
    assert {"main.c", os.path.join("lib", "account.h")} <= files

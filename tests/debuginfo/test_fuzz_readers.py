"""Damaged debug info is one line, never a traceback nor a hang: hypothesis changes a few
bytes of real files and the readers must answer or refuse with ctracer's own error.

Inputs, built here: a program compiled with DWARF 5 (its ``.debug_info``,
``.debug_abbrev``, ``.debug_line`` and ``.debug_str`` damaged, read by the raw scanner and
by the pyelftools fallback, types read with pyelftools), BTF encoded by ``pahole -J``
(the raw blob damaged), and the ELF header and section header table of the program.
Every damaged copy is opened, its catalog built, structs read and methods discovered, as
``ctracer functions`` and ``ctracer struct`` would.

Each reader gets a fixed time budget (``CTRACER_FUZZ_SECONDS``, default 6 s; examples
after it are skipped), each damaged file ``HANG_SECONDS`` before it counts as a hang, and
the process a bound on its peak memory.  Failures are reported unshrunk (shrinking would
run past the budget): the mutation list hypothesis prints reproduces it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from support.cbuild import Build, compile_c, need
from ctracer.debuginfo import elf
from ctracer.debuginfo.btf import reader as btf
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.debuginfo.dwarf import scan as ds
from ctracer.errors import CtracerError
from ctracer.plan.discovery import discover

FIXTURES = Path(__file__).parents[1] / "fixtures"
BUDGET_SECONDS = float(os.environ.get("CTRACER_FUZZ_SECONDS", "6"))
#: the first round's seed; rounds go on with the next ones, so a run is repeatable (a CI
#: failure replays here) and another base explores other damage
FIRST_SEED = int(os.environ.get("CTRACER_FUZZ_SEED", "0"))
HANG_SECONDS = 30
PEAK_MEMORY_MB = 2048
#: structs read whole from each damaged file (the first ones by name)
STRUCTS_READ = 8


class Hang(Exception):
    """A damaged file took longer than HANG_SECONDS."""


@contextlib.contextmanager
def hang_guard():
    def expire(_signum, _frame):
        raise Hang(f"reading took over {HANG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def mutations(size: int):
    """1 to 8 (position, new byte) changes within ``size`` bytes."""
    return st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 255)),
                    min_size=1, max_size=8)


def damaged(original: bytes, start: int, changes) -> bytes:
    data = bytearray(original)
    for at, byte in changes:
        data[start + at] = byte
    return bytes(data)


def fuzz(size: int, check) -> int:
    """Run ``check(changes)`` on hypothesis' mutation lists until the budget is spent;
    anything it raises but a `CtracerError` fails the test.  Returns the number of
    damaged inputs tried."""
    deadline = time.monotonic() + BUDGET_SECONDS
    tried = []

    @settings(max_examples=20, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(mutations(size))
    def run(changes):
        if time.monotonic() > deadline:
            return
        tried.append(1)
        with hang_guard(), contextlib.suppress(CtracerError):
            check(changes)

    round_seed = FIRST_SEED
    while time.monotonic() < deadline:  # rounds of 20 examples, each round the next seed
        seed(round_seed)(run)()
        round_seed += 1
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mb < PEAK_MEMORY_MB, f"peak memory {peak_mb:.0f} MB"
    print(f"\n{len(tried)} damaged inputs in {BUDGET_SECONDS:.0f} s")
    assert tried
    return len(tried)


def read_everything(model) -> None:
    """What ``ctracer functions`` and ``ctracer struct`` ask of a type source."""
    catalog = model.catalog()
    names = catalog.struct_names()
    for name in names[:STRUCTS_READ]:
        model.find_struct(name)
    for name in names[:2]:
        discover(catalog, name)
    catalog.tracepoints()


# ------------------------------------------------------------------ inputs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def program(workdir) -> Path:
    out = workdir / "program"
    compile_c(sorted((FIXTURES / "dwarf").glob("*.c")), out, Build(dwarf=5, opt=0))
    return out


@pytest.fixture(scope="module")
def btf_blob(workdir) -> bytes:
    need("pahole")
    obj = workdir / "kinds.o"
    compile_c(FIXTURES / "btf" / "kinds.c", obj, Build(opt=0), flags=["-c"])
    import subprocess

    subprocess.run(["pahole", "-J", "--btf_gen_floats", str(obj)], check=True,
                   capture_output=True)
    section = elf.read_elf_headers(str(obj)).section(".BTF")
    with open(obj, "rb") as f:
        f.seek(section.offset)
        return f.read(section.size)


# ------------------------------------------------------------------ the readers


def _decline(_sections):
    raise ds.UnsupportedDwarf("the fuzz test reads with pyelftools")


@pytest.mark.parametrize("section", [".debug_info", ".debug_abbrev", ".debug_line",
                                     ".debug_str"])
@pytest.mark.parametrize("reader", ["scanner", "pyelftools"])
def test_damaged_dwarf_is_one_line(program, workdir, section, reader, monkeypatch):
    if reader == "pyelftools":  # the fallback for DWARF the scanner declines
        monkeypatch.setattr(ds, "list_units", _decline)
    original = program.read_bytes()
    where = elf.read_elf_headers(str(program)).section(section)
    path = workdir / f"damaged-{reader}{section}"

    def check(changes):
        path.write_bytes(damaged(original, where.offset, changes))
        read_everything(dwarf.open_elf_types(str(path), use_cache=False))

    fuzz(where.size, check)


def test_damaged_btf_is_one_line(btf_blob):
    def check(changes):
        read_everything(btf.model_from_bytes(damaged(btf_blob, 0, changes), "damaged BTF"))

    fuzz(len(btf_blob), check)


def test_damaged_elf_headers_are_one_line(program, workdir):
    """The ELF header and the section header table (offsets, sizes, links, names)."""
    original = program.read_bytes()
    headers_end = 64
    table = elf.read_elf_headers(str(program))
    shoff = int.from_bytes(original[0x28:0x30], "little")
    table_size = 64 * len(table.sections)
    path = workdir / "damaged-elf"

    def check(changes):
        header_changes = [(at, b) for at, b in changes if at < headers_end]
        table_changes = [(at - headers_end, b) for at, b in changes if at >= headers_end]
        data = damaged(damaged(original, 0, header_changes), shoff, table_changes)
        path.write_bytes(data)
        model = dwarf.open_elf_types(str(path), use_cache=False)
        read_everything(model)
        elf.build_id(str(path))
        elf.function_symbols(elf.read_elf_headers(str(path)), names={"main"})

    fuzz(headers_end + table_size, check)


#: damage the fuzz rounds found, kept so it stays fixed: (reader, section, changes)
FOUND_IN_CI = [
    # a DW_AT_name whose abbreviation says DW_FORM_ref_udata: a number for a struct name
    ("scanner", ".debug_abbrev", [(554, 21)]),
    # a DW_AT_sibling pointing at its own DIE: pyelftools' iter_children went round forever
    ("pyelftools", ".debug_info", [(1217, 184)]),
    # a DW_AT_sibling leading back: the scanner's jumps went round forever (found here in a
    # 60 s run)
    ("scanner", ".debug_info", [(592, 69), (49, 245), (1094, 26), (2046, 57), (1849, 24),
                                (127, 10), (860, 117), (596, 157)]),
    # an abbreviation turned into one whose DIE's handler leads back to a struct read before
    ("scanner", ".debug_abbrev", [(13, 0), (221, 25), (697, 52)]),
]


@pytest.mark.parametrize("reader,section,changes", FOUND_IN_CI)
def test_damage_found_before_is_one_line(program, workdir, reader, section, changes,
                                         monkeypatch):
    if reader == "pyelftools":
        monkeypatch.setattr(ds, "list_units", _decline)
    where = elf.read_elf_headers(str(program)).section(section)
    path = workdir / f"found-{reader}{section}"
    path.write_bytes(damaged(program.read_bytes(), where.offset, changes))
    with hang_guard(), pytest.raises(CtracerError, match="is the file damaged"):
        read_everything(dwarf.open_elf_types(str(path), use_cache=False))

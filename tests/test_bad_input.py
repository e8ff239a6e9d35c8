"""Bad input, end to end: every subcommand answers it with one line on stderr and a
non-zero exit, never a traceback (``--debug`` adds the traceback).

These run ``python -m ctracer`` as a user would.  The readers' own robustness is fuzzed in
the debuginfo tests; here the promise is about what reaches the terminal.  Tests that
need a read-only file system mount a small tmpfs (root only; skipped otherwise, saying
why)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile

import pytest

from support import groundtruth as gt
from support.synthetic_trace import write_synthetic_trace


@pytest.fixture(scope="module", autouse=True)
def built():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)


def ctracer(tmp_path, *args, env=None, timeout=300):
    full_env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), **(env or {})}
    full_env.pop("CTRACER_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True, cwd=tmp_path, env=full_env, timeout=timeout)


def one_line_error(r, *words) -> str:
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ctracer"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def read_only_dir(path):
    """A tiny read-only tmpfs mounted at ``path`` for the duration."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


# -- trace: options checked before anything is compiled ---------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_duration_must_be_a_positive_finite_number(tmp_path, value):
    r = ctracer(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-d", value, "--", "true")
    one_line_error(r, "-d", value)


def test_output_that_is_a_directory(tmp_path):
    """The output is checked first: with bcc pointed at an empty header tree, a compile
    would fail with a bcc message; the error is about the output instead."""
    empty = tmp_path / "no-headers"
    empty.mkdir()
    r = ctracer(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-o", str(tmp_path),
                "--", gt.SOCKDEMO, env={"BCC_KERNEL_SOURCE": str(empty)})
    one_line_error(r, "is a directory")


def test_output_on_a_read_only_file_system_is_refused_before_compiling(tmp_path):
    empty = tmp_path / "no-headers"
    empty.mkdir()
    with read_only_dir(tmp_path / "ro") as ro:
        r = ctracer(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-o",
                    str(ro / "sock.ctrace"), "--", gt.SOCKDEMO,
                    env={"BCC_KERNEL_SOURCE": str(empty)})
    one_line_error(r, "cannot write the trace file", "Read-only file system")


def test_output_in_a_missing_directory(tmp_path):
    r = ctracer(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-o",
                str(tmp_path / "nowhere" / "sock.ctrace"), "--", gt.SOCKDEMO)
    one_line_error(r, "no directory")


# -- report -------------------------------------------------------------------------------

def test_report_to_a_read_only_file_system(tmp_path):
    trace = tmp_path / "synthetic.ctrace"
    write_synthetic_trace(str(trace), lifecycles=2)
    with read_only_dir(tmp_path / "ro") as ro:
        r = ctracer(tmp_path, "report", str(trace), "-o", str(ro / "report"), "--no-plots")
    one_line_error(r, "Read-only file system")


@pytest.mark.parametrize("content", [b"", b"hello, not a trace\n", b"SQLite format 3\0" + b"\xff" * 200])
def test_report_of_something_that_is_not_a_trace(tmp_path, content):
    bad = tmp_path / "bad.ctrace"
    bad.write_bytes(content)
    r = ctracer(tmp_path, "report", str(bad), "-o", str(tmp_path / "report"))
    one_line_error(r, "bad.ctrace")


@pytest.mark.parametrize("plot_objects", ["3", "10"])
def test_report_refuses_plot_objects_without_plots(tmp_path, plot_objects):
    trace = tmp_path / "synthetic.ctrace"
    write_synthetic_trace(str(trace), lifecycles=2)
    r = ctracer(tmp_path, "report", str(trace), "--no-plots", "--plot-objects", plot_objects)
    one_line_error(r, "--no-plots", "--plot-objects would be ignored")
    assert r.returncode == 2 and not (tmp_path / "callgraph").exists()


def test_report_of_a_missing_file(tmp_path):
    r = ctracer(tmp_path, "report", str(tmp_path / "none.ctrace"))
    one_line_error(r, "none.ctrace")


# -- diff: traces that cannot be compared --------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"hello, not a trace\n", b"SQLite format 3\0" + b"\xff" * 200])
def test_diff_of_something_that_is_not_a_trace(tmp_path, content):
    good, bad = tmp_path / "good.ctrace", tmp_path / "bad.ctrace"
    write_synthetic_trace(str(good), lifecycles=2)
    bad.write_bytes(content)
    for args in ((good, bad), (bad, good), (f"{good},{bad}", good)):
        r = ctracer(tmp_path, "diff", *map(str, args))
        one_line_error(r, "bad.ctrace")
    assert not (tmp_path / "diff").exists()


def test_diff_of_a_trace_never_completed(tmp_path):
    """A file whose recorder never wrote the struct's layout."""
    from ctracer.tracefile import TraceWriter

    good, empty = tmp_path / "good.ctrace", tmp_path / "empty.ctrace"
    write_synthetic_trace(str(good), lifecycles=2)
    TraceWriter(str(empty)).close()
    r = ctracer(tmp_path, "diff", str(good), str(empty))
    one_line_error(r, "empty.ctrace", "never completed")


def test_diff_to_a_read_only_file_system(tmp_path):
    trace = tmp_path / "synthetic.ctrace"
    write_synthetic_trace(str(trace), lifecycles=2)
    with read_only_dir(tmp_path / "ro") as ro:
        r = ctracer(tmp_path, "diff", str(trace), str(trace), "-o", str(ro / "diff"))
    one_line_error(r, "Read-only file system")


@pytest.mark.parametrize("args", [["--limit", "-1"], ["--render", "--before-report", "x"],
                                  ["--per", "no_such_function"]])
def test_diff_refuses_options_that_cannot_work(tmp_path, args):
    trace = tmp_path / "synthetic.ctrace"
    write_synthetic_trace(str(trace), lifecycles=2)
    r = ctracer(tmp_path, "diff", str(trace), str(trace), *args)
    one_line_error(r)
    assert r.returncode == 2 and not (tmp_path / "diff").exists()


# -- debug info readers, through every command that reads a binary ------------------------

READERS = [["functions", "sock", "--no-cache"], ["struct", "sock"],
           ["trace", "sock", "--print-bpf"]]


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_binary_that_is_not_elf_or_is_truncated(tmp_path, command):
    data = open(gt.SOCKDEMO, "rb").read()
    for name, content, words in [("notelf", b"#!/bin/sh\necho hi\n", ["not an ELF"]),
                                 ("truncated", data[:3000], ["truncated"]),
                                 ("empty", b"", [])]:
        path = tmp_path / name
        path.write_bytes(content)
        one_line_error(ctracer(tmp_path, *command, "--binary", str(path)), name, *words)


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_binary_that_is_a_directory_or_missing(tmp_path, command):
    one_line_error(ctracer(tmp_path, *command, "--binary", str(tmp_path)), "directory")
    one_line_error(ctracer(tmp_path, *command, "--binary", str(tmp_path / "nope")),
                   "no such file")


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_binary_that_cannot_be_read(command):
    """A binary without read permission, opened by a user who is not root (root reads any
    file): ``setpriv`` runs ctracer as nobody."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("running ctracer as another user needs root and setpriv")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run([*nobody, sys.executable, "-c", "import ctracer"],
                      capture_output=True).returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable} with ctracer (a checkout "
                    "under a directory only root may enter)")
    with tempfile.TemporaryDirectory(dir="/tmp") as shared:
        os.chmod(shared, 0o777)
        binary = os.path.join(shared, "sockdemo")
        shutil.copy(gt.SOCKDEMO, binary)
        os.chmod(binary, 0)
        env = {**os.environ, "XDG_CACHE_HOME": shared, "HOME": shared}
        env.pop("CTRACER_DEBUG", None)
        r = subprocess.run([*nobody, sys.executable, "-m", "ctracer", *command, "--binary",
                            binary], capture_output=True, text=True, cwd=shared, env=env,
                           timeout=300)
    one_line_error(r, "permission denied", binary)


def _sections(path):
    from ctracer.debuginfo.elf import read_elf_headers
    return read_elf_headers(path)


@pytest.mark.parametrize("section", [".debug_info", ".debug_abbrev", ".debug_str",
                                     ".debug_line"])
def test_damaged_debug_info_never_prints_a_traceback(tmp_path, section):
    """Bytes of one DWARF section overwritten at random (fixed seeds): every command
    either still works or says what is wrong in one line."""
    data = open(gt.SOCKDEMO, "rb").read()
    sec = _sections(gt.SOCKDEMO).section(section)
    assert sec is not None, section
    for seed in range(6):
        rng = random.Random(f"{section}{seed}")
        damaged = bytearray(data)
        for _ in range(4):
            damaged[sec.offset + rng.randrange(sec.size)] = rng.randrange(256)
        path = tmp_path / f"damaged{seed}"
        path.write_bytes(damaged)
        for command in READERS[:2]:
            r = ctracer(tmp_path, *command, "--binary", str(path))
            assert "Traceback" not in r.stderr, (seed, command, r.stderr)
            if r.returncode != 0:
                lines = r.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("ctracer"), (seed, r.stderr)


# -- the guard itself ----------------------------------------------------------------------

GUARD = """
import sys
from ctracer import cli
from ctracer.commands import struct as command
def broken(args):
    {body}
command.run = broken
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("body, status, words", [
    ("raise TypeError('a bug')", 70, ["internal error: TypeError: a bug", "--debug"]),
    ("open('/nonexistent/file')", 1, ["/nonexistent/file", "No such file"]),
    ("raise IsADirectoryError(21, 'Is a directory', '/tmp')", 1, ["/tmp: Is a directory"]),
])
def test_anything_unexpected_is_one_line_and_debug_shows_the_traceback(tmp_path, body, status,
                                                                        words):
    script = GUARD.format(body=body)
    argv = [sys.executable, "-c", script, "struct", "sock", "--binary", gt.SOCKDEMO]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == status
    one_line_error(r, *words)
    r = subprocess.run(argv + ["--debug"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == status
    assert "Traceback" in r.stderr and r.stderr.strip().splitlines()[-1].startswith("ctracer:")

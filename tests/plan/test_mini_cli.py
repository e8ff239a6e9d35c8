"""`ctracer struct NAME --mini` end to end: the collectors' values instead of lock
internals, --explain, --cachelines 1,3, --max-bytes, the bytes reorganizing saved, and
bad selections as one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support import groundtruth as gt


@pytest.fixture(scope="module", autouse=True)
def built():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)


def struct(*args):
    return subprocess.run([sys.executable, "-m", "ctracer", "struct", "sock", "--binary",
                           gt.SOCKDEMO, "--mini", *args], capture_output=True, text=True,
                          timeout=120)


def members(text: str) -> list[str]:
    return re.findall(r"^\t\S+\s+(\w+)(?:\[\d+\])?;", text, re.M)


def test_complex_members_are_values_and_explain_says_why():
    r = struct()
    assert r.returncode == 0, r.stderr
    names = members(r.stdout)
    assert {"sk_lock__owned", "sk_lock__slock__held", "__sk_common__skc_refcnt",
            "sk_mutex__locked", "sk_receive_queue__qlen", "sk_accept_waiters__empty",
            "sk_bind_node__unhashed", "sk_hash_lock__held", "sk_stamp", "sk_drops",
            "sk_bytes_sent", "sk_mem_pages"} <= set(names)
    assert not [n for n in names if n.endswith(("__locked", "__owner", "__counter"))
                and n != "sk_mutex__locked"]
    saved = re.search(r"reorganized: (\d+) bytes, (\d+) saved over (\d+) in source order",
                      r.stdout)
    assert saved and int(saved.group(1)) + int(saved.group(2)) == int(saved.group(3))
    assert "--explain lists them" in r.stdout and "\n/*   " not in r.stdout
    r = struct("--explain")
    assert "/*   sk_lock (socket_lock_t, socket_lock): sk_lock.owned, sk_lock.slock.held */" \
        in r.stdout
    assert "/*   sk_socket: pointer (pointers not recorded) */" in r.stdout


def test_cachelines_and_max_bytes():
    r = struct("--cachelines", "1,3", "--explain")
    assert r.returncode == 0, r.stderr
    sources = re.findall(r"/\* [\w.]+: .*?, (?:byte (\d+)|bits (\d+)\+(\d+))", r.stdout)
    assert sources
    for byte, bit, _ in sources:
        line = (int(byte) if byte else int(bit) // 8) // 64
        assert line in (1, 3)
    assert re.search(r"/\*   __sk_common\.skc_state: not on cacheline 1, 3 \*/", r.stdout)
    r = struct("--max-bytes", "24", "--explain")
    assert r.returncode == 0, r.stderr
    size = int(re.search(r"/\* size: (\d+),", r.stdout).group(1))
    assert 0 < size <= 24
    assert "over the 24-byte limit */" in r.stdout


def test_collector_count_follows_the_selection():
    whole = int(re.search(r"collector of their type: (\d+) members \*/", struct().stdout)
                .group(1))
    r = struct("--fields", "sk_lock.*", "--explain")
    assert r.returncode == 0, r.stderr
    assert (f"collector of their type: 1 member ({whole - 1} more left out by the "
            "selection) */") in r.stdout
    listed = re.findall(r"^/\*   (\S+) \(.*?\): (.*) \*/$", r.stdout, re.M)
    assert ("sk_lock", "sk_lock.owned, sk_lock.slock.held") in listed


@pytest.mark.parametrize("args, words", [
    (("--cachelines", "1,x"), "invalid cacheline list value"),
    (("--max-bytes", "0"), "--max-bytes must be 1 or more"),
    (("--fields", "sk_lok"), "did you mean"),
    (("--field", "sk_lok"), "did you mean"),  # the former spelling, kept
])
def test_bad_selection_is_one_line(args, words):
    r = struct(*args)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr

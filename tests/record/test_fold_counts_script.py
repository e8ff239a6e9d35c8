"""The bpftrace side of tests/vm/guest/fold_counts.py (run in the 6.12 guest by
tests/vm/test_calls_changes_kernel.py): the ways and the key are method_counts.py's, so a
function's returns are counted under the probe's name (in a kretprobe bpftrace 0.17's
``func`` names the caller returned into), its entries under ``func``, and a function reaching the object through an
argument too is counted at entry only, as ctracer's entry events count it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

GUEST = Path(__file__).resolve().parents[1] / "vm" / "guest"


def _module():
    sys.path.insert(0, str(GUEST))   # the script imports method_counts beside it
    try:
        spec = importlib.util.spec_from_file_location("fold_counts", GUEST / "fold_counts.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GUEST))


def test_returns_are_keyed_by_the_probe_and_counted_only_where_nothing_else_reaches():
    fc = _module()
    ways = {"tcp_sendmsg": ["(uint64)arg0"], "tcp_push": ["(uint64)arg0"],
            "sk_prot_alloc": ["ret"], "inet_csk_clone": ["(uint64)arg0", "ret"]}
    script = fc.bpftrace_script(ways, 4242)
    probes = [ln for ln in script.splitlines() if ln.startswith(("kprobe:", "kretprobe:"))]
    assert probes == [
        "kprobe:inet_csk_clone,kprobe:tcp_push,kprobe:tcp_sendmsg /@on/ { $o0 = (uint64)arg0; "
        "if ($o0 != 0) { @calls[func, $o0] = count(); } }",
        "kretprobe:sk_prot_alloc /@on/ { if (retval != 0) { @calls[probe, (uint64)retval] = "
        "count(); } }"]
    assert "/pid == 4242 && args->option == " in script


def test_each_windows_counts_are_read_under_the_probed_function():
    fc = _module()
    text = ("ready\nwindow open\n@calls[tcp_sendmsg, -131391342524416]: 3\n"
            "@calls[kretprobe:sk_prot_alloc, -131391342524416]: 2\n\nwindow closed\n"
            "window open\n@calls[kprobe:tcp_push, 77]: 1\nwindow closed\n")
    assert fc.window_counts(text) == [
        {("tcp_sendmsg", 0xFFFF888011B3C800): 3, ("sk_prot_alloc", 0xFFFF888011B3C800): 2},
        {("tcp_push", 77): 1}]

"""`ctracer plan struct sock --json` on Debian's kernels, in the guest: what the plan
tried (a bpf(2) load and attach of each mechanism, never a version check) says fentry
and fexit work on every kernel, kprobe.multi only where the kernel was built with
CONFIG_FPROBE — read from the booted kernel's own config file, beside its image — which
Debian sets on 6.12 and 7.2 and not on 6.1, and tracing_multi links (and session programs
on them) only on 7.2; and fentry/fexit (on 7.2 one fsession.multi probe a function) are
placed on thousands of
struct sock methods (3,339 on 6.1, 3,620 on 6.12, 3,663 on 7.2 when this was written).
On every kernel: a plan takes seconds, and what each kernel accepts is what the rest of
the vm tests build on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm(kernels=("6.1", "6.12", "7.2"))


def _config(option: str) -> str | None:
    image = Path(os.environ["CTRACER_VM_IMAGE"])
    config = image.with_name(image.name.replace("vmlinuz-", "config-"))
    for line in config.read_text().splitlines():
        if line.startswith(f"{option}="):
            return line.split("=", 1)[1]
    return None


@pytest.fixture(scope="module")
def plan():
    r = subprocess.run([sys.executable, "-m", "ctracer", "plan", "struct", "sock", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_fentry_and_kprobe_multi_as_tried(vm_kernel, plan):
    kernel = plan["kernel"]
    assert kernel["running_kernel"] is True
    assert kernel["fentry"]["works"] is True, kernel["fentry"]
    assert kernel["kprobes"]["works"] is True, kernel["kprobes"]
    fprobe = _config("CONFIG_FPROBE") == "y"
    assert fprobe == (vm_kernel != "6.1")  # Debian's configs, as DESIGN.md §4 says
    assert kernel["kprobe_multi"]["works"] is fprobe, kernel["kprobe_multi"]
    # tracing_multi links (merged in 2026): 7.2 has them, Debian 12's kernels do not
    assert kernel["tracing_multi"]["works"] is (vm_kernel == "7.2"), kernel["tracing_multi"]
    # and session programs on them: the same kernels
    assert kernel["fsession_multi"]["works"] is (vm_kernel == "7.2"), kernel["fsession_multi"]
    print(f"{vm_kernel}: fentry: {kernel['fentry']['why']}; "
          f"kprobe.multi: {kernel['kprobe_multi']['why']}; "
          f"tracing_multi: {kernel['tracing_multi']['why']}")


def test_fentry_and_fexit_are_placed_on_thousands_of_methods(vm_kernel, plan):
    """fentry/fexit, on tracing_multi links as one session program (fsession.multi)
    where the kernel has them."""
    counts = plan["kernel"]["counts"]
    kind, exit_kind = ("fsession.multi", "fsession.multi") if vm_kernel == "7.2" else \
        ("fentry", "fexit")
    assert not ({"fentry", "fentry.multi", "fsession.multi"} - {kind}) & set(counts), counts
    fentry, fexit = counts[kind], counts[exit_kind]
    print(f"{vm_kernel}: {json.dumps(counts)}")
    assert fentry["attachable"] > 2000, counts
    assert fexit["attachable"] == fentry["attachable"], counts
    assert fentry["not attachable"] == fentry["unknown"] == 0, counts
    probes = [p for p in plan["probes"] if p["kind"] == kind]
    assert len(probes) == fentry["attachable"]
    # what fentry could not take falls back to kprobes, which this kernel attaches
    assert counts.get("kprobe", {}).get("not attachable", 0) == 0, counts
    # tracepoints carrying the struct get raw tracepoint programs
    assert counts["raw_tracepoint"]["attachable"] > 20, counts


def test_the_plan_says_which_kind_a_trace_takes_for_many_functions(vm_kernel):
    """Above its count of functions a trace under ``auto`` takes kprobes over fentry where
    tracing_multi links are missing: kprobe.multi links on 6.12, perf kprobes on 6.1 (no
    kprobe.multi), said with the reason; 7.2 keeps fsession.multi, whatever the count."""
    r = subprocess.run([sys.executable, "-m", "ctracer", "plan", "struct", "sock"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stdout.splitlines() if "ctracer trace probes these functions" in x]
    print(f"{vm_kernel}: {line}")
    if vm_kernel == "7.2":
        assert not line, r.stdout
        return
    how = "perf kprobes and kretprobes" if vm_kernel == "6.1" else "kprobe.multi links"
    assert len(line) == 1 and f"with {how} by default (" in line[0], r.stdout
    assert ("one perf kprobe each (no kprobe.multi link here)" in line[0]) == \
        (vm_kernel == "6.1"), line

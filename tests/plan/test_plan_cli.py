"""`ctracer plan` end to end (without --verify): the JSON shape, the kinds chosen on the
running kernel by what it was seen to accept, the functions table's ATTACHABLE column
agreeing with the plan, uprobes for a user-space program, and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

from support import groundtruth as gt
import pytest

from ctracer.host import features

KERNEL_BTF = "/sys/kernel/btf/vmlinux"
SAMPLES = Path(__file__).parents[2] / "samples"
KINDS = {"fentry", "fexit", "kprobe", "kretprobe", "raw_tracepoint", "uprobe", "uretprobe"}


def ctracer(*args):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def sock_plan():
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    r = ctracer("plan", "struct", "sock", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.kernel
def test_json_is_kernel_and_probes_only(sock_plan):
    assert set(sock_plan) == {"kernel", "probes"}
    for p in sock_plan["probes"]:
        assert set(p) == {"function", "kind", "verified", "error"}
        assert p["kind"] in KINDS or p["kind"] is None
        assert p["verified"] is None and p["error"]      # nothing loaded without --verify
    for name in ("fentry", "kprobes", "kprobe_multi", "raw_tracepoints", "uprobes"):
        assert set(sock_plan["kernel"][name]) == {"works", "why"}
        assert sock_plan["kernel"][name]["why"]


@pytest.mark.kernel
def test_kinds_follow_what_the_kernel_accepted(sock_plan):
    k = sock_plan["kernel"]
    kinds = {p["kind"] for p in sock_plan["probes"]} - {None}
    functions = {p["function"] for p in sock_plan["probes"] if not p["function"].startswith("tp:")}
    print(f"\nfentry {k['fentry']['works']}, kprobes {k['kprobes']['works']}; "
          f"{len(functions)} functions; kinds {sorted(kinds)}; counts {k['counts']}")
    if k["fentry"]["works"]:
        assert {"fentry", "fexit"} <= kinds and not {"kprobe", "kretprobe"} & kinds
    else:
        assert {"kprobe", "kretprobe"} <= kinds and not {"fentry", "fexit"} & kinds
    tps = {p["function"]: p for p in sock_plan["probes"] if p["kind"] == "raw_tracepoint"}
    assert "tp:inet_sock_set_state" in tps
    if k["raw_tracepoints"]["works"]:
        assert k["counts"]["raw_tracepoint"]["attachable"] == len(tps)
    if not k["fentry"]["works"] and not k["kprobes"]["works"]:
        # this machine: only the tracepoints can be placed
        assert k["counts"]["kprobe"]["attachable"] == 0
    left = [p for p in sock_plan["probes"] if p["kind"] is None]
    assert all(p["error"].startswith("left out: ") for p in left)
    assert any("__SCT__" in p["function"] or "tracepoint glue" in p["error"] for p in left)


@pytest.mark.kernel
def test_text_counts_and_reasons():
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    r = ctracer("plan", "sock")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("struct sock (BTF of /sys/kernel/btf/vmlinux): probe plan for ")
    assert "probes per kind:" in out and "functions left out:" in out
    row = next(line for line in out.splitlines() if line.startswith("tcp_close "))
    support = features.probe_support()
    if not support.fentry.works and not support.kprobes.works:
        assert row.split()[1:3] == ["kprobe+kretprobe", "no"]
        assert "placed here: " in out and "raw_tracepoint" in out.split("placed here: ")[1]


@pytest.mark.kernel
def test_functions_attachable_column_agrees_with_the_plan(sock_plan):
    r = ctracer("functions", "struct", "sock", "--json", "--route-kind", "direct,tracepoint")
    assert r.returncode == 0, r.stderr
    methods = json.loads(r.stdout)["methods"]
    planned = {}
    for p in sock_plan["probes"]:
        planned.setdefault(p["function"], p)
    k = sock_plan["kernel"]
    yes = [m for m in methods if m["attachable"] == "yes"]
    if not k["fentry"]["works"] and not k["kprobes"]["works"]:
        # a kernel without kprobes and without fentry attaches no function: only tracepoints
        assert yes and all(m["tracepoint"] for m in yes)
    for m in methods:
        p = planned[m["key"]]
        if m["attachable"] == "yes":
            assert p["kind"] is not None


@pytest.fixture(scope="module")
def sample():
    r = subprocess.run(["make", "-s", "-C", str(SAMPLES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return gt.SOCKDEMO


def test_user_space_binary_gets_uprobes(sample):
    r = ctracer("plan", "sock", "--binary", sample, "--json", "--no-cache")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    kinds = {p["kind"] for p in doc["probes"]}
    assert {"uprobe", "uretprobe"} <= kinds and not kinds & {"kprobe", "fentry", "raw_tracepoint"}
    assert doc["kernel"]["space"] == "user"


def test_bad_input_is_one_line():
    r = ctracer("plan", "struct", "no_such_struct_xyz")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = ctracer("plan", "sock", "--binary", "/nonexistent/prog")
    assert r.returncode != 0 and "Traceback" not in r.stderr


@pytest.mark.kernel
def test_verify_as_an_unprivileged_user_says_it_needs_root_in_one_line():
    import shutil
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as another user")
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "ctracer", "plan", "sock", "--verify"],
                       capture_output=True, text=True,
                       env={**os.environ, "HOME": "/tmp", "XDG_CACHE_HOME": "/tmp/nobody-cache"})
    if "Permission denied" in r.stderr and "python" in r.stderr:
        pytest.skip("the unprivileged user cannot run this checkout's Python")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "ctracer: error: --verify loads BPF programs through the kernel's verifier, which "
        "needs root (or CAP_BPF and CAP_PERFMON): run it as root, e.g. with sudo"]


@pytest.mark.kernel
def test_plain_names_select_what_a_glob_does(sock_plan):
    """--functions and --exclude given exact names (looked up, not matched as globs)
    select the same methods as a glob covering them."""
    names = sorted({p["function"] for p in sock_plan["probes"]
                    if p["function"].startswith("tcp_")})   # no tracepoint: tp:NAME
    assert len(names) > 2
    by_glob = ctracer("plan", "struct", "sock", "--json", "--functions", "tcp_*",
                      "--exclude", names[0])
    by_names = ctracer("plan", "struct", "sock", "--json", "--functions", *names[1:])
    assert by_glob.returncode == 0 and by_names.returncode == 0, by_glob.stderr + by_names.stderr
    # the glob also matches the tracepoints named tcp_*, listed as tp:NAME
    functions = [[p for p in json.loads(r.stdout)["probes"] if not p["function"].startswith("tp:")]
                 for r in (by_glob, by_names)]
    assert functions[0] == functions[1] and len(functions[0]) >= len(names) - 1
    assert names[0] not in {p["function"] for p in functions[1]}

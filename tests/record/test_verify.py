"""Proof by the verifier: every kprobe entry and exit program of every method of struct sock
and struct sk_buff on this kernel (kprobes cannot be attached here, but kprobe-type
programs load), the uprobe programs of the sample, and a rejected program reported with
the verifier's own message.  Needs root; skips, saying why, when BPF programs cannot be
loaded here."""

import os
import subprocess
import sys

from support import groundtruth as gt
import pytest

from ctracer.debuginfo.catalog import ShapeKind
from ctracer.plan import attach, discovery
from ctracer.host import features

pytestmark = pytest.mark.kernel
KERNEL_BTF = "/sys/kernel/btf/vmlinux"


@pytest.fixture(scope="module")
def support():
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root")
    s = features.probe_support()
    if not s.kprobe_programs.works:
        pytest.skip(f"kprobe-type programs do not load here: {s.kprobe_programs.why}")
    return s


def kernel_plan(name, support):
    from ctracer.debuginfo.btf import reader as btf
    if not os.path.exists(KERNEL_BTF):
        pytest.skip("this kernel has no BTF")
    model = btf.open_btf(KERNEL_BTF)
    found = discovery.discover(model.catalog(), name)
    facts = features.kernel_facts([m.name for m in found.methods if not m.is_tracepoint],
                                [m.name for m in found.methods if m.is_tracepoint],
                                support=support)
    return (attach.plan_probes(found.methods, facts), model.find_struct(name, ShapeKind.STRUCT),
            model.catalog())


@pytest.mark.bpf
@pytest.mark.parametrize("name", ["sock", "sk_buff"])
def test_every_kprobe_program_of_the_struct_passes_the_verifier(name, support):
    from ctracer.record import verify
    plan, graph, catalog = kernel_plan(name, support)
    entries = plan.of_kind("kprobe", "kretprobe")
    verdicts = verify.verify_plan(plan, graph, catalog=catalog)
    got = [verdicts.get(p) for p in entries]
    accepted = sum(1 for ok, _ in got if ok is True)
    rejected = [(p.kind, p.function, error) for p, (ok, error) in zip(entries, got) if ok is False]
    untried = [(p.function, error) for p, (ok, error) in zip(entries, got) if ok is None]
    print(f"\nstruct {name}: {len({p.function for p in entries})} functions, "
          f"{len(entries)} kprobe/kretprobe programs: {accepted} accepted, "
          f"{len(rejected)} rejected, {len(untried)} without a program; {verdicts.note}")
    for kind, function, error in rejected[:10]:
        print(f"  rejected {kind} {function}: {error}")
    for function, error in untried[:10]:
        print(f"  no program: {function}: {error}")
    assert len(entries) > 1000
    assert not rejected
    # a function whose arguments cannot be located gets no program, and says why
    assert all(error.startswith("no program generated: ") for _, error in untried)
    assert accepted + len(untried) == len(entries) and len(untried) < len(entries) // 100
    # the raw tracepoint programs a recording loads, verified alike
    tps = [(p.function, verdicts.get(p)) for p in plan.of_kind("raw_tracepoint")]
    print(f"  {len(tps)} raw tracepoint programs: "
          f"{sum(1 for _, (ok, _e) in tps if ok)} accepted")
    assert tps and all(ok is True for _, (ok, _e) in tps), [t for t in tps if not t[1][0]][:3]


@pytest.mark.bpf
def test_a_rejected_program_is_reported_with_the_verifiers_message(support):
    from ctracer.record import bpf_runtime
    text = """
#include <uapi/linux/ptrace.h>
int good(struct pt_regs *ctx) { return 0; }
int wild_read(struct pt_regs *ctx) { return *(int *)PT_REGS_PARM1(ctx); }
"""
    result = bpf_runtime.verify_programs(text, ["good", "wild_read"])
    assert result["good"] == ""
    print(f"\nwild_read: {result['wild_read']}")
    assert result["wild_read"].startswith("bpf: Failed to load program")
    assert "invalid mem access" in result["wild_read"]


@pytest.mark.bpf
def test_plan_verify_on_the_sample_loads_its_uprobe_programs(support):
    import json
    r = subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "ctracer", "plan", "sock", "--binary",
                        gt.SOCKDEMO, "--verify", "--json", "--no-cache"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    probes = json.loads(r.stdout)["probes"]
    uprobes = [p for p in probes if p["kind"] in ("uprobe", "uretprobe")]
    assert uprobes and all(p["verified"] is True and p["error"] is None for p in uprobes)
    print(f"\nsample: {len(uprobes)} uprobe/uretprobe programs accepted")


@pytest.mark.bpf
def test_plan_verify_command_on_chosen_kernel_functions(support):
    """The command path: --functions picks a few, --json reports each verdict."""
    import json
    r = subprocess.run([sys.executable, "-m", "ctracer", "plan", "struct", "sock", "--verify",
                        "--json", "--functions", "tcp_v4_*", "tp:inet_sock_set_state",
                        "--exclude", "tcp_v4_md5*"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    probes = doc["probes"]
    functions = {p["function"] for p in probes}
    assert "tcp_v4_connect" in functions and "tp:inet_sock_set_state" in functions
    assert not any(f.startswith("tcp_v4_md5") for f in functions)
    assert all(f.startswith("tcp_v4_") or f == "tp:inet_sock_set_state" for f in functions)
    kinds = {p["kind"] for p in probes if p["kind"]}
    assert "raw_tracepoint" in kinds and kinds & {"kprobe", "fentry"}
    for p in probes:
        if p["kind"] in ("kprobe", "kretprobe", "raw_tracepoint"):
            assert p["verified"] is True and p["error"] is None, p
        elif p["kind"] is None:
            assert p["verified"] is None and p["error"].startswith("left out: ")
    v = doc["kernel"]["verifier"]
    assert v["rejected"] == 0 and v["accepted"] == sum(1 for p in probes if p["verified"])
    print(f"\nplan --verify: {v}")


@pytest.mark.bpf
def test_thread_state_in_task_storage_and_in_the_lru_hashes_both_load(support):
    """The kernel-function programs keep each thread's depth and saved calls in task
    storage where the kind's programs may use it (tried here with a hand-made map and
    program; a call deeper than the storage keeps in an LRU hash), else in two LRU
    hashes: both texts pass the verifier, so a kernel refusing
    task storage still gets its functions traced."""
    from ctracer.probes.kernel_program import build_kernel_program
    from ctracer.record import bpf_runtime
    trial = features.task_storage_works("kprobe")
    print(f"\ntask storage for kprobe programs: {trial}")
    assert trial.works is True, trial.why   # every kernel that loads kprobe-type programs here
    plan, graph, catalog = kernel_plan("sock", support)
    methods = [m for p in plan.of_kind("kprobe") for m in p.methods
               if m.name in ("tcp_sendmsg", "tcp_set_state", "sk_alloc", "tcp_v4_do_rcv")]
    assert methods
    from ctracer.plan import mini
    layout = mini.build_mini(graph).layout
    for storage in (True, False):
        program = build_kernel_program((), layout, catalog, function_methods=methods,
                                       entry_kind="kprobe", task_storage=storage)
        assert ("BPF_TASK_STORAGE(ctracer_kthreads" in program.text) == storage
        # a task-storage text holds the LRU-hash variants too (loaded where a verifier
        # refuses the first): both are checked
        names = program.program_names() + program.program_names(task_storage=False)
        results = bpf_runtime.verify_programs(program.text, sorted(set(names)))
        assert results and all(v == "" for v in results.values()), (storage, results)
        assert any(n.endswith("_lru") for n in results)
        assert any(not n.endswith("_lru") for n in results) == storage

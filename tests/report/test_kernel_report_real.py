"""What a kernel engineer sees in the report and exports of real recordings on this
machine's kernel (tracepoints, real BPF): the tcploop workload traced as ``sk_buff``
with a project file, and as ``sock`` with ``--pointers``.  Oracles: the kernel's own
/sys/class/net (device names and indexes), bpftool's dump of the kernel's BTF (the
NETIF_F_*_BIT enum), the trace's raw values read back with `ctracer.tracefile.Trace`,
and jq reading the JSON export.

Needs root and a kernel that takes raw tracepoint programs; skipped (saying why) only
when BPF is unavailable.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import kernelrun as kr
from ctracer.report import render_report
from ctracer.report.index_data import read_objects_file
from ctracer.tracefile import Trace


def _ctracer(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def _sysfs_devices() -> dict[int, str]:
    return {int((d / "ifindex").read_text()): d.name for d in Path("/sys/class/net").iterdir()}


@pytest.fixture(scope="module")
def skb_run(tmp_path_factory):
    """sk_buff over tcploop, with a project file naming summary fields."""
    kr.bpf_or_skip()
    tmp = tmp_path_factory.mktemp("skb")
    workload = kr.workload_copy(tmp)
    project = tmp / "skb.toml"
    project.write_text('struct = "sk_buff"\n[objects]\nsummary_fields = ["mark", "hash"]\n')
    r = _ctracer("trace", "--project", str(project), "-q", "-o", str(tmp / "skb.ctrace"),
                 "--", workload, "--connections", "3", "--port", str(kr.free_port()), cwd=tmp)
    assert r.returncode == 0, r.stderr
    render_report(str(tmp / "skb.ctrace"), str(tmp / "report"), plots=False)
    return Trace(str(tmp / "skb.ctrace")), tmp / "report"


@pytest.fixture(scope="module")
def sock_run(tmp_path_factory):
    """sock over tcploop, pointer members recorded too."""
    kr.bpf_or_skip()
    tmp = tmp_path_factory.mktemp("sock")
    workload = kr.workload_copy(tmp)
    r = _ctracer("trace", "struct", "sock", "--pointers", "-q", "-o", str(tmp / "s.ctrace"),
                 "--", workload, "--connections", "3", "--port", str(kr.free_port()), cwd=tmp)
    assert r.returncode == 0, r.stderr
    render_report(str(tmp / "s.ctrace"), str(tmp / "report"), plots=False)
    return Trace(str(tmp / "s.ctrace")), tmp / "report"


@pytest.mark.bpf
def test_sk_buffs_are_named_by_the_device_they_came_in_on(skb_run):
    """The trace carries the recording host's devices (as /sys/class/net has them); each
    sk_buff's device column names, in order, the devices its skb_iif held."""
    trace, report = skb_run
    devices = _sysfs_devices()
    assert {int(k): v for k, v in trace.meta_json("net_devices").items()} == devices
    taken: dict[str, list[int]] = {}
    for e in trace.events():
        values = trace.values(e)
        if values is None:
            continue
        lifetime = taken.setdefault(hex(e.object), [])
        if values["skb_iif"] and values["skb_iif"] not in lifetime:
            lifetime.append(values["skb_iif"])
    text = (report / "objects.js").read_text()
    assert '"summary_columns":["len","protocol","device","comm","mark","hash"]' in text
    objects = read_objects_file(text)
    shown = {o["label"]: o["summary"][2] for o in objects}
    for label, device in shown.items():
        address = label.split("-")[0]
        if "-" not in label and sum(1 for other in shown if other.startswith(address + "-")) == 0:
            # a buffer seen in one lifetime: its device is every index its skb_iif held
            assert device == " → ".join(devices[i] for i in taken[address]), label
    assert "lo" in shown.values()  # tcploop's packets come in on the loopback device
    lo = next(i for i, n in devices.items() if n == "lo")
    received = next(o for o in objects if o["summary"][2] == "lo" and o["dir"])
    changes = (report / received["dir"] / "changes.html").read_text()
    assert f"lo ({lo})" in changes  # skb_iif's value, by name, the index beside it


@pytest.mark.bpf
def test_project_summary_fields_are_columns_of_the_object_list(skb_run):
    """[objects] summary_fields of the project file: kept in the trace, shown as
    columns, each the values the field took (the trace's own values, as shown)."""
    trace, report = skb_run
    assert trace.meta_json("summary_fields") == ["mark", "hash"]
    objects = read_objects_file((report / "objects.js").read_text())
    index = (report / "index.html").read_text()
    assert "<th>device</th><th>comm</th><th>mark</th><th>hash</th>" in index
    single = {o["label"]: o["summary"][4:] for o in objects if "-" not in o["label"]}
    hashes: dict[str, list[int]] = {}
    for e in trace.events():
        values = trace.values(e)
        if values is not None and hex(e.object) in single:
            seen = hashes.setdefault(hex(e.object), [])
            if not seen or seen[-1] != values["hash"]:
                seen.append(values["hash"])
    checked = 0
    for label, (mark, hash_) in single.items():
        if any(o["label"].startswith(label + "-") for o in objects) or label not in hashes:
            continue
        steps = [str(v) for v in hashes[label]]
        if len(steps) <= 6:
            assert hash_ == " → ".join(steps), label
            checked += 1
    assert checked and all(m for m, _ in single.values())


@pytest.mark.bpf
def test_a_device_filter_admits_the_buffers_the_report_shows_on_it(tmp_path):
    """--where 'skb_iif == lo': the device written as the report names it; each object
    recorded was admitted at a hit where its skb_iif was the loopback's index."""
    kr.bpf_or_skip()
    workload = kr.workload_copy(tmp_path)
    out = tmp_path / "lo.ctrace"
    r = _ctracer("trace", "sk_buff", "--where", "skb_iif == lo", "-q", "-o", str(out), "--",
                 workload, "--connections", "3", "--port", str(kr.free_port()), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lo = next(i for i, n in _sysfs_devices().items() if n == "lo")
    trace = Trace(str(out))
    first: dict[int, int] = {}
    for e in trace.events():
        values = trace.values(e)
        if values is not None:
            first.setdefault(e.object, values["skb_iif"])
    assert first and set(first.values()) == {lo}
    assert trace.meta_json("admission")["where"] == f"skb_iif == {lo}"


def _netif_bits() -> dict[int, str]:
    """The kernel's NETIF_F_*_BIT enum as bpftool dumps its BTF: bit → NETIF_F_ name."""
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is not installed")
    text = subprocess.run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
                          capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"'(NETIF_F_\w+)_BIT' val=(\d+)", text))
    return {int(v): n for n, v in found.items()}


@pytest.mark.bpf
@pytest.mark.kernel
def test_route_caps_read_by_the_kernels_feature_bits(sock_run):
    """sk_route_caps (netdev_features_t) on a socket's changes page: the names of the
    bits its raw value sets, as the kernel's BTF numbers them, the raw value beside;
    a loopback connection's route has the loopback device's NETIF_F_LOOPBACK."""
    trace, report = sock_run
    bits = _netif_bits()
    values = {}
    for e in trace.events():
        v = trace.values(e)
        if v is not None and v.get("sk_route_caps"):
            values.setdefault(hex(e.object), v["sk_route_caps"])
    assert values
    address, caps = next(iter(values.items()))
    names = [bits[b] for b in sorted(bits) if caps >> b & 1]
    assert "NETIF_F_LOOPBACK" in names
    assert caps == sum(1 << b for b in bits if bits[b] in names)  # every bit set is named
    text = f"{'|'.join(names)} (0x{caps:x})"
    pages = [p for p in report.glob(address + "*/changes.html")
             if text in p.read_text().replace("<wbr>", "")]  # breakable after each "|"
    assert pages, text


@pytest.mark.bpf
def test_pointer_fields_leave_as_hex_strings_jq_reads_exactly(sock_run, tmp_path):
    """--pointers records kernel addresses (above 2**63): JSON Lines carries them as hex
    strings, which jq hands back digit for digit, as the trace holds them."""
    trace, _ = sock_run
    r = _ctracer("export", trace.path, "-o", str(tmp_path / "s.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    pointers = [f.name for f in trace.mini.fields if f.kind == "pointer"]
    assert "sk_socket" in pointers
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed")
    out = subprocess.run(["jq", "-r", '[.time_ns, .fields.sk_socket // "-"] | @tsv',
                          str(tmp_path / "s.jsonl")], capture_output=True, text=True,
                         check=True).stdout
    exported = {int(t): s for t, s in (ln.split("\t") for ln in out.splitlines())}
    recorded = {e.ts_ns: trace.values(e) for e in trace.events()}
    kernel = [t for t, s in exported.items() if s != "-" and int(s, 16) >= 1 << 63]
    assert kernel  # a kernel address a JSON number would have rounded
    for t, s in exported.items():
        if s != "-":
            assert s == f"0x{recorded[t]['sk_socket']:x}"


@pytest.mark.bpf
def test_a_tracepoint_only_object_page_counts_hits(sock_run):
    """This kernel attaches tracepoints only: an object's header, its graph and the
    object list count hits, not calls."""
    trace, report = sock_run
    objects = read_objects_file((report / "objects.js").read_text())
    assert objects and all(o["calls"] == 0 and o["hits"] == o["events"] for o in objects)
    page = (report / objects[0]["dir"] / "index.html").read_text()
    facts = dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page.split("<h2>")[0]))
    assert facts["hits"] == str(objects[0]["events"]) and "calls" not in facts
    assert re.search(r">\d+ hits?(<| ·)", page) and not re.search(r">\d+ calls?(<| ·)", page)

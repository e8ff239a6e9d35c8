"""`ctracer functions` end to end: the table, the counts, --json, --route-kind, and bad input,
on the kernel-shaped fixture's DWARF; and on the running kernel's BTF when it has one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c

FIXTURES = Path(__file__).parents[1] / "fixtures" / "discovery"
KERNEL_BTF = "/sys/kernel/btf/vmlinux"


def ctracer(*args):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "net"
    compile_c([FIXTURES / "net.c", FIXTURES / "net2.c"], out, Build(opt=0))
    return str(out)


def test_table_rows_counts_and_notes(binary):
    r = ctracer("functions", "struct", "sock", "--binary", binary, "--no-cache")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"struct sock (DWARF of {binary}): 21 methods in 19 functions")
    rows = [line.split() for line in lines if line.startswith(("sock_sendmsg ", "tcp_connect "))]
    assert ["sock_sendmsg", "holder", "yes", "socket->sk", "(param", "1", "sock)"] in rows
    assert any(row[:3] == ["tcp_connect", "alias", "yes"] and "struct tcp_sock" in " ".join(row)
               for row in rows)
    inline = next(line for line in lines if line.startswith("sk_is_ready@"))
    assert "no: inline only" in inline
    kinds = lines[lines.index("methods per route kind:") + 1:lines.index("methods per route:")]
    assert {k.split()[0]: int(k.split()[1]) for k in kinds} == {
        "direct": 11, "double_pointer": 1, "alias": 2, "holder": 5, "returns": 2}
    assert any(line.split()[:3] == ["holder", "2", "socket->sk"] for line in lines)
    assert "notes:" in lines


def test_json_is_stable_and_filtered(binary):
    r = ctracer("functions", "sock", "--binary", binary, "--json", "--route-kind", "holder",
                "--route-kind", "returns,alias")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"target", "source", "methods", "counts", "aliases", "holders",
                        "by_value", "notes"}
    assert doc["target"] == {"kind": "struct", "name": "sock", "size": 136, "defined": True}
    assert {m["reach"] for m in doc["methods"]} == {"holder", "returns", "alias"}
    assert sum(doc["counts"]["reach"].values()) == len(doc["methods"])
    skb = next(m for m in doc["methods"] if m["function"] == "skb_owner_len")
    assert skb["path"] == [{"op": "deref", "offset": 8, "member": "sk"}]
    assert skb["param_type"] == "const struct sk_buff *" and skb["address"]
    assert "attachable" not in skb      # not the running kernel's types


def test_bad_input_is_one_line(binary):
    r = ctracer("functions", "struct", "sok", "--binary", binary)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"ctracer: error: no struct sok in DWARF of {binary}; did you mean sock, socket?"]
    r = ctracer("functions", "sock", "--binary", binary, "--route-kind", "bogus")
    assert r.returncode == 2 and "unknown route kind 'bogus'" in r.stderr
    r = ctracer("functions", "sock", "--binary", "/nonexistent/prog")
    assert r.returncode != 0 and "Traceback" not in r.stderr


@pytest.mark.kernel
def test_running_kernel_has_tracepoints_and_attachable_column():
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    r = ctracer("functions", "struct", "sock", "--json", "--route-kind", "direct,tracepoint")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    counts = doc["counts"]["reach"]
    assert counts["direct"] > 100 and counts["tracepoint"] > 0
    tps = {m["function"] for m in doc["methods"] if m["reach"] == "tracepoint"}
    assert "inet_sock_set_state" in tps
    states = {m["attachable"].split(":")[0] for m in doc["methods"]}
    assert "yes" in states and states <= {"yes", "no", "clone", "unknown"}

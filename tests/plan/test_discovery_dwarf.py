"""Method discovery on real DWARF: the kernel-shaped fixture (tests/fixtures/discovery)
built by gcc and clang, DWARF 4 and 5, -O0 and -O2.  The expected methods are written
from the C source by hand; pfunct, pahole and nm are the outside oracles."""

import re
import subprocess
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan.discovery import discover

FIXTURES = Path(__file__).parents[1] / "fixtures" / "discovery"

BUILDS = [Build("gcc", 5, 0), Build("gcc", 4, 2), Build("clang", 4, 0), Build("clang", 5, 2)]

TCP_CHAIN = "struct sock ← struct inet_sock ← struct inet_connection_sock ← struct tcp_sock"

#: (function key, kind, parameter index, route), from net.c and net2.c
EXPECTED = {
    ("sock_state", "direct", 0, "struct sock"),            # const struct sock *
    ("sock_set_state", "direct", 0, "struct sock"),        # sock_ptr typedef
    ("sock_rcvbuf", "direct", 0, "struct sock"),           # volatile sock_t *
    ("sock_family", "direct", 0, "struct sock"),           # csock_t * (const typedef)
    ("sk_cmp", "direct", 0, "struct sock"),
    ("sk_cmp", "direct", 2, "struct sock"),
    ("sock_init_data", "direct", 1, "struct sock"),
    ("sk_helper@net.c", "direct", 0, "struct sock"),       # static, two compile units
    ("sk_helper@net2.c", "direct", 0, "struct sock"),
    ("net2_entry", "direct", 0, "struct sock"),
    ("sk_is_ready@net.c", "direct", 0, "struct sock"),     # inline only
    ("sk_pop", "double_pointer", 0, "*(struct sock **)"),
    ("inet_bind", "alias", 0, "struct sock ← struct inet_sock"),
    ("tcp_connect", "alias", 0, TCP_CHAIN),
    ("sock_init_data", "holder", 0, "socket->sk"),
    ("sock_sendmsg", "holder", 0, "socket->sk"),
    ("sock_alloc_inode", "holder", 0, "socket_alloc->socket.sk"),
    ("skb_owner_len", "holder", 0, "sk_buff->sk"),         # through an anonymous union
    ("slot_rto", "holder", 0, f"conn_slot->tp ({TCP_CHAIN})"),
    ("sk_alloc", "returns", None, "returns struct sock *"),
    ("inet_alloc", "returns", None, "returns struct sock ← struct inet_sock *"),
}


def _build(tmp_path_factory, build: Build):
    out = tmp_path_factory.mktemp("discovery") / f"net-{build.cc}-O{build.opt}-dwarf{build.dwarf}"
    compile_c([FIXTURES / "net.c", FIXTURES / "net2.c"], out, build)
    return out


@pytest.fixture(scope="module", params=BUILDS,
                ids=lambda b: f"{b.cc}-O{b.opt}-gdwarf-{b.dwarf}")
def built(request, tmp_path_factory):
    binary = _build(tmp_path_factory, request.param)
    found = discover(dwarf.open_elf_types(str(binary), use_cache=False).catalog(), "sock")
    return binary, found


def short_key(m):
    """The method's key with the compile unit's directory dropped (net.c, net2.c)."""
    unit = getattr(m.function, "unit", "")
    return m.key if "@" not in m.key else f"{m.name}@{Path(unit).name}"


def test_methods_match_the_source(built):
    _, found = built
    got = {(short_key(m), m.route_kind, m.param_index, m.route_form) for m in found.methods}
    assert got == EXPECTED


def test_pfunct_direct_set_is_included(built):
    binary, found = built
    for cls, kinds in (("sock", {"direct"}), ("tcp_sock", {"alias"}),
                       ("socket", {"holder"}), ("conn_slot", {"holder"})):
        oracle = set(subprocess.run(["pfunct", f"--class={cls}", str(binary)], check=True,
                                    capture_output=True, text=True).stdout.split())
        assert oracle, f"pfunct found no methods of {cls}"
        ours = {m.name for m in found.methods if m.route_kind in kinds}
        assert oracle <= ours, (cls, oracle - ours)


def _pahole_offset(binary, struct, member):
    text = subprocess.run(["pahole", "-C", struct, str(binary)], check=True,
                          capture_output=True, text=True).stdout
    m = re.search(rf"[\s*]{member};\s+/\*\s+(\d+)\s+\d+\s+\*/", text)
    assert m, text
    return int(m.group(1))


def test_holder_paths_use_the_member_offsets(built):
    binary, found = built
    by_route = {m.route_form.split(" ")[0]: m for m in found.methods if m.route_kind == "holder"}
    for route, struct, member in (("socket->sk", "socket", "sk"),
                                  ("sk_buff->sk", "sk_buff", "sk"),
                                  ("conn_slot->tp", "conn_slot", "tp")):
        [step] = by_route[route].path
        assert step.op == "deref"
        assert step.offset == _pahole_offset(binary, struct, member)
    [step] = by_route["socket_alloc->socket.sk"].path
    assert step.offset == (_pahole_offset(binary, "socket_alloc", "socket")
                           + _pahole_offset(binary, "socket", "sk"))


def test_not_aliases_and_not_methods(built):
    _, found = built
    names = {m.name for m in found.methods}
    assert "wrapper_tag" not in names      # sock at a non-zero offset
    assert "frag_len" not in names and "main" not in names
    assert found.by_value == ("sk_copy_value",)


def test_inline_only_and_static_copies(built):
    binary, found = built
    by_key = {short_key(m): m for m in found.methods if m.route_kind == "direct"}
    assert not by_key["sk_is_ready@net.c"].probeable
    probeable = {k for k, m in by_key.items() if m.probeable}
    assert probeable == {k for k, *_ in EXPECTED if k in by_key} - {"sk_is_ready@net.c"}
    nm = subprocess.run(["nm", str(binary)], check=True, capture_output=True, text=True).stdout
    local = {int(a, 16) for a, t, n in (line.split() for line in nm.splitlines()
                                        if len(line.split()) == 3) if n == "sk_helper"}
    copies = {by_key[k].function.address for k in ("sk_helper@net.c", "sk_helper@net2.c")}
    assert len(copies) == 2 and copies <= local
    assert any("not probeable: inline only" in n for n in found.notes)

"""`ctracer.probes.map_refs` on instructions bcc compiled (this host's clang and libbcc):
every map reference found, and pointed at another map's fd."""

from __future__ import annotations

import struct

import pytest

from ctracer.errors import CtracerError
from ctracer.probes import map_refs

TEXT = """
BPF_ARRAY(first, u64, 1);
BPF_HASH(second, u32, u64, 16);
int prog(void *ctx) {
    int zero = 0;
    u32 key = 7;
    u64 *v = first.lookup(&zero);
    u64 big = 0x1234567800000000ULL | bpf_ktime_get_ns();
    if (v) *v += 1;
    second.update(&key, &big);
    return 0;
}
"""


@pytest.fixture(scope="module")
def compiled(bpf):
    from ctracer.record import bpf_runtime
    bpf_runtime.prepare()
    b = bpf_runtime._compile(bpf_runtime._import_bcc(), TEXT, [], "bcc could not compile it")
    try:
        fds = {name: bpf_runtime._table_fd(b, name) for name in bpf_runtime._table_names(b)}
        yield bpf_runtime._instructions(b, "prog"), fds
    finally:
        b.cleanup()


@pytest.mark.bpf
def test_each_map_reference_is_found_and_repointed(compiled):
    insns, fds = compiled
    found = map_refs.map_fds(insns)
    assert {fd for _, fd in found} == set(fds.values()) and len(fds) == 2
    moved = map_refs.repoint(insns, {fds["first"]: 1001, fds["second"]: 1002})
    assert sorted(fd for _, fd in map_refs.map_fds(moved)) == sorted(
        {fds["first"]: 1001, fds["second"]: 1002}[fd] for _, fd in found)
    # nothing else changed: every instruction but the references' first halves is as it was
    size = struct.calcsize("<BBhi")
    changed = {i for i in range(len(insns) // size)
               if insns[i * size:(i + 1) * size] != moved[i * size:(i + 1) * size]}
    assert changed == {i for i, _ in found}


@pytest.mark.bpf
def test_a_reference_to_a_map_without_counterpart_is_refused(compiled):
    insns, fds = compiled
    with pytest.raises(CtracerError, match="has no counterpart"):
        map_refs.repoint(insns, {fds["first"]: 1001})

"""Method discovery on Debian's kernel debug info against pfunct --class: our methods of
sock and sk_buff (vmlinux) and nfs_fh (nfs.ko) include every function pfunct names, and
every function we add is sorted by why pfunct leaves it out.  Needs the 282 MB debug
package extracted under $CTRACER_CORPUS (skipped otherwise); pfunct takes ~30 s a run."""

import os
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from ctracer import dwarf
from ctracer.discovery import discover

CORPUS = Path(os.environ.get("CTRACER_CORPUS", "/work/corpus/x"))
VMLINUX = CORPUS / "usr/lib/debug/boot/vmlinux-6.1.0-50-cloud-amd64"
NFS = CORPUS / "usr/lib/debug/lib/modules/6.1.0-50-cloud-amd64/kernel/fs/nfs/nfs.ko"

pytestmark = pytest.mark.corpus


def _why_pfunct_lacks(struct, methods):
    """pfunct --class lists out-of-line functions with a parameter spelled exactly
    ``struct X *``; anything else we find has one of these reasons."""
    if all(not m.probeable for m in methods):
        return "not probeable (" + methods[0].not_probeable + ")"
    if all(m.kind != "direct" for m in methods):
        return f"reaches it as {'/'.join(sorted({m.kind for m in methods}))}"
    if all(m.param_type != f"struct {struct} *" for m in methods if m.kind == "direct"):
        return "qualified or typedef'd parameter"
    return f"struct {struct} * parameter where pfunct sees no definition of the struct"


@pytest.mark.parametrize("binary,struct", [(VMLINUX, "sock"), (VMLINUX, "sk_buff"),
                                           (NFS, "nfs_fh")])
def test_methods_include_pfunct_and_extras_are_explained(binary, struct):
    if not binary.exists():
        pytest.skip(f"Debian's kernel debug files are not under {CORPUS}")
    found = discover(dwarf.open_elf_types(str(binary)).catalog(), struct)
    oracle = set(subprocess.run(["pfunct", f"--class={struct}", str(binary)], check=True,
                                capture_output=True, text=True).stdout.split())
    assert oracle
    by_name = defaultdict(list)
    for m in found.methods:
        if not m.is_tracepoint:
            by_name[m.name].append(m)
    missing = oracle - set(by_name)
    # static-call trampolines (``DEFINE_STATIC_CALL``): declarations only, no body of
    # their own in the debug info, nothing a uprobe or kprobe could mean
    assert {n for n in missing if not n.startswith("__SCT__")} == set()
    direct = {m.name for m in found.methods if m.kind == "direct"}
    assert oracle - missing <= direct
    reasons = Counter(_why_pfunct_lacks(struct, ms) for n, ms in by_name.items()
                      if n not in oracle)
    print(f"\n{struct}: pfunct {len(oracle)} ({len(missing)} trampolines), ours "
          f"{len(by_name)} functions; extra by reason: {dict(reasons)}")
    assert sum(reasons.values()) == len(set(by_name) - oracle)

"""Whether this machine can trace user space: tests that need real uprobes ask first."""

from __future__ import annotations

from ctracer.record import bpf_runtime
from ctracer.record.bpf_runtime import BPFUnavailable


def uprobe_self_test(binary: str, symbol: str) -> None:
    """Load a one-line program and attach it as a uprobe on ``symbol`` of ``binary``:
    raises `BPFUnavailable` saying why when this machine cannot trace user space."""
    bpf_runtime.prepare()
    bcc = bpf_runtime._import_bcc()
    try:
        b = bcc.BPF(text=b"int probe(void *ctx) { return 0; }")
        b.attach_uprobe(name=binary.encode(), sym=symbol.encode(), fn_name=b"probe")
        b.cleanup()
    except Exception as e:  # bcc raises bare Exceptions for refusals
        raise BPFUnavailable(f"the kernel or bcc refuses a trivial uprobe program: {e}") from None

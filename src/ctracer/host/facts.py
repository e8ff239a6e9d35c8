"""What the host was seen to accept, as plain data: a `Mechanism` (whether one probe
mechanism works, and why) and the `KernelFacts` the probe plan (`ctracer.plan.attach`)
is made from.  `ctracer.host.features.kernel_facts` finds them out by trying."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class Mechanism:
    """Whether one probe mechanism works here (None: could not tell) and why."""

    works: Optional[bool]
    why: str

    def to_json(self) -> dict:
        """``{"works": ..., "why": ...}``."""
        return {"works": self.works, "why": self.why}


UNKNOWN = Mechanism(None, "not tried")


@dataclass(frozen=True)
class KernelFacts:
    """What the running kernel accepts, as found by trying.

    ``symbols``: names of the functions probes can attach to (None: unknown), read from
    ``symbols_source`` (for another kernel's vmlinux or module: that file's symbol table); ``notrace``: functions known to exist but excluded from tracing
    (known only when both kallsyms and available_filter_functions are readable);
    ``clones``: compiler-made copies (``name`` → ``name.isra.0``...) for names absent
    from ``symbols``; ``tracepoints``: whether a raw tracepoint program attaches to each
    tracepoint asked about (None: unknown)."""

    fentry: Mechanism = UNKNOWN
    kprobes: Mechanism = UNKNOWN
    kprobe_multi: Mechanism = UNKNOWN
    raw_tracepoints: Mechanism = UNKNOWN
    uprobes: Mechanism = UNKNOWN
    #: whether kprobe-type programs load (the verifier can then check kprobe, kretprobe,
    #: uprobe and uretprobe programs even where none can be attached)
    kprobe_programs: Mechanism = UNKNOWN
    #: whether tracing_multi links work: one fentry (or fexit) program attached to many
    #: functions in one system call (the probe kind ``fentry.multi``)
    tracing_multi: Mechanism = UNKNOWN
    #: whether an fsession.multi program runs on a tracing_multi link: one program at
    #: each function's entry and return (the probe kind ``fsession.multi``)
    fsession_multi: Mechanism = UNKNOWN
    symbols: Optional[frozenset[str]] = None
    symbols_source: str = ""
    notrace: frozenset[str] = frozenset()
    clones: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tracepoints: Optional[Mapping[str, bool]] = None
    #: False when the types are not the running kernel's (another vmlinux, a .ko file):
    #: symbols and tracepoints then say nothing about them
    running_kernel: bool = True

    def mechanisms(self) -> dict[str, Mechanism]:
        """The kernel's probe mechanisms by name."""
        return {"fentry": self.fentry, "kprobes": self.kprobes,
                "kprobe_multi": self.kprobe_multi, "raw_tracepoints": self.raw_tracepoints,
                "uprobes": self.uprobes, "kprobe_programs": self.kprobe_programs,
                "tracing_multi": self.tracing_multi, "fsession_multi": self.fsession_multi}

    def to_json(self) -> dict:
        """The facts as ``ctracer plan --json`` prints them."""
        out: dict = {name: m.to_json() for name, m in self.mechanisms().items()}
        out["functions_listed_by"] = self.symbols_source or None
        out["running_kernel"] = self.running_kernel
        return out

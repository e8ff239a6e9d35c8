"""Stage 4, probes: the BPF programs generated around the collectors for each method,
with the event layout of `ctracer.event`.

Two kinds of program, one interface (`ProbeProgram`), which the pipeline hands to the
recorder and the bcc runtime: `uprobe.UprobeProgram` (a program's functions, a uprobe and
a uretprobe each) and `kernel_program.KernelProgram` (the kernel: raw tracepoints from
`tracepoint`, and kernel functions on entry and exit through the generic programs of
`kfunctions`).  `ctext` holds the C they share: helpers, ring buffer and constants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from ctracer.event import FunctionRow, Layout


class ProbeProgram(Protocol):
    """What the recorder and the bcc runtime need of a generated program."""

    #: the bcc C text
    text: str
    #: the snapshot every event carries
    mini: "Layout"
    #: the rows of the trace file's functions table (an event's ``function_id``)
    rows: Sequence["FunctionRow"]
    #: uprobes to attach (a kernel program has none)
    functions: Sequence
    #: bytes of the BPF ring buffer
    ring_bytes: int
    #: u64 argument slots in each event
    nargs: int

    @property
    def filtered(self) -> bool:
        """Only the followed processes are recorded."""

    def rows_with_return_value(self) -> frozenset[int]:
        """Function-table rows whose exit events carry a return value."""

    def args_by_row(self) -> dict:
        """The arguments recorded per function-table row."""

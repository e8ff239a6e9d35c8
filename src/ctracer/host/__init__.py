"""Stage 2, host facts: what the running machine offers, found by trying and read by both
the plan and the recording.

`features` (which probe mechanisms the kernel accepts, by loading and attaching tiny BPF
programs; task storage; the release; the bare ``bpf(2)`` call), `facts` (their result
as plain data, `KernelFacts`), `kallsyms` (the kernel's functions and text symbols,
parsed once and cached), `tracefs` (where tracefs is, its trace events and their
formats), `netdevs` (network device names by index) and `headers` (the kernel header
tree bcc compiles against)."""

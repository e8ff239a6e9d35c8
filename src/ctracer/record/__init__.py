"""Stage 5, recording: the bcc runtime (`bpf_runtime`, the only module importing bcc),
what the running kernel supports (`kernel`), kernel headers for bcc (`headers`), and the
`recorder` that drains events into the trace file."""

"""Stage 4, probes: the BPF program generated around the collectors for each method
(`program`), with the event layout of `ctracer.event`."""

"""Collectors: the BPF C that copies a traced object's fields into its mini snapshot.

`base` holds what every collector shares (the reader of user or kernel memory, the
`Collector` class); `plain` the collectors of plain fields (whole members, char arrays,
bitfields); `derived` the one of values computed from a member (a lock held, a list
empty); `snapshot` gives each field of a mini layout its collector and the span of the
object a probe copies.

`registry` is keyed by type: each kind of complex member (locks, refcounts, atomics,
queues, lists, times) has one small module here saying which values it records instead
of the member's internals; `registry.claim` is what `ctracer.plan.mini.build_mini`
asks.  Adding a kind is adding one module with ``TYPES``, ``NAME`` and ``values``.
"""

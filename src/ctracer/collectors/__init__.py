"""Collectors: the BPF C that copies a traced object's fields into its mini snapshot.

`ctracer.collectors.base` has the reader (user or kernel memory), the collectors for
plain fields (whole members, char arrays, bitfields) and the factory list that gives
each mini field its collector; collectors for locks or refcounts go in front of it.
"""

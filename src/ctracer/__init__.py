"""ctracer: trace a C struct through the functions that touch it.

Data flows one way: debug info (``dwarf``/``btf``) → type model (``model``) →
methods and mini structs (``discovery``, ``mini``) → probes (``probes``, ``event``,
``collectors``) → bcc runtime (``bpf_runtime``) → trace file (``tracefile``) →
report (``report``: call graphs, plots, HTML).
"""

__version__ = "0.1.0"

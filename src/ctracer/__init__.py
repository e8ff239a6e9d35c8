"""ctracer: trace a C struct through the functions that touch it.

Data flows one way, a folder per stage: debug info (``debuginfo``) → type model
(``debuginfo.model``, ``debuginfo.graph``) → methods, mini structs and probe plans
(``plan``) → collectors and probes (``collectors``, ``probes``, ``event``) → bcc runtime
and recorder (``record``) → trace file (``tracefile``) → analysis (``analysis``) →
call graphs, plots and HTML (``report``) and exports (``export``).
"""

__version__ = "0.1.0"

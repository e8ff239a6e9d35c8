"""ctracer: trace a C struct through the functions that touch it.

Data flows one way, a folder per stage: debug info (``debuginfo``) → type model
(``debuginfo.catalog``, ``debuginfo.typegraph``) → methods, mini structs and probe plans
(``plan``) → collectors and probes (``collectors``, ``probes``, ``event``) → bcc runtime
and recorder (``record``) → trace file (``tracefile``) → analysis (``analysis``) →
call graphs, plots and HTML (``report``) and exports (``export``).  ``calls`` is the
one rule pairing entries and exits into calls, for the analysis and for ``--tail``.
"""

__version__ = "0.1.0"

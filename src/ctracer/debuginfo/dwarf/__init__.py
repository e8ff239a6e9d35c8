"""The DWARF reader: `reader` (the only module of ctracer importing pyelftools), the fast
DIE `scan`ner, the per-unit tables of `units`, and the catalog `cache` keyed by build-id."""

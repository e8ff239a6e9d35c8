"""The DWARF reader: `reader` opens a file (refusals, `DwarfTypes`), `sections` gives the
raw debug sections (decompressed, relocated), `scan` is the fast DIE scanner, `units` the
per-unit tables and their merge into catalog rows, `dies` everything read with pyelftools
(the only module of ctracer importing it), and `cache` the catalog cache keyed by build-id."""

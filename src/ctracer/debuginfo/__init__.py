"""Stage 1, debug info: what a binary or the running kernel says about its types.

`catalog` (every type and function by name) and `typegraph` (a struct's full types) are the read-only type model
(frozen dataclasses) that knows nothing of where it came from; `sources` opens a type source (a program's DWARF, an ELF `.BTF` section,
split module BTF, the running kernel) and gives a `TypeModel`; `elf` reads ELF headers,
notes and symbols for both readers; `dwarf/` and `btf/` are the two readers with their
caches; `cdecl` is the one speller of types as C text, for both readers and the model.
"""

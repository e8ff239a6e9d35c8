"""Where types come from: a `TypeSource` (plain data; `ctracer.commands.options` makes one
from the command-line options) and opening it.

* ``--binary PATH``: an ELF file (program, library, vmlinux, module); its DWARF, or its
  ``.BTF`` section when it has no DWARF;
* ``--btf PATH``: raw BTF (``/sys/kernel/btf/vmlinux``) or an ELF file's ``.BTF`` section,
  with ``--btf-base PATH`` when it is split BTF (a module's, on top of vmlinux);
* ``--module NAME``: a loaded module's split BTF on top of the kernel's;
* nothing: the running kernel's BTF, ``/sys/kernel/btf/vmlinux``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ctracer.debuginfo.btf import KERNEL_BTF, MODULE_BTF_DIR
from ctracer.errors import CtracerError, InputFileError, UsageError
from ctracer.debuginfo.catalog import ShapeKind, TypeModel



def parse_struct_name(words: list[str]) -> tuple[ShapeKind, str]:
    """``['struct', 'sock']`` or ``['sock']`` → (kind, name); UsageError otherwise."""
    words = list(words)
    given = " ".join(words)
    kind = ShapeKind.STRUCT
    if len(words) == 2 and words[0] in ("struct", "union"):
        kind = ShapeKind(words[0])
        words = words[1:]
    if len(words) != 1:
        raise UsageError(f"expected '[struct|union] NAME', got {given!r}")
    name = words[0]
    if not name.isidentifier():
        raise UsageError(f"{name!r} is not a C struct name")
    return kind, name


def _readable_file(path: str, what: str) -> str:
    if not os.path.exists(path):
        raise InputFileError(f"{what} {path}: no such file")
    if os.path.isdir(path):
        raise InputFileError(f"{what} {path} is a directory")
    if not os.access(path, os.R_OK):
        raise InputFileError(f"{what} {path}: permission denied")
    return path


@dataclass(frozen=True)
class TypeSource:
    """Where types come from, as plain data (at most one of binary, btf, module; none:
    the running kernel's BTF)."""

    binary: Optional[str] = None
    btf: Optional[str] = None
    btf_base: Optional[str] = None
    module: Optional[str] = None
    use_cache: bool = True

    @property
    def is_kernel(self) -> bool:
        """The types describe a kernel (the running one, a module, or a BTF file), not a
        user-space binary."""
        return not self.binary

    def describe(self) -> str:
        if self.binary:
            return self.binary
        if self.btf:
            return self.btf
        if self.module:
            return f"module {self.module}"
        return "the running kernel"


def open_type_source(source: TypeSource) -> TypeModel:
    """The type model the source names (readers are imported only when needed)."""
    use_cache = source.use_cache
    chosen = [o for o in ("binary", "btf", "module") if getattr(source, o)]
    if source.btf_base and not source.btf:
        raise UsageError("--btf-base goes with --btf")
    if len(chosen) > 1:
        raise UsageError(f"choose one type source, not {' and '.join('--' + c for c in chosen)}")
    if source.binary:
        from ctracer.debuginfo.dwarf import reader as dwarf
        return dwarf.open_elf_types(_readable_file(source.binary, "binary"), use_cache=use_cache)
    if source.btf:
        from ctracer.debuginfo.btf import reader as btf
        base = source.btf_base
        return btf.open_btf(_readable_file(source.btf, "BTF file"),
                            base=_readable_file(base, "BTF base") if base else None,
                            use_cache=use_cache)
    from ctracer.debuginfo.btf import reader as btf
    if source.module:
        if not source.module.replace("-", "_").isidentifier():
            raise UsageError(f"{source.module!r} is not a module name")
        path = os.path.join(MODULE_BTF_DIR, source.module)
        if not os.path.exists(path):
            raise InputFileError(f"module {source.module} has no BTF at {path} (is it loaded?)")
        return btf.open_btf(path, base=_readable_file(KERNEL_BTF, "kernel BTF"),
                            use_cache=use_cache)
    if not os.path.exists(KERNEL_BTF):
        raise InputFileError(f"this kernel has no BTF ({KERNEL_BTF}); give --binary PATH")
    return btf.open_btf(KERNEL_BTF, use_cache=use_cache)


def module_models(use_cache: bool = True) -> list[TypeModel]:
    """The BTF of every loaded kernel module (split on vmlinux's), in module-name order;
    [] without module BTF.  A struct of modules, like NFS's ``nfs_fh``, is defined in
    each that uses it (nfs, nfsv3, nfsv4); their functions are methods of vmlinux's
    structs too (sunrpc's of ``struct sock``)."""
    from ctracer.debuginfo.btf import reader as btf
    try:
        names = sorted(os.listdir(MODULE_BTF_DIR))
    except OSError:
        return []
    found = []
    for module in names:
        if module == "vmlinux":
            continue
        try:
            found.append(btf.open_btf(os.path.join(MODULE_BTF_DIR, module), base=KERNEL_BTF,
                                      use_cache=use_cache))
        except CtracerError:
            continue
    return found

"""The collectors of complex members, keyed by type.

Every module of this package that defines ``TYPES`` (the type names it collects, as C
spells them: ``spinlock_t``, ``struct mutex``), ``NAME`` and ``values(member)`` is a
kind; `claim` is the hook `ctracer.plan.mini.build_mini` calls for each member: the
first name along the member's typedef chain (``atomic_long_t`` → ``atomic64_t``) that
a kind collects decides.  Types in `WITHOUT_COLLECTOR` are complex too (their bytes
mean nothing one by one) but have no kind yet: their members are left out, with the
reason.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import Optional, Union

from ctracer.debuginfo.typegraph import CompositeType, QualifiedType, TypeGraph, TypeId, Typedef
from ctracer.event import Field
from ctracer.plan.mini import Claim, Derived, member_fields

#: complex kernel types no kind collects yet (their members are skipped, with the reason)
WITHOUT_COLLECTOR = frozenset({
    "rwlock_t", "arch_rwlock_t", "struct qrwlock", "seqlock_t", "seqcount_t",
    "seqcount_spinlock_t", "seqcount_raw_spinlock_t", "seqcount_mutex_t",
    "struct rw_semaphore", "struct semaphore", "struct rt_mutex", "struct ww_mutex",
    "local_lock_t", "struct lockdep_map", "struct optimistic_spin_queue",
    "struct percpu_ref", "struct xarray", "struct rcu_sync",
})


@dataclass(frozen=True)
class MemberView:
    """What a kind sees of a member of its type: the scalars inside it by dotted path
    (offsets relative to the member), and its size."""

    fields: dict[str, Field]
    size: int

    def find(self, *paths: str) -> Optional[Field]:
        """The first of ``paths`` that names a scalar inside the member."""
        for p in paths:
            if p in self.fields:
                return self.fields[p]
        return None


def _kind_modules() -> dict[str, ModuleType]:
    import ctracer.collectors as package
    by_type: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name in getattr(module, "TYPES", ()):
            if name in by_type:
                raise ValueError(f"type {name} has two collectors: {by_type[name].NAME}, "
                                 f"{module.NAME}")
            by_type[name] = module
    return by_type


_BY_TYPE: Optional[dict[str, ModuleType]] = None


def kinds() -> dict[str, ModuleType]:
    """Type name → the module of its kind."""
    global _BY_TYPE
    if _BY_TYPE is None:
        _BY_TYPE = _kind_modules()
    return _BY_TYPE


def type_names(graph: TypeGraph, tid: Optional[TypeId]) -> list[str]:
    """The names a member's type goes by, outermost first: each typedef, then the
    struct or union tag (``["atomic_long_t", "atomic64_t"]``)."""
    names = []
    for _ in range(64):
        t = graph.types.get(tid) if tid is not None else None
        if isinstance(t, Typedef):
            names.append(t.name)
        elif isinstance(t, QualifiedType):
            pass
        else:
            if isinstance(t, CompositeType) and t.name:
                names.append(f"{t.kind} {t.name}")
            return names
        tid = t.target
    return names


def claim(graph: TypeGraph, tid: Optional[TypeId]) -> Optional[Claim]:
    """The claim of the kind collecting the member's type, None when no kind does."""
    table = kinds()
    for name in type_names(graph, tid):
        module = table.get(name)
        if module is None and name in WITHOUT_COLLECTOR:
            return Claim("", name, (), f"{name}: no collector for this kind yet (its "
                                       "internals are not recorded)")
        if module is None:
            continue
        inner = graph.strip(tid)
        t = graph.types.get(inner) if inner is not None else None
        if isinstance(t, CompositeType) and t.declaration:
            return Claim(module.NAME, name, (), f"{name} is only declared")
        fields = member_fields(graph, inner) if isinstance(t, CompositeType) else {}
        found: Union[tuple[Derived, ...], str] = module.values(
            MemberView(fields, graph.size_of(inner)))
        if isinstance(found, str):
            return Claim(module.NAME, name, (), f"{name}: {found}")
        return Claim(module.NAME, name, tuple(found))
    return None

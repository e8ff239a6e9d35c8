"""Kernel headers for bcc when the running kernel has none installed.

bcc compiles probes against kernel headers: ``/lib/modules/$(uname -r)/build``, or the
tree named by ``BCC_KERNEL_SOURCE``.  Debian splits a kernel's headers into an
architecture tree (``/usr/src/linux-headers-VERSION-FLAVOUR``, generated headers and
config) and a common tree (``/usr/src/linux-headers-VERSION-common``) that the first
refers to; bcc wants them as one.  `kernel_source_for_bcc` merges the two into a farm
of symlinks under the user's cache directory (never under /lib/modules): directories
found in both trees are recreated, everything else is one symlink, and a file present
in both comes from the architecture tree.

Probes read struct fields at the offsets found in the debug info of the traced program
(or the running kernel's BTF), so headers of another kernel version are good enough:
they only supply the types bcc's helper declarations use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Optional

from ctracer.errors import BPFUnavailable

USR_SRC = "/usr/src"
_MARKER = ".ctracer-complete"
_HEADERS = re.compile(r"linux-headers-(\d+\.\d+[.\d]*-\d+)-(.+)\Z")


def running_build_dir(release: Optional[str] = None) -> Optional[str]:
    """The running kernel's own header tree, when installed."""
    release = release or os.uname().release
    path = f"/lib/modules/{release}/build"
    return path if os.path.isdir(os.path.join(path, "include")) else None


def _dpkg_arch() -> str:
    try:
        return subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine,
                                                          os.uname().machine)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def debian_header_trees(src: str = USR_SRC, arch: Optional[str] = None,
                        release: Optional[str] = None) -> Optional[tuple[str, str]]:
    """(architecture tree, common tree) of the best Debian header package installed:
    the running release when present, else the newest of this architecture."""
    arch = arch or _dpkg_arch()
    release = release or os.uname().release
    try:
        names = os.listdir(src)
    except OSError:
        return None
    found = []
    for name in names:
        m = _HEADERS.match(name)
        if not m or m.group(2).startswith("common") or not m.group(2).endswith(arch):
            continue
        version, flavour = m.groups()
        commons = [f"linux-headers-{version}-common-rt"] if "rt" in flavour.split("-") else []
        commons.append(f"linux-headers-{version}-common")
        common = next((c for c in commons if os.path.isdir(os.path.join(src, c))), None)
        if common is None:
            continue
        exact = name == f"linux-headers-{release}"
        found.append((exact, _version_key(version), name, common))
    if not found:
        return None
    _, _, name, common = max(found)
    return os.path.join(src, name), os.path.join(src, common)


def _merge(dst: str, sources: list[str]) -> None:
    """Fill ``dst`` with symlinks to the union of ``sources`` (earlier ones win)."""
    names: dict[str, list[str]] = {}
    for s in sources:
        for name in os.listdir(s):
            names.setdefault(name, []).append(os.path.join(s, name))
    for name, paths in sorted(names.items()):
        target = os.path.join(dst, name)
        dirs = list(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.isdir(p)))
        if len(dirs) > 1:
            os.mkdir(target)
            _merge(target, dirs)
        else:
            os.symlink(os.path.realpath(paths[0]), target)


def cache_root() -> str:
    """ctracer's cache directory (``$XDG_CACHE_HOME/ctracer``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ctracer")


def header_farm(arch_tree: str, common_tree: str, cache: Optional[str] = None) -> str:
    """The merged tree for the two Debian trees, built once under ``cache``."""
    root = os.path.join(cache or cache_root(), "kernel-headers")
    farm = os.path.join(root, os.path.basename(arch_tree))
    if os.path.exists(os.path.join(farm, _MARKER)):
        return farm
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=root)
    try:
        _merge(tmp, [arch_tree, common_tree])
        with open(os.path.join(tmp, _MARKER), "w") as f:
            f.write(f"{arch_tree}\n{common_tree}\n")
        if os.path.exists(farm):
            shutil.rmtree(farm)
        os.rename(tmp, farm)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(os.path.join(farm, _MARKER)):  # built meanwhile by another run
            return farm
        raise BPFUnavailable(f"cannot build the kernel header tree for bcc in {root}: "
                             f"{e.strerror or e}") from None
    return farm


def kernel_source_for_bcc(cache: Optional[str] = None) -> Optional[str]:
    """What ``BCC_KERNEL_SOURCE`` should be: None when bcc finds headers by itself
    (the variable already set, or the running kernel's build tree installed)."""
    if os.environ.get("BCC_KERNEL_SOURCE") or running_build_dir():
        return None
    trees = debian_header_trees()
    if trees is None:
        raise BPFUnavailable(
            f"no kernel headers for bcc: neither /lib/modules/{os.uname().release}/build "
            f"nor a linux-headers package in {USR_SRC} (apt-get install "
            f"linux-headers-{_dpkg_arch()})")
    return header_farm(*trees, cache=cache)

"""Debian's kernel lines (and a developer's own image) for the guests: which packages
make a version, fetched once with ``apt-get download`` into the cache (never /boot or
the running kernel's /lib/modules), unpacked with ``dpkg-deb -x``, laid out as
``boot/vmlinuz-V`` + ``lib/modules/V`` and indexed with ``depmod -b``."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import tempfile
from typing import Callable, Optional

from ctracer.guest.common import Refused, _version_key, cache_root

@dataclasses.dataclass(frozen=True)
class KernelLine:
    """A kernel line: the package naming a version (``prefix`` + version + ``suffix``),
    where the package lists come from (``suite`` None: this machine's own sources), and
    the packages a version needs (``parts``, "{v}" the version; none: that one)."""

    name: str
    prefix: str
    version: str                    # a regular expression of the versions
    suffix: str = ""
    suite: Optional[str] = None
    parts: tuple[str, ...] = ()

    @property
    def package(self) -> re.Pattern:
        return re.compile(re.escape(self.prefix) + f"({self.version})" +
                          re.escape(self.suffix) + r"\Z")

    def holds(self, version: str) -> bool:
        """Whether ``version`` belongs to this kernel line."""
        return re.fullmatch(self.version, version) is not None

    def packages(self, version: str, found: str) -> list[str]:
        return [p.format(v=version) for p in self.parts] or [found]


SERIES = {s.name: s for s in (
    KernelLine("6.1", "linux-image-", r"6\.1\.0-\d+-amd64", "-unsigned"),
    KernelLine("6.12", "linux-image-", r"6\.12\.\d+\+deb12-amd64", "-unsigned"),
    KernelLine("7.2", "linux-binary-", r"7\.2\.\d+\+deb\d+-amd64", suite="sid",
           parts=("linux-binary-{v}", "linux-modules-{v}", "linux-base-{v}")),
)}
#: where the unstable suite's packages come from (this machine's Debian mirror)
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def cached_kernels(series: str) -> list[str]:
    """Complete cached kernel trees of a series, newest last."""
    found = []
    for marker in glob.glob(os.path.join(cache_root(), "kernels", "*", ".complete")):
        version = os.path.basename(os.path.dirname(marker))
        if _series_of(version) == series:
            found.append(os.path.dirname(marker))
    return sorted(found, key=lambda p: _version_key(os.path.basename(p)))


def _series_of(version: str) -> Optional[str]:
    """The series a cached kernel version belongs to."""
    return next((s.name for s in SERIES.values() if s.holds(version)), None)


def _apt_options(series: KernelLine) -> list[str]:
    """apt options reading the series' suite through lists of its own in the cache
    (none for this machine's own sources)."""
    if series.suite is None:
        return []
    root = os.path.join(cache_root(), "apt", series.suite)
    return ["-o", f"Dir::Etc::sourcelist={os.path.join(root, 'sources.list')}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={os.path.join(root, 'lists')}",
            "-o", f"Dir::Cache={os.path.join(root, 'cache')}",
            "-o", "APT::Get::List-Cleanup=0"]


def _suite_lists(series: KernelLine, refresh: bool) -> None:
    """The package lists of the series' own suite, fetched when missing (or ``refresh``)."""
    root = os.path.join(cache_root(), "apt", series.suite)
    for d in ("lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    with open(os.path.join(root, "sources.list"), "w") as f:
        f.write(f"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                f"{DEBIAN_MIRROR} {series.suite} main\n")
    if not refresh and glob.glob(os.path.join(root, "lists", "*_Packages*")):
        return
    got = subprocess.run(["apt-get", "-q", *_apt_options(series), "update"],
                         capture_output=True, text=True)
    if got.returncode or not glob.glob(os.path.join(root, "lists", "*_Packages*")):
        why = next((l for l in (got.stderr + got.stdout).splitlines()
                    if l.startswith(("E:", "Err", "W:"))), "apt-get update failed")
        raise Refused(f"cannot read Debian's {series.suite} package lists: {why}", 3)


def newest_package(series: str, refresh: bool = False) -> str:
    """The newest package of the series the package lists know."""
    s = SERIES[series]
    if s.suite is not None:
        _suite_lists(s, refresh)
    try:
        out = subprocess.run(["apt-cache", *_apt_options(s), "search", "--names-only",
                              "^" + re.escape(s.prefix)],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise Refused(f"cannot list Debian's kernel packages (apt-cache: {e})", 3)
    names = [line.split(" ", 1)[0] for line in out.splitlines()]
    matching = [n for n in names if s.package.match(n)]
    if not matching:
        where = f"Debian's {s.suite} suite" if s.suite else "the package lists"
        raise Refused(f"no {series} kernel package in {where} "
                      "(run 'apt-get update' where the network reaches Debian)", 3)
    return max(matching, key=_version_key)


def _lay_out(unpacked: str, version: str) -> None:
    """A merged-/usr kernel (``usr/lib/modules/V/vmlinuz``, config, System.map beside
    the modules) laid out as Debian 12's: ``boot/vmlinuz-V``, ``boot/config-V``,
    ``lib/modules/V``."""
    merged = os.path.join(unpacked, "usr", "lib", "modules", version)
    if not os.path.isdir(merged):
        return
    os.makedirs(os.path.join(unpacked, "boot"), exist_ok=True)
    os.makedirs(os.path.join(unpacked, "lib", "modules"), exist_ok=True)
    for name, boot in (("vmlinuz", "vmlinuz"), ("config", "config"), ("System.map", "System.map")):
        if os.path.exists(os.path.join(merged, name)):
            os.rename(os.path.join(merged, name),
                      os.path.join(unpacked, "boot", f"{boot}-{version}"))
    os.rename(merged, os.path.join(unpacked, "lib", "modules", version))


def fetch(series: str, refresh: bool = False) -> str:
    """Download, unpack and index the newest kernel of the series; its tree."""
    s = SERIES[series]
    package = newest_package(series, refresh)
    version = s.package.match(package).group(1)
    tree = os.path.join(cache_root(), "kernels", version)
    if os.path.exists(os.path.join(tree, ".complete")):
        return tree
    os.makedirs(os.path.dirname(tree), exist_ok=True)
    work = tempfile.mkdtemp(prefix=".fetch-", dir=os.path.dirname(tree))
    try:
        os.chmod(work, 0o755)  # apt's _apt user writes the download when it can
        wanted = s.packages(version, package)
        got = subprocess.run(["apt-get", *_apt_options(s), "download", "-q", *wanted],
                             cwd=work, capture_output=True, text=True)
        debs = glob.glob(os.path.join(work, "*.deb"))
        if got.returncode or len(debs) != len(wanted):
            why = next((l for l in got.stderr.splitlines() if l.startswith(("E:", "Err"))),
                       got.stderr.strip().splitlines()[-1] if got.stderr.strip() else "")
            raise Refused(f"cannot fetch {package}: {why or 'apt-get download failed'}", 3)
        unpacked = os.path.join(work, "tree")
        for deb in sorted(debs):
            done = subprocess.run(["dpkg-deb", "-x", deb, unpacked], capture_output=True,
                                  text=True)
            if done.returncode:
                raise Refused(f"cannot unpack {os.path.basename(deb)}: dpkg-deb -x: "
                              f"{done.stderr.strip()[:200]}", 3)
        _lay_out(unpacked, version)
        done = subprocess.run(["depmod", "-b", unpacked, version], capture_output=True,
                              text=True)
        if done.returncode:
            raise Refused(f"cannot index {package}'s modules: depmod -b: "
                          f"{done.stderr.strip()[:200]}", 3)
        open(os.path.join(unpacked, ".complete"), "w").close()
        if os.path.exists(tree):
            shutil.rmtree(tree)
        os.rename(unpacked, tree)
        return tree
    finally:
        shutil.rmtree(work, ignore_errors=True)


def kernel_image(choice: str, refresh: bool,
                 say: Optional[Callable[[str], None]] = None) -> tuple[str, str]:
    """(vmlinuz path, series or 'custom') for --kernel; ``say`` is told, in one line,
    when a kernel has to be fetched first."""
    if choice in SERIES:
        trees = [] if refresh else cached_kernels(choice)
        if not trees and say is not None:
            say(f"fetching Debian's {choice} kernel once into {cache_root()} "
                "(apt-get download, ~100 MB; later runs use the copy)")
        tree = trees[-1] if trees else fetch(choice, refresh)
        images = glob.glob(os.path.join(tree, "boot", "vmlinuz-*"))
        if not images:
            raise Refused(f"{tree} holds no boot/vmlinuz-*: remove it and run again", 3)
        return images[0], choice
    if os.sep in choice or os.path.exists(choice):
        path = os.path.abspath(choice)
        if os.path.isdir(path):
            images = glob.glob(os.path.join(path, "boot", "vmlinuz-*")) or \
                glob.glob(os.path.join(path, "vmlinuz*"))
            if not images:
                raise Refused(f"--kernel {choice}: no vmlinuz in that directory")
            path = images[0]
        if not os.path.isfile(path):
            raise Refused(f"--kernel {choice}: no such kernel image")
        return path, "custom"
    raise Refused(f"--kernel {choice!r}: not a kernel this knows ({', '.join(SERIES)}) "
                  "nor a path to a kernel image")


def resolve_without_fetching(choice: str) -> Optional[str]:
    """Check ``--kernel`` without the network: None for a series of `SERIES` (fetched
    later when not cached), the image's path for a path; `Refused` for anything else,
    a path that does not exist, or a file that is no x86 kernel image."""
    if choice in SERIES:
        return None
    image, _ = kernel_image(choice, False)
    try:
        with open(image, "rb") as f:
            header = f.read(0x206)
    except OSError as e:
        raise Refused(f"--kernel {choice}: cannot read it: {e.strerror}") from None
    if header[0x202:0x206] != b"HdrS":
        raise Refused(f"--kernel {choice}: {image} is not a bootable x86 kernel image "
                      "(no bzImage header)")
    return image

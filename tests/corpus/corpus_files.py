"""Where the kernel corpus lives: Debian's kernel debug package, found or fetched.

The corpus is the extracted tree of ``linux-image-<release>-dbg`` (a vmlinux with full
DWARF and a .BTF section, and every module's debug file).  `find_corpus` looks for an
extracted tree without touching the network; `fetch_corpus` downloads the package with
``apt-get download`` and extracts it with ``dpkg-deb -x``.

A corpus directory may be the extracted tree itself (it holds ``usr/lib/debug``) or a
directory holding it as ``x/`` next to the downloaded ``.deb``, which is how
`fetch_corpus` lays it out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

PACKAGE = "linux-image-6.1.0-50-cloud-amd64-dbg"
#: environment variable naming a corpus directory (also read by other corpus tests)
ENV = "CTRACER_CORPUS"
#: where the project's development machines keep the extracted package
SHARED_TREE = Path("/work/corpus/x")


class CorpusError(Exception):
    """The corpus cannot be found or fetched (one line for the user)."""


@dataclass(frozen=True)
class Corpus:
    root: Path          # the extracted tree (holds usr/lib/debug)
    release: str        # e.g. 6.1.0-50-cloud-amd64
    vmlinux: Path
    nfs_ko: Path


def release_of(package: str) -> str:
    """``linux-image-6.1.0-50-cloud-amd64-dbg`` → ``6.1.0-50-cloud-amd64``."""
    name = package.removeprefix("linux-image-").removesuffix("-dbg")
    if name == package or not name:
        raise CorpusError(f"{package!r} is not a linux-image-<release>-dbg package name")
    return name


def default_corpus_dir() -> Path:
    """``ctracer/corpus`` under the user's cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ctracer" / "corpus"


def locate(directory: Path, release: str) -> Optional[Corpus]:
    """The corpus in ``directory`` (the tree itself or its ``x/``), None when absent."""
    for root in (directory, directory / "x"):
        debug = root / "usr" / "lib" / "debug"
        vmlinux = debug / "boot" / f"vmlinux-{release}"
        nfs = debug / "lib" / "modules" / release / "kernel" / "fs" / "nfs" / "nfs.ko"
        if vmlinux.is_file() and nfs.is_file():
            return Corpus(root, release, vmlinux, nfs)
    return None


def candidate_dirs(explicit: Optional[Path] = None) -> list[Path]:
    """Where to look: the given directory, else $CTRACER_CORPUS when set, else the
    user's cache directory and then the development machines' shared tree."""
    if explicit is not None:
        return [explicit]
    if os.environ.get(ENV):
        return [Path(os.environ[ENV])]
    return [default_corpus_dir(), SHARED_TREE]


def find_corpus(explicit: Optional[Path] = None, package: str = PACKAGE) -> Optional[Corpus]:
    release = release_of(package)
    for directory in candidate_dirs(explicit):
        found = locate(directory, release)
        if found is not None:
            return found
    return None


def describe_search(explicit: Optional[Path] = None) -> str:
    return ", ".join(str(d) for d in candidate_dirs(explicit))


def _run(argv: list[str], cwd: Path, what: str) -> None:
    if shutil.which(argv[0]) is None:
        raise CorpusError(f"{argv[0]} is not installed (needed to {what})")
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        hint = " (try: apt-get update)" if "apt-get" in argv[0] else ""
        raise CorpusError(f"{' '.join(argv)} failed: {tail}{hint}")


def _debs(directory: Path, package: str) -> list[Path]:
    return sorted(directory.glob(f"{package}_*.deb"))


def fetch_corpus(directory: Path, package: str = PACKAGE,
                 say=print) -> Corpus:
    """Download (unless a .deb is already there) and extract the package into
    ``directory``; the tree appears as ``directory/x`` only once fully extracted."""
    release = release_of(package)
    found = locate(directory, release)
    if found is not None:
        return found
    directory.mkdir(parents=True, exist_ok=True)
    if not _debs(directory, package):
        say(f"downloading {package} into {directory} (about 282 MB) ...")
        _run(["apt-get", "download", package], directory, "download the package")
    debs = _debs(directory, package)
    if not debs:
        raise CorpusError(f"apt-get download left no {package}_*.deb in {directory}")
    partial = directory / "x.partial"
    shutil.rmtree(partial, ignore_errors=True)
    say(f"extracting {debs[-1].name} ...")
    _run(["dpkg-deb", "-x", str(debs[-1]), str(partial)], directory, "extract the package")
    tree = directory / "x"
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    found = locate(directory, release)
    if found is None:
        raise CorpusError(f"{debs[-1].name} holds no vmlinux-{release} and nfs.ko")
    return found


def corpus_for_run(explicit: Optional[Path], package: str, download: bool,
                   say=print) -> Corpus:
    """The corpus to check: found, else fetched into the given (or default) directory."""
    found = find_corpus(explicit, package)
    if found is not None:
        return found
    if not download:
        raise CorpusError(f"no extracted {package} in {describe_search(explicit)}")
    target = explicit or (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
    return fetch_corpus(target or default_corpus_dir(), package, say)


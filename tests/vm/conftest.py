"""Fixtures of the tests that run inside the guests (marked ``vm``; see tests/support/vmguest.py).

``nfs_server``: a loopback NFS server in the guest (Debian's nfs-kernel-server: nfsd,
rpcbind, rpc.mountd) exporting a fresh tmpfs, started once a session.
``nfs_mount(version)``: that export mounted over loopback with NFS ``version`` ("3",
"4.2", ...), mounted once a session per version; returns (mount point, export
directory), so that a test — or a trace of ``struct nfs_fh`` — works through the mount
and checks on the export side.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support import vmguest

EXPORT = Path("/srv/ctracer-export")   # /srv is a throw-away overlay in the guest
GRACE_S = 10                           # nfsd's least NFSv4 grace period (default 90 s)


def sh(*cmd: str, timeout: float = 120) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}"
    return r.stdout


def _need_guest() -> None:
    if not vmguest.in_guest():
        pytest.fail("this fixture changes the machine (modules, /etc/exports, mounts): "
                    "it runs only inside a vm-run guest", pytrace=False)


@pytest.fixture(scope="session")
def nfs_server():
    """The export directory of a running loopback NFS server."""
    _need_guest()
    sh("modprobe", "-a", "nfsd", "nfsv3", "nfsv4")
    if not os.path.ismount("/proc/fs/nfsd"):
        sh("mount", "-t", "nfsd", "nfsd", "/proc/fs/nfsd")
    for knob in ("nfsv4gracetime", "nfsv4leasetime"):   # only before nfsd starts
        path = Path("/proc/fs/nfsd") / knob
        if path.exists():
            path.write_text(f"{GRACE_S}\n")
    sh("rpcbind", "-w")
    EXPORT.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(EXPORT):
        sh("mount", "-t", "tmpfs", "-o", "size=64m", "ctracer-export", str(EXPORT))
    Path("/etc/exports").write_text(
        f"{EXPORT} 127.0.0.1(rw,no_root_squash,insecure,fsid=0,no_subtree_check)\n")
    sh("exportfs", "-ra")
    sh("rpc.mountd")
    sh("rpc.nfsd", "2")
    yield EXPORT
    subprocess.run(["rpc.nfsd", "0"], capture_output=True)
    subprocess.run(["exportfs", "-ua"], capture_output=True)


@pytest.fixture(scope="session")
def nfs_mount(nfs_server, tmp_path_factory):
    """``nfs_mount(version) -> (mount point, export directory)``."""
    mounted: dict[str, Path] = {}

    def mount(version: str) -> tuple[Path, Path]:
        if version not in mounted:
            point = tmp_path_factory.mktemp(f"nfs-v{version}")
            # fsid=0 makes the export NFSv4's root: "/" there, its path for NFSv3
            source = f"127.0.0.1:{nfs_server}" if version.startswith("3") else "127.0.0.1:/"
            options = f"vers={version},nolock" if version.startswith("3") else f"vers={version}"
            sh("mount", "-t", "nfs", "-o", options, source, str(point), timeout=300)
            mounted[version] = point
        return mounted[version], nfs_server

    yield mount
    for point in mounted.values():
        subprocess.run(["umount", "-f", str(point)], capture_output=True)

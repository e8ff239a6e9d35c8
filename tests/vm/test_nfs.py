"""A loopback NFS mount in the guest (`nfs_mount`, tests/vm/conftest.py) works both ways,
over NFSv3 and NFSv4.2: a file written through the mount is on the export's tmpfs with
the same bytes, and one written on the export is read through the mount.  What later
traces of ``struct nfs_fh`` run over."""

from __future__ import annotations

import os
import secrets

import pytest

pytestmark = pytest.mark.vm


def _mount_entry(point) -> list[str]:
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == str(point):
                return fields
    raise AssertionError(f"{point} is not in /proc/mounts")


@pytest.mark.parametrize("version", ["3", "4.2"])
def test_a_file_goes_through_the_loopback_mount_both_ways(vm_kernel, nfs_mount, version):
    point, export = nfs_mount(version)
    _, _, fstype, options, *_ = _mount_entry(point)
    assert fstype == ("nfs4" if version.startswith("4") else "nfs"), fstype
    assert f"vers={version}" in options.split(","), options
    name = f"through-v{version}-{secrets.token_hex(4)}"
    data = secrets.token_bytes(200_000)
    with open(point / name, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    assert (export / name).read_bytes() == data          # the server's side
    back = f"from-export-v{version}-{secrets.token_hex(4)}"
    (export / back).write_bytes(data[::-1])
    assert (point / back).read_bytes() == data[::-1]     # the client's side
    assert os.stat(point / name).st_dev != os.stat(export / name).st_dev

"""The kernel header tree bcc compiles against (ctracer.host.headers): choosing Debian's
header packages and merging the architecture and common trees into symlinks."""

from __future__ import annotations

import os

import pytest

from ctracer.host import headers


def make_tree(root, files):
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


@pytest.fixture
def usr_src(tmp_path):
    src = tmp_path / "src"
    make_tree(src / "linux-headers-6.1.0-9-common", {
        "Makefile": "common", "include/linux/kconfig.h": "kconfig",
        "arch/x86/include/asm/ptrace.h": "ptrace", "scripts/x": "x"})
    make_tree(src / "linux-headers-6.1.0-9-amd64", {
        "Makefile": "amd64", ".config": "CONFIG_X=y",
        "include/generated/autoconf.h": "auto", "arch/x86/include/generated/asm/x.h": "gen"})
    make_tree(src / "linux-headers-6.1.0-7-amd64", {"Makefile": "old"})
    make_tree(src / "linux-headers-6.1.0-7-common", {"Makefile": "old common"})
    make_tree(src / "linux-headers-6.1.0-9-arm64", {"Makefile": "arm"})
    return src


def test_newest_tree_of_this_architecture(usr_src):
    arch_tree, common = headers.debian_header_trees(str(usr_src), "amd64", "6.18.0-1-amd64")
    assert os.path.basename(arch_tree) == "linux-headers-6.1.0-9-amd64"
    assert os.path.basename(common) == "linux-headers-6.1.0-9-common"


def test_the_running_release_wins(usr_src):
    arch_tree, _ = headers.debian_header_trees(str(usr_src), "amd64", "6.1.0-7-amd64")
    assert os.path.basename(arch_tree) == "linux-headers-6.1.0-7-amd64"


def test_nothing_installed(tmp_path):
    assert headers.debian_header_trees(str(tmp_path), "amd64", "6.18.0") is None


def test_farm_merges_both_trees(usr_src, tmp_path):
    arch_tree, common = headers.debian_header_trees(str(usr_src), "amd64", "x")
    farm = headers.header_farm(arch_tree, common, cache=str(tmp_path / "cache"))
    assert farm.startswith(str(tmp_path / "cache"))
    read = lambda p: open(os.path.join(farm, p)).read()
    assert read("Makefile") == "amd64"                 # the architecture tree wins
    assert read(".config") == "CONFIG_X=y"
    assert read("include/linux/kconfig.h") == "kconfig"
    assert read("include/generated/autoconf.h") == "auto"
    assert read("arch/x86/include/asm/ptrace.h") == "ptrace"
    assert read("arch/x86/include/generated/asm/x.h") == "gen"
    # a directory in one tree only is one symlink; one in both is recreated
    assert os.path.islink(os.path.join(farm, "scripts"))
    assert not os.path.islink(os.path.join(farm, "include"))
    # built once, then reused
    assert headers.header_farm(arch_tree, common, cache=str(tmp_path / "cache")) == farm


def test_real_debian_headers_if_installed(tmp_path):
    trees = headers.debian_header_trees()
    if trees is None:
        pytest.skip("no linux-headers package installed in /usr/src")
    farm = headers.header_farm(*trees, cache=str(tmp_path))
    for path in ("include/linux/kconfig.h", "include/uapi/linux/ptrace.h",
                 "arch/x86/include/generated/uapi/asm/unistd_64.h"
                 if os.uname().machine == "x86_64" else "include/linux/types.h"):
        assert os.path.exists(os.path.join(farm, path)), path

#!/bin/sh
# Everything ctracer and its tests need on a fresh Debian 12 machine, as root:
# Debian packages (bcc's Python module, compilers, libbpf's headers for the reader
# bench's C consumer, pahole, graphviz, Chromium, kernel headers for bcc; QEMU, udev,
# kmod, busybox and the NFS server and client for the tests that run in a guest; a Java
# runtime for the Spark test of exports), a virtual environment in .venv that sees
# Debian's bcc module (virtme-ng and pyspark in it), and Debian 12's 6.1 and 6.12
# kernels and Debian unstable's 7.2 for those guests, in the cache (unstable's package
# lists kept in the cache too, not in this machine's apt).
# Safe to run again: it installs only what is missing.
set -eu
cd "$(dirname "$0")/.."

arch=$(dpkg --print-architecture)
packages="python3 python3-venv python3-pip python3-bpfcc gcc clang make libc6-dev libbpf-dev
  pahole bpftool bpftrace llvm dwz graphviz chromium fonts-dejavu-core linux-headers-$arch ca-certificates
  qemu-system-x86 udev kmod busybox-static nfs-kernel-server nfs-common rpcbind
  openjdk-17-jre-headless"

missing=""
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends $missing
fi

# bcc's module is built for Debian's interpreter; the venv must be made from it.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import bcc' 2>/dev/null; then
  rm -rf .venv
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.ctracer-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi

make -s -C samples

# the ring reader's walk in C (src/ctracer/record/ringwalk.c, loaded with ctypes; without
# it, or after its source changed, ctracer finds the records with numpy, slower)
walk=src/ctracer/record/ringwalk.c
gcc -O2 -Wall -shared -fPIC -DSOURCE_SHA256="\"$(sha256sum "$walk" | cut -d' ' -f1)\"" \
  -o src/ctracer/record/_ringwalk.so "$walk"

# ctracer(1) from the parsers, where man finds it beside .venv/bin (scripts/man-page)
./scripts/man-page

# the kernels the guests boot (scripts/vm-run; fetched once into the cache); package
# lists that do not know them yet are refreshed once (7.2's lists are vm-run's own)
./scripts/vm-run --fetch-only 6.1 6.12 >/dev/null 2>&1 \
  || { apt-get update -q && ./scripts/vm-run --fetch-only 6.1 6.12 >/dev/null; }
./scripts/vm-run --fetch-only 7.2 >/dev/null 2>&1 \
  || ./scripts/vm-run --refresh --fetch-only 7.2 >/dev/null

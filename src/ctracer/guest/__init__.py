"""Throwaway QEMU guests booting another kernel (Debian's 6.1, 6.12, 7.2 or a developer's
image) with this machine's files, for recording there (`ctracer trace --kernel`) and
for the project's own tests (scripts/vm-run).  `kernels` finds or fetches a kernel,
`boot` runs one command in a guest, `vmrun` is scripts/vm-run's command line.  These
modules run below the recording stage and import nothing of ctracer but its errors."""

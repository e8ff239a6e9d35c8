"""The BTF reader: the raw record `format`, the `reader` that builds the type model, and the
index `cache` keyed by content hash; here, where the running kernel shows its BTF (the
one definition: `ctracer.debuginfo.sources` needs it without importing the reader)."""

#: the running kernel's BTF
KERNEL_BTF = "/sys/kernel/btf/vmlinux"
#: where each loaded module's split BTF appears, as a file named after the module
MODULE_BTF_DIR = "/sys/kernel/btf"

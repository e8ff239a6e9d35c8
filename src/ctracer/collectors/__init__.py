"""Collectors: the BPF C that copies a traced object's fields into its mini snapshot."""

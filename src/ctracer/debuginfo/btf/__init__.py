"""The BTF reader: the raw record `format`, the `reader` that builds the type model, and the
index `cache` keyed by content hash."""

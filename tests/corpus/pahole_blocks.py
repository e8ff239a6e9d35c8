"""pahole's text output cut into its ``struct NAME {`` ... ``};`` blocks (a test oracle's
parser, shared by the layout tests and the kernel-corpus check)."""

from __future__ import annotations

import re
from typing import Iterator

_BLOCK_START = re.compile(r"(struct|union) (\S+) \{\n\Z")


def pahole_blocks(text: str) -> Iterator[tuple[str, str, str]]:
    """(kind, name, text) of each top-level struct/union block, in output order."""
    current = None
    for line in text.splitlines(True):
        if current is None:
            m = _BLOCK_START.match(line)
            if m:
                current = (m.group(1), m.group(2), [line])
            continue
        current[2].append(line)
        if line.startswith("}"):
            yield current[0], current[1], "".join(current[2])
            current = None

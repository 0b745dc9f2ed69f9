"""The "outside system" of the kill benchmarks: one line per side effect, appended and synced before returning."""

from __future__ import annotations

import os
from pathlib import Path


def write_line(path: Path, text: str) -> None:
    """Append ``text`` as one line (one ``write``, then ``fsync``: it is on disk before the call returns)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def lines(path: Path) -> list[str]:
    """The lines written so far (none when the file does not exist yet)."""
    return path.read_text().splitlines() if path.exists() else []

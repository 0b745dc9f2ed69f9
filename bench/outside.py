"""The "outside system" of the kill benchmarks: one line per side effect, appended and synced before returning.

The same outside system as the kill tests' children (``tests/threads/steps_child.py``, where it is defined):
what a benchmark counts is what the tests count.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.threads.steps_child import lines, write_line  # noqa: E402

__all__ = ["lines", "write_line"]

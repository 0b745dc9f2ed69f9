"""The heavy property tests, and the random-SIGKILL test of threads, run far longer than the suite runs them.

Exact command (from the repository root, in the test environment)::

    .venv/bin/python bench/properties.py --scale 10

Runs the property tests that call ``tests.helpers.examples`` with ``JIXU_EXAMPLE_SCALE`` set to ``--scale``
(the suite runs them with 1), and ``tests/threads/test_crash.py`` with ``JIXU_CRASH_RUNS`` = ``--scale``, and
fails when one fails. Prints a table, then one JSON line per figure
``{"bench": "properties", "metric": ..., "value": ..., "unit": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ["tests/recovery/test_decide_effect.py", "tests/recovery/test_resolver_properties.py",
          "tests/threads/test_compact_checkpoint.py", "tests/ledger/test_group_commit_batched.py",
          "tests/threads/test_http.py", "tests/threads/test_crash.py"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=10.0, help="examples multiplier (default 10)")
    args = parser.parse_args()
    # the random thread kills at the same scale (x10 by default: 150 on SQLite, where the outcome tally is checked)
    env = {**os.environ, "JIXU_EXAMPLE_SCALE": str(args.scale), "JIXU_CRASH_RUNS": str(max(1.0, args.scale))}
    rows = []
    failed = False
    for suite in SUITES:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", suite], cwd=ROOT,
                                env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        failed = failed or result.returncode != 0
        rows.append((suite, result.returncode == 0, seconds))
        if result.returncode != 0:
            print(result.stdout[-4000:], file=sys.stderr)
    print(f"{'suite':<48} {'passed':>6} {'seconds':>8}   (examples x{args.scale:g})")
    for suite, passed, seconds in rows:
        print(f"{suite:<48} {'yes' if passed else 'NO':>6} {seconds:8.1f}")
    for suite, passed, seconds in rows:
        name = Path(suite).stem
        print(json.dumps({"bench": "properties", "metric": f"{name}_passed", "value": int(passed), "unit": "bool"}))
        print(json.dumps({"bench": "properties", "metric": f"{name}_seconds", "value": round(seconds, 2),
                          "unit": "s"}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

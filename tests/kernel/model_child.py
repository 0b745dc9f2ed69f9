"""The child of the model-based test's SIGKILL sample: one scenario that kills itself at its crash point.

Run as ``python -m tests.kernel.model_child STORE_URL SEED THREADS``. It runs
the scenario of ``SEED`` (see tests/kernel/model.py) with ``THREADS``
threads; right after its crash point's commit the process SIGKILLs itself.
It prints, flushed, ``T <thread_id> ...`` once the threads exist and
``X <effect_id> <semantics>`` before each tool call does anything, so the
parent knows every call that may have happened; ``DONE`` if the scenario
ended before its crash point.
"""

from __future__ import annotations

import asyncio
import sys

from jixu.ledger import open_store
from tests.kernel.model import World, draw, run_scenario


def say(*words: str) -> None:
    """One whole line in one write: the SIGKILL comes from another thread (the commits'), and with
    ``PYTHONUNBUFFERED`` set ``print`` writes each word and separator on its own, so a kill between two of them
    left the parent half a line."""
    sys.stdout.write(" ".join(words) + "\n")
    sys.stdout.flush()


def main(url: str, seed: int, threads: int) -> None:
    world = World()
    world.on_invoke = lambda effect_id, semantics: say("X", effect_id, semantics)
    asyncio.run(run_scenario(draw(seed, threads=threads, crash=True), lambda: open_store(url), kill=True,
                             world=world, on_threads=lambda ids: say("T", *ids)))
    say("DONE")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))

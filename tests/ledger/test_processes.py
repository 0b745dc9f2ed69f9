"""Two OS processes appending to one stream in one SQLite file: no lost, duplicated or forked events.

The optimistic-concurrency contract across processes: each writer reads the
head, appends with ``expected_seq=head`` and retries on
:class:`~jixu.errors.ConcurrencyError`. Both children start at the same moment
(they spin on a barrier file the parent creates once both are ready), and each
pauses up to a millisecond between reading the head and appending, as an agent
deciding would, so conflicts actually happen.
"""

from __future__ import annotations

import itertools
import json
import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jixu.ledger.sqlite import SQLiteStore
from tests.helpers import spawn_python

TIMEOUT = 60.0

_BARRIER = r"""
import os, sys, time
def barrier(path):
    while not os.path.exists(path):
        time.sleep(0.0002)
"""

LOOP_CHILD = _BARRIER + r"""
import json, random
from jixu.errors import ConcurrencyError
from jixu.ledger.event import NewEvent
from jixu.ledger.sqlite import SQLiteStore

path, stream, name, n, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
store = SQLiteStore(path, synchronous="FULL")
rng = random.Random(name)
print("ready", flush=True)
barrier(go)
conflicts, seqs = 0, []
while len(seqs) < n:
    info = store.stream_info(stream)
    head = info.head_seq if info else 0
    time.sleep(rng.random() * 0.001)  # think time: the other writer may move the head meanwhile
    event = NewEvent("worker.tick", {"worker": name, "n": len(seqs)}, {"actor": name})
    try:
        seqs.append(store.append(stream, [event], expected_seq=head)[0].seq)
    except ConcurrencyError:
        conflicts += 1
print(json.dumps({"worker": name, "conflicts": conflicts, "seqs": seqs}), flush=True)
"""

RACE_CHILD = _BARRIER + r"""
from jixu.errors import JixuError
from jixu.ledger.event import NewEvent
from jixu.ledger.sqlite import SQLiteStore

path, name, rounds, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
store = SQLiteStore(path, synchronous="FULL")
for r in range(rounds):
    print("ready", r, flush=True)
    barrier(f"{go}.{r}")
    try:
        stored = store.append(f"race/{r}", [NewEvent("race.claimed", {"worker": name})], expected_seq=0)
        print("won", r, stored[0].seq, flush=True)
    except JixuError as exc:
        print("lost", r, exc.code, flush=True)
"""


class Child:
    """A child process whose stdout lines arrive on a queue."""

    def __init__(self, code: str, *args: str) -> None:
        self.proc: subprocess.Popen[str] = spawn_python(code, *args)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self) -> str:
        try:
            got = self.lines.get(timeout=TIMEOUT)
        except queue.Empty:
            pytest.fail(f"child printed nothing for {TIMEOUT}s")
        if got is None:
            self.proc.wait(timeout=TIMEOUT)
            stderr = self.proc.stderr.read() if self.proc.stderr else ""
            pytest.fail(f"child exited ({self.proc.returncode}) early: {stderr}")
        return got

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.finish()


def test_two_processes_appending_with_retries_lose_and_duplicate_nothing(
    tmp_path: Path, children: list[Child]
) -> None:
    path, stream, n, go = tmp_path / "shared.db", "shared/1", 200, tmp_path / "go"
    SQLiteStore(path).close()  # create the schema once, before the race
    workers = ["alpha", "beta"]
    children += [Child(LOOP_CHILD, str(path), stream, name, str(n), str(go)) for name in workers]
    for child in children:
        assert child.line() == "ready"
    go.touch()
    results = {r["worker"]: r for r in (json.loads(child.line()) for child in children)}
    for child in children:
        assert child.proc.wait(timeout=TIMEOUT) == 0

    with SQLiteStore(path) as store:
        info = store.stream_info(stream)
        events = store.read(stream)
        report = store.verify(stream)
    assert info is not None and info.head_seq == 2 * n
    assert [e.seq for e in events] == list(range(1, 2 * n + 1))
    assert report.valid and report.count == 2 * n and report.head_hash == events[-1].hash, report
    assert len({e.id for e in events}) == 2 * n
    for name in workers:
        mine = [e for e in events if e.data["worker"] == name]
        assert [e.data["n"] for e in mine] == list(range(n)), f"{name}'s events are missing, repeated or out of order"
        assert [e.seq for e in mine] == results[name]["seqs"], f"{name} was told other seqs than were stored"
    conflicts = {name: results[name]["conflicts"] for name in workers}
    switches = sum(a.data["worker"] != b.data["worker"] for a, b in itertools.pairwise(events))
    print(f"\n[two writers, {n} appends each] conflicts retried: {conflicts} (total "
          f"{sum(conflicts.values())}); the writer changed {switches} times along the stream")


def test_two_processes_racing_for_the_same_expected_seq_have_exactly_one_winner(
    tmp_path: Path, children: list[Child]
) -> None:
    path, rounds, go = tmp_path / "race.db", 10, tmp_path / "go"
    SQLiteStore(path).close()
    workers = ["alpha", "beta"]
    children += [Child(RACE_CHILD, str(path), name, str(rounds), str(go)) for name in workers]
    winners: list[str] = []
    for r in range(rounds):
        for child in children:
            assert child.line() == f"ready {r}"
        Path(f"{go}.{r}").touch()
        outcomes = {name: child.line().split() for name, child in zip(workers, children, strict=True)}
        won = [name for name, words in outcomes.items() if words[0] == "won"]
        lost = [words for words in outcomes.values() if words[0] == "lost"]
        assert len(won) == 1, f"round {r}: {outcomes}"
        assert outcomes[won[0]] == ["won", str(r), "1"]
        assert lost == [["lost", str(r), "concurrency_conflict"]], f"round {r}: {outcomes}"
        winners += won
        with SQLiteStore(path) as store:
            events = store.read(f"race/{r}")
            assert [(e.seq, e.data["worker"]) for e in events] == [(1, won[0])]
            assert store.verify(f"race/{r}").valid
    for child in children:
        assert child.proc.wait(timeout=TIMEOUT) == 0
    print(f"\n[race for seq 1, {rounds} rounds] winners: {winners}")

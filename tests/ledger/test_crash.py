"""Real SIGKILLs of a process appending to a SQLite ledger: every batch is all or nothing.

A child process appends batches to one stream forever (``synchronous=FULL``),
printing where it is. The parent kills it with SIGKILL at a random moment,
reopens the file and checks the contract, then starts the next child on the
same file, about twenty times per test.

The child observes its own transaction without changing jixu: it wraps the
store's connection in a proxy that prints ``txn`` after ``BEGIN IMMEDIATE``,
``insert`` before the rows are written and ``commit`` before ``COMMIT``. It
also shrinks SQLite's page cache so the rows of an open transaction spill into
the WAL file before the commit: a kill then leaves uncommitted frames on disk
that recovery must ignore. One variant also sleeps between the inserts and the
commit, so most kills land inside an open write transaction.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jixu.ledger.sqlite import SQLiteStore
from tests.helpers import spawn_python

pytestmark = pytest.mark.crash

STREAM = "crash/1"
LINE_TIMEOUT = 15.0  # seconds to wait for one line from a child before failing

CHILD = r"""
import sys, time, random
from jixu.ledger.event import NewEvent
from jixu.ledger.sqlite import SQLiteStore

path, stream, batch, pause, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
state = {"k": 0}

def say(what, *extra):
    print(what, state["k"], *extra, flush=True)

class Spy:
    # Delegates to the real connection and reports the phases of each write transaction.
    def __init__(self, real):
        self._real = real
    def execute(self, sql, *args):
        if sql == "COMMIT":
            say("commit")
        cursor = self._real.execute(sql, *args)
        if sql == "BEGIN IMMEDIATE":
            say("txn")
        return cursor
    def executemany(self, sql, rows):
        say("insert")
        cursor = self._real.executemany(sql, rows)
        if pause:
            time.sleep(rng.random() * pause)
        return cursor
    def __getattr__(self, name):
        return getattr(self._real, name)

store = SQLiteStore(path, synchronous="FULL")
store._conn.execute("PRAGMA cache_size = 16")  # spill uncommitted pages into the WAL mid-transaction
store._conn = Spy(store._conn)
info = store.stream_info(stream)
head = info.head_seq if info else 0
print("ready", head, flush=True)
filler = "lorem ipsum dolor sit amet " * 10
while True:
    k = head // batch + 1
    state["k"] = k
    events = [
        NewEvent("agent.step", {"batch": k, "i": i, "seq": head + i + 1, "text": filler[: 200 + (i * 7) % 100]},
                 {"actor": "crash-child", "schema": 1})
        for i in range(batch)
    ]
    say("begin")
    stored = store.append(stream, events, expected_seq=head)
    head = stored[-1].seq
    say("committed", head)
"""


@dataclass
class Cycle:
    """What one child printed before it was killed."""

    lines: list[str] = field(default_factory=list)

    def committed(self) -> list[int]:
        """The stream heads after each batch the child reported committed."""
        heads = []
        for line in self.lines:
            fields = line.split()
            if fields[:1] == ["committed"] and len(fields) == 3 and fields[2].isdigit():
                heads.append(int(fields[2]))
        return heads

    def last_phase(self) -> tuple[str, int]:
        """The last phase printed (``begin``/``txn``/``insert``/``commit``/``committed``) and its batch.

        A kill can cut the child's last line short; a line without both fields is such a remnant.
        """
        for line in reversed(self.lines):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return fields[0], int(fields[1])
        raise AssertionError(f"the child printed no phase line: {self.lines[-5:]}")


def _reader(stream: object, lines: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _run_and_kill(code_args: list[str], rng: random.Random, min_batches: int, delay_scale: float) -> Cycle:
    """Start a child, wait for ``min_batches`` commits, SIGKILL it after a random delay."""
    proc: subprocess.Popen[str] = spawn_python(CHILD, *code_args)
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    cycle = Cycle()
    stamps: list[float] = []
    ready = 0.0
    try:
        while len(stamps) < min_batches:
            try:
                line = lines.get(timeout=LINE_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"child printed nothing for {LINE_TIMEOUT}s; lines so far: {cycle.lines[-5:]}")
            if line is None:
                proc.wait()
                pytest.fail(f"child exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
            cycle.lines.append(line)
            if line.startswith("ready "):
                ready = time.perf_counter()
            elif line.startswith("committed "):
                stamps.append(time.perf_counter())
        interval = (stamps[-1] - ready) / len(stamps)  # one batch, from building its events to its commit
        time.sleep(rng.uniform(0, delay_scale * interval))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=LINE_TIMEOUT)
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    while (line := lines.get(timeout=LINE_TIMEOUT)) is not None:
        cycle.lines.append(line)
    if proc.stderr is not None:
        proc.stderr.close()
    return cycle


def _check_after_kill(path: Path, batch: int, committed_heads: list[int], cycle: Cycle) -> int:
    """Reopen the file and check the contract; return the stored head."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        count, low, high = conn.execute(
            "SELECT count(*), min(seq), max(seq) FROM jixu_events WHERE stream = ?", (STREAM,)
        ).fetchone()
    finally:
        conn.close()
    with SQLiteStore(path) as store:
        info = store.stream_info(STREAM)
        assert info is not None
        head = info.head_seq
        assert head % batch == 0, f"head {head} is not a whole number of {batch}-event batches"
        # (stream, seq) is unique, so this says seq 1..head are all there and nothing beyond
        assert (count, low, high) == (head, 1, head)
        report = store.verify(STREAM)
        assert report.valid, report
        assert report.count == head and report.head_hash == info.head_hash
        last_batch = list(store.read_rows(STREAM, from_seq=max(1, head - batch + 1)))
    # every batch the child reported committed survived the kill
    assert max(committed_heads, default=0) <= head, (committed_heads[-3:], head)
    # nothing beyond the batch in flight was stored
    _phase, in_flight = cycle.last_phase()
    assert head <= in_flight * batch
    for row in last_batch:
        assert f'"batch":{(row.seq - 1) // batch + 1},' in row.data_json
    return head


@pytest.mark.parametrize(
    ("batch", "pause", "seed", "kills"),
    [(2000, 0.0, 20260101, 4), (200, 0.03, 20260102, 8)],
    ids=["big_batches", "pause_inside_transaction"],
)
def test_sigkill_during_appends_leaves_whole_batches_and_a_valid_chain(
    tmp_path: Path, batch: int, pause: float, seed: int, kills: int
) -> None:
    rng = random.Random(seed)
    path = tmp_path / "crash.db"
    SQLiteStore(path).close()
    started = time.perf_counter()  # a fixed number of kills: a time budget made the count depend on the load
    committed_heads: list[int] = []
    phases: Counter[str] = Counter()
    lost_in_flight = 0  # kills that left a begun batch unstored
    done = 0
    head = 0
    while done < kills:
        done += 1
        cycle = _run_and_kill(
            [str(path), STREAM, str(batch), str(pause), str(rng.randrange(2**32))],
            rng, min_batches=rng.randint(1, 3), delay_scale=1.5,
        )
        committed_heads += cycle.committed()
        previous = head
        head = _check_after_kill(path, batch, committed_heads, cycle)
        assert head >= previous
        phase, k = cycle.last_phase()
        phases[phase] += 1
        if phase != "committed" and head < k * batch:
            lost_in_flight += 1
        if phase in ("txn", "insert"):
            assert head == (k - 1) * batch, "a batch killed before COMMIT must leave no trace"
    assert done == kills
    inside = phases["txn"] + phases["insert"] + phases["commit"]
    print(
        f"\n[crash {batch=} {pause=}] {done} kills in {time.perf_counter() - started:.1f}s; "
        f"last phase at kill: {dict(phases)}; {inside} inside an open write transaction; "
        f"{lost_in_flight} left a begun batch unwritten (rolled back); final head {head}"
    )
    if pause:
        assert inside > 0, f"no kill landed inside a write transaction: {dict(phases)}"

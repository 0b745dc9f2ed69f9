"""A loop's steps learn of breaks other processes recorded through one watch per process and store: every
stream's recorded break in one read, at most every ``BREAK_WATCH_INTERVAL_S`` (decision 0066). Measured before
it: a read per step cost ~10 % of a worker's CPU per step with 500 turns at once, more on PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

from jixu.kernel.writer import BREAK_WATCH_INTERVAL_S, _BreakWatch
from jixu.ledger import MemoryStore, NewEvent
from jixu.ledger.chain import VerifyReport
from jixu.ledger.trust import record_break


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[list[str]] = []

    def _checkpoints_named(self, name: str, streams: list[str]) -> Any:
        self.reads.append(list(streams))
        return super()._checkpoints_named(name, streams)


def test_the_watch_reads_every_streams_break_at_once_at_most_every_interval(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("JIXU_KEY_FILE", str(tmp_path / "keys"))
    store = CountingStore()
    streams = [f"thread/t{i}" for i in range(5)]
    for stream in streams:
        store.append(stream, [NewEvent("a.b")], 0)
    watch = _BreakWatch()
    assert [watch.recorded(store, stream) for stream in streams] == [None] * 5
    assert store.reads == [[stream] for stream in streams]  # each read once, when first asked about
    record_break(store, VerifyReport(stream=streams[3], valid=False, count=1, head_hash="0" * 64, first_bad_seq=1,
                                     reason="payload_changed", detail="changed"))
    for _ in range(100):
        assert watch.recorded(store, streams[3]) is None  # not read again within the interval
    assert len(store.reads) == 5
    time.sleep(BREAK_WATCH_INTERVAL_S + 0.05)
    found = watch.recorded(store, streams[0])
    assert found is None and store.reads[-1] == streams  # every stream asked about, in one read
    seen = watch.recorded(store, streams[3])
    assert seen is not None and seen.first_bad_seq == 1 and len(store.reads) == 6


def test_a_slower_older_read_does_not_undo_what_a_newer_one_found(tmp_path: Any, monkeypatch: Any) -> None:
    """Seen by an audit: a read that started first and answered last overwrote a newer read's break with its
    older 'none', and steps were told there was no break until the next read."""
    import threading

    monkeypatch.setenv("JIXU_KEY_FILE", str(tmp_path / "keys"))
    answered, let_go = threading.Event(), threading.Event()

    class SlowFirstRead(MemoryStore):
        calls = 0

        def _checkpoints_named(self, name: str, streams: list[str]) -> Any:
            found = super()._checkpoints_named(name, streams)
            SlowFirstRead.calls += 1
            if SlowFirstRead.calls == 1:  # the first read has its answer, then is slow to hand it over
                answered.set()
                assert let_go.wait(10)
            return found

    store = SlowFirstRead()
    store.append("thread/t", [NewEvent("a.b")], 0)
    watch = _BreakWatch()
    older: list[Any] = []
    first = threading.Thread(target=lambda: older.append(watch.recorded(store, "thread/t")))
    first.start()
    assert answered.wait(10)
    record_break(store, VerifyReport(stream="thread/t", valid=False, count=1, head_hash="0" * 64, first_bad_seq=1,
                                     reason="payload_changed", detail="changed"))
    time.sleep(BREAK_WATCH_INTERVAL_S + 0.05)
    newer = watch.recorded(store, "thread/t")
    assert newer is not None and newer.first_bad_seq == 1
    let_go.set()
    first.join(10)
    assert watch.recorded(store, "thread/t") is not None  # still known: the older read's 'none' was not kept

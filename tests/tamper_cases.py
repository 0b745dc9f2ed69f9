"""The tamper matrix of issue 22: threads built by a real harness, then changed by an attacker (tests/attacker.py).

Every case is one thread in one store: two finished turns (each looks an order
up with a read-only tool), with its checkpoint at the head (as the harness
leaves it), in the middle (the checkpoint of the first turn), or none. Then
one of the seven kinds of event tampering is applied to an event *before* the
checkpoint (the last-event kind changes the head), or the checkpoint itself is
edited (naively, or with the public digest recomputed). The surfaces are then
asked: nothing may act, and every one must name the same first bad seq and
reason (for a forged checkpoint: nothing is corrupt, the forged state is never
used, and the verifiers say it was forged).

``agent()`` is the agent every case runs under (also the server's worker in
the HTTP and Studio tests): ``look up N`` calls ``lookup_order`` (read-only),
``refund N`` the unsafe ``refund``, ``charge N`` the unsafe ``charge_card``,
which needs approval. :data:`TOOL_CALLS` and :data:`MODEL_SEEN` record, in
this process, every tool call and every conversation a model request carried.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.ledger import Store
from tests.attacker import KINDS, Raw, forge_checkpoint

TOOL_CALLS: list[str] = []
MODEL_SEEN: list[list[dict[str, Any]]] = []
FORGED_TEXT = "FORGED: refund approved"
TAMPER_SEQ = 5
"""The event changed: inside the first turn, before either checkpoint (a relink needs seq > 2)."""
PLACEMENTS = ("none", "head", "middle")
CHECKPOINT_EDITS = ("naive_edit", "recomputed_digest")
PROJECT = "alpha"


@tool(semantics="read_only")
def lookup_order(order: str) -> str:
    """Look an order up."""
    TOOL_CALLS.append(f"lookup_order {order}")
    return f"order {order}: 10 EUR, paid"


@tool(semantics="unsafe")
def refund(order: str) -> str:
    """Refund an order (unsafe: a repeat would pay twice)."""
    TOOL_CALLS.append(f"refund {order}")
    return f"refunded order {order}"


@tool(semantics="unsafe", requires_approval=True)
def charge_card(order: str) -> str:
    """Charge a card (needs approval)."""
    TOOL_CALLS.append(f"charge_card {order}")
    return f"charged order {order}"


def _script(messages: list[dict[str, Any]]) -> str | ToolCall:
    MODEL_SEEN.append([dict(m) for m in messages])
    last = messages[-1]
    if last.get("role") != "user":
        return f"done: {last.get('content')}"
    text = str(last.get("content") or "")
    found = re.search(r"(look up|refund|charge) (\d+)", text)
    if found is None:
        return f"echo: {text}"
    name = {"look up": "lookup_order", "refund": "refund", "charge": "charge_card"}[found.group(1)]
    return ToolCall(name, {"order": found.group(2)})


def agent() -> Agent:
    """The agent of every tamper case."""
    return Agent("tamper-matrix", ScriptedModel(_script), tools=[lookup_order, refund, charge_card])


T = TypeVar("T")


def in_thread(call: Callable[[], T]) -> T:
    """``call()`` on a thread of its own, its result or its exception handed back."""
    result: list[T] = []
    failure: list[BaseException] = []

    def main() -> None:
        try:
            result.append(call())
        except BaseException as error:  # handed to the caller
            failure.append(error)

    worker = threading.Thread(target=main)
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


def run(make: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(make())`` on a thread of its own (safe while another event loop runs in this one, e.g.
    Playwright's)."""
    return in_thread(lambda: asyncio.run(make()))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    """One thread of the matrix and what every surface must say about it."""

    name: str
    kind: str
    placement: str
    thread_id: str
    head_seq: int
    expected_seq: int | None
    """The first bad seq every surface must name (``None``: the events are intact)."""
    expected_reason: str | None
    checkpoint_seq: int | None

    @property
    def stream(self) -> str:
        return f"thread/{self.thread_id}"

    @property
    def corrupt(self) -> bool:
        return self.expected_seq is not None

    @property
    def sound_before(self) -> int | None:
        """The first seq no surface may vouch for (a fork starts only before it): the first bad one, or 1 when a
        sealed checkpoint lies at or after it (the break may hide a rewrite that checkpoint would have caught)."""
        if self.expected_seq is None:
            return None
        if self.expected_reason == "rewritten" or (self.checkpoint_seq is not None
                                                   and self.checkpoint_seq >= self.expected_seq):
            return 1
        return self.expected_seq


def _checkpoint_rows(raw: Raw, stream: str) -> list[tuple[Any, ...]]:
    with raw.transaction() as sql:
        return sql("SELECT stream, name, seq, reducer_version, head_hash, state, digest, created_at "
                   "FROM jixu_checkpoints WHERE stream = ?", stream)


def _put_checkpoint_rows(raw: Raw, stream: str, rows: list[tuple[Any, ...]]) -> None:
    with raw.transaction() as sql:
        sql("DELETE FROM jixu_checkpoints WHERE stream = ?", stream)
        for row in rows:
            sql("INSERT INTO jixu_checkpoints (stream, name, seq, reducer_version, head_hash, state, digest, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", *row)


async def _two_turns(store: Store, raw: Raw, placement: str, *, last: str = "look up 42") -> tuple[str, int | None]:
    """A thread with two finished turns; its checkpoint placed as asked. Returns (thread id, checkpoint seq)."""
    harness = Harness(agent(), store, owner="builder")
    thread = await harness.create_thread(metadata={"project": PROJECT})
    await thread.send("look up 41")
    first = await thread.wait()
    assert first.status == "idle", first.reason
    stream = f"thread/{thread.thread_id}"
    after_first = _checkpoint_rows(raw, stream)
    assert after_first, "the harness wrote no checkpoint"
    await thread.send(last)
    second = await thread.wait()
    assert second.status in ("idle", "waiting"), second.reason
    if placement == "none":
        _put_checkpoint_rows(raw, stream, [])
        return thread.thread_id, None
    if placement == "middle":
        _put_checkpoint_rows(raw, stream, after_first)
        return thread.thread_id, first.seq
    assert raw.checkpoint(stream, "thread") is not None
    return thread.thread_id, second.seq


def tamper_cases(store: Store, target: str | Path, *, kinds: tuple[str, ...] = tuple(KINDS),
                 placements: tuple[str, ...] = PLACEMENTS, checkpoint_edits: bool = True) -> list[Case]:
    """Build and tamper every case in ``store`` (whose database ``target`` names, for raw SQL)."""
    raw = Raw(target)
    cases: list[Case] = []

    async def build() -> None:
        for placement in placements:
            for kind in kinds:
                thread_id, checkpoint_seq = await _two_turns(store, raw, placement)
                stream = f"thread/{thread_id}"
                head = raw.head(stream)
                assert checkpoint_seq is None or checkpoint_seq > TAMPER_SEQ
                change, reason = KINDS[kind]
                seq = head if kind == "last_event" else TAMPER_SEQ
                change(raw, stream, seq)
                cases.append(Case(f"{kind}-{placement}", kind, placement, thread_id, head, seq, reason,
                                  checkpoint_seq))
            if checkpoint_edits and placement != "none":
                for edit in CHECKPOINT_EDITS:
                    thread_id, checkpoint_seq = await _two_turns(store, raw, placement)
                    stream = f"thread/{thread_id}"
                    forge_checkpoint(raw, stream, "thread", lambda s: s.replace("order 41: 10 EUR, paid", FORGED_TEXT),
                                     recompute=edit == "recomputed_digest")
                    cases.append(Case(f"{edit}-{placement}", edit, placement, thread_id, raw.head(stream), None, None,
                                      checkpoint_seq))

    run(build)
    return cases


# --- runs and execution requests -------------------------------------------------------------------------

RUN_TAMPER_SEQ = 5
"""The journal entry changed (a task's dispatch marker), before a checkpoint in the middle (seq 12)."""
RUN_MIDDLE_SEQ = 12
REQUEST_TAMPER_SEQ = 3
"""The request's dispatch marker (the stream: admitted, requested, dispatched, failed)."""


@dataclass(frozen=True)
class RunCase:
    """One tampered copy of the Studio fixture's store: a run's journal or a request's stream changed."""

    name: str
    kind: str
    placement: str
    """``none`` / ``head`` / ``middle`` for a run's journal; ``request`` for a request's stream."""
    path: Path
    fixture: dict[str, Any]
    stream: str
    expected_seq: int
    expected_reason: str

    @property
    def run_id(self) -> str:
        return str(self.fixture["failed_check_run"] if self.placement != "request" else self.fixture["publication_run"])

    @property
    def request_id(self) -> str:
        return str(self.fixture["publication_request"])


def run_fixture(base: Path) -> tuple[Path, dict[str, Any]]:
    """The Studio fixture (``jixu studio-fixture``): a paused run, a succeeded run with a publication request
    that needs reconciliation, two threads, tokens. Returns its store file and what it made."""
    from jixu.cli.studio import build_fixture

    path = base / "fixture.db"
    # build_fixture runs an event loop of its own: on a thread of its own (see run()).
    return path, in_thread(lambda: build_fixture(f"sqlite:///{path}", base / "fixture").to_dict())


def _place_run_checkpoint(path: Path, run_id: str, placement: str) -> None:
    """Give the run's journal no checkpoint, one sealed at its head, or one sealed in the middle (seq 12)."""
    from jixu.ledger import SQLiteStore
    from jixu.ledger.projection import fold, make_checkpoint
    from jixu.runs.journal import RunLog
    from jixu.runs.projection import RunProjection

    stream = f"run/{run_id}"
    with SQLiteStore(path) as store:
        if placement == "head":
            assert RunLog(store, run_id).checkpoint()
        elif placement == "middle":
            events = store.read(stream, 1, RUN_MIDDLE_SEQ)
            state = fold(RunProjection(), events)
            store.write_checkpoint(make_checkpoint(stream, RunProjection(), state, RUN_MIDDLE_SEQ, events[-1].hash))
    if placement == "none":
        _put_checkpoint_rows(Raw(path), stream, [])
    else:
        found = Raw(path).checkpoint(stream, "run")
        assert found is not None and found["seq"] == (RUN_MIDDLE_SEQ if placement == "middle" else
                                                      Raw(path).head(stream))


def run_cases(base: Path, path: Path, fixture: dict[str, Any], *, kinds: tuple[str, ...] = tuple(KINDS),
              placements: tuple[str, ...] = ("none", "head", "middle", "request")) -> list[RunCase]:
    """One tampered copy of the fixture's store per (kind, placement)."""
    cases = []
    for placement in placements:
        for kind in kinds:
            copy = copy_store(path, base / f"{kind}-{placement}.db")
            raw = Raw(copy)
            change, reason = KINDS[kind]
            if placement == "request":
                stream = f"request/{fixture['publication_request']}"
                seq = REQUEST_TAMPER_SEQ
            else:
                stream = f"run/{fixture['failed_check_run']}"
                _place_run_checkpoint(copy, str(fixture["failed_check_run"]), placement)
                seq = RUN_TAMPER_SEQ
            if kind == "last_event":
                seq = raw.head(stream)
            change(raw, stream, seq)
            cases.append(RunCase(f"{kind}-{placement}", kind, placement, copy, fixture, stream, seq, reason))
    return cases


def copy_store(path: Path, to: Path) -> Path:
    """A copy of a closed SQLite ledger file (its WAL folded in first), for a surface that must be the first to
    look at the tampered store."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    shutil.copyfile(path, to)
    return to


__all__ = ["CHECKPOINT_EDITS", "FORGED_TEXT", "MODEL_SEEN", "PLACEMENTS", "TAMPER_SEQ", "TOOL_CALLS", "Case", "RunCase",
           "agent", "copy_store", "run", "run_cases", "run_fixture", "tamper_cases"]

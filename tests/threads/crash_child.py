"""The child program of ``tests/threads/test_crash.py``: a jixu thread in a process that gets SIGKILLed.

Run as ``python -m tests.threads.crash_child MODE …`` (see :func:`main`):

``scenario STORE OUTSIDE SEMANTICS CRASH_POINT``
    Runs one settled turn ("Charge order 41"), then arms the crash point and
    starts a second turn ("Charge order 42"); the process SIGKILLs *itself* at
    the crash point. It never exits on its own.
``recover STORE OUTSIDE SEMANTICS CRASH_POINT THREAD_ID``
    Reopens the scenario thread THREAD_ID with the crash point armed at once:
    the process SIGKILLs itself when recovery reaches it again.
``random STORE OUTSIDE [THREAD_ID]``
    Creates a thread (or reopens THREAD_ID, recovering what it left open)
    and sends turns forever, each with several calls, some in parallel, of
    three tools of different semantics; the parent SIGKILLs it at a random
    moment.

``STORE`` is a store URL: ``sqlite:///PATH`` or a ``postgresql://`` URL (the
test's own schema, chosen with ``options=-csearch_path=…``).

Every mode prints, flushed, one line per fact the parent may rely on:

- ``T <thread_id>``: the thread exists;
- ``E <seq> <event_id> <type>``: an event that is committed (printed after the
  store's ``append`` returned, so every printed event is durable);
- ``X <effect_id> <attempt>``: a tool's side effect is in the outside file;
- ``C+ <seq>`` / ``C- <seq>``: a checkpoint transaction begins / committed;
- ``W <bytes>`` (SQLite) / ``W <bytes> <xid>`` (PostgreSQL): (crash point
  ``checkpoint``) what the open checkpoint transaction already wrote into the
  WAL when the process kills itself (PostgreSQL: and the transaction's id, so
  the parent can ask the server whether it was rolled back);
- ``R <status>``: the recovery of a reopened thread settled (random mode);
- ``S <turn> <status>``: a turn settled (random mode).

The "outside system" is a plain file: each tool execution appends one line
``<effect_id> <idempotency_key> <attempt> <tool>`` with one ``O_APPEND`` write
and fsyncs it before the tool returns.

The crash points are set by wrapping the store's methods inside this process
only (jixu itself is not changed): after an ``append`` that stored an event of
the chosen type returned; in the tool after the side effect; and inside the
checkpoint's write transaction, after its INSERT and before its COMMIT.
(``PostgresStore`` writes a checkpoint as one upsert in autocommit mode; the
armed child runs that same statement through the store's own transaction path,
``_run(..., transaction=True)``, so the kill lands after the upsert executed and
before its COMMIT.) For a SQLite ledger this module imports only jixu and the
standard library, so a child starts in about a tenth of a second; psycopg is
imported only for a PostgreSQL one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from jixu import Agent, Harness, ScriptedModel, ToolCall, ToolContext, tool
from jixu.ledger.event import Event
from jixu.ledger.sqlite import SQLiteStore
from jixu.threads.tools import Semantics, Tool

CRASH_POINTS: tuple[str, ...] = (
    "tool.requested",  # 1. the intent is committed, nothing dispatched
    "tool.dispatched",  # 2. the dispatch marker is committed, the tool has not run
    "side_effect",  # 3. the tool changed the outside system, no receipt yet
    "tool.completed",  # 4. the receipt is committed
    "checkpoint",  # 5. inside the checkpoint's write transaction, before COMMIT
    "model.dispatched",  # 6. a model call left the process, no receipt
)
SEMANTICS: tuple[Semantics, ...] = ("unsafe", "idempotent", "read_only")

FIRST_INPUT = "Charge order 41"
SECOND_INPUT = "Charge order 42"

_T = TypeVar("_T")

WORKER_OWNER = "crash-test-worker"
"""Every child and the recovering parent share one owner name: a restarted worker reclaims its own turns."""


def say(*fields: object) -> None:
    """Report one line with a single ``write`` to the pipe: atomic, so lines from the tool's worker thread
    and the event loop never interleave, and a kill leaves whole lines only."""
    os.write(1, (" ".join(map(str, fields)) + "\n").encode())


def die() -> None:
    """SIGKILL this process: no cleanup, no ``finally``, no atexit, like a power cut of the process."""
    os.kill(os.getpid(), signal.SIGKILL)


# --- the outside system --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutsideLine:
    """One execution of a tool, as the outside system saw it."""

    effect_id: str
    idempotency_key: str
    attempt: int
    tool: str


def touch_outside(path: str, ctx: ToolContext, name: str) -> None:
    """Record one execution: a single appended line, fsynced before returning."""
    line = f"{ctx.effect_id} {ctx.idempotency_key} {ctx.attempt} {name}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_outside(path: str | Path) -> list[OutsideLine]:
    """Every execution recorded in the outside file, in order (a torn last line would fail loudly)."""
    if not os.path.exists(path):
        return []
    lines = []
    for text in Path(path).read_text().splitlines():
        effect_id, key, attempt, name = text.split(" ")
        lines.append(OutsideLine(effect_id, key, int(attempt), name))
    return lines


Hook = Callable[[ToolContext], None]


def outside_tool(name: str, semantics: Semantics, outside: str, hook: Hook | None, pad: int = 0) -> Tool:
    """A tool that changes the outside system once per execution; ``hook`` runs right after the change.

    Its result carries ``pad`` filler characters (to make the thread's checkpoints large).
    """

    def body(item: str, ctx: ToolContext) -> str:
        touch_outside(outside, ctx, name)
        if hook is not None:
            hook(ctx)
        return f"{name} {item}: ok" + "." * pad

    body.__doc__ = f"{name} an item ({semantics})."
    return tool(name=name, semantics=semantics)(body)


# --- agents (the parent builds the same ones: the contract must match) ----------------


def _this_turn(messages: Sequence[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The input of the latest turn and the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return str(messages[index].get("content")), list(messages[index + 1:])
    raise AssertionError("no user message")


def scenario_step(messages: list[dict[str, Any]]) -> str | ToolCall:
    """Charge the order named in the input; call again only after a ``not_occurred`` resolution."""
    text, turn = _this_turn(messages)
    order = text.rsplit(" ", 1)[-1]
    if not any(m.get("role") == "assistant" for m in turn):
        return ToolCall("charge", {"item": order})
    if turn[-1].get("role") == "tool" and turn[-1].get("status") == "not_occurred":
        return ToolCall("charge", {"item": order})
    return f"Charged order {order}."


SCENARIO_PAD = 60_000
"""Filler in each scenario tool result: the second checkpoint is then larger than the child's page cache
(and the result stays under the 64 KiB above which it would be stored as an artifact, outside the state)."""


def scenario_agent(semantics: Semantics, outside: str, hook: Hook | None = None) -> Agent:
    """One tool, ``charge``, with the given semantics."""
    return Agent(name="crash-shop", model=ScriptedModel(scenario_step),
                 tools=[outside_tool("charge", semantics, outside, hook, SCENARIO_PAD)])


RANDOM_TOOLS: dict[str, Semantics] = {"lookup": "read_only", "reserve": "idempotent", "charge": "unsafe"}
_PLANS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("lookup",), ("reserve", "charge"), ("charge", "lookup")),
    (("charge",), ("lookup", "reserve", "charge")),
    (("reserve", "lookup"), ("charge", "charge"), ("reserve",)),
)


def random_reply(turn: int) -> str:
    """The final reply of turn ``turn`` of the random agent."""
    return f"Done with turn {turn}."


def random_step(messages: list[dict[str, Any]]) -> str | list[ToolCall]:
    """Turn ``k`` follows plan ``k % 3``: a few steps of (parallel) calls, then a reply."""
    text, turn = _this_turn(messages)
    number = int(text.rsplit(" ", 1)[-1])
    plan = _PLANS[number % len(_PLANS)]
    step = sum(1 for m in turn if m.get("role") == "assistant")
    if step >= len(plan):
        return random_reply(number)
    return [ToolCall(name, {"item": f"t{number}s{step}c{index}"}) for index, name in enumerate(plan[step])]


def random_agent(outside: str, hook: Hook | None = None) -> Agent:
    """Three tools: ``lookup`` (read_only), ``reserve`` (idempotent), ``charge`` (unsafe)."""
    return Agent(name="crash-mix", model=ScriptedModel(random_step),
                 tools=[outside_tool(name, semantics, outside, hook) for name, semantics in RANDOM_TOOLS.items()])


# --- instrumentation (this process only) ----------------------------------------------


class Crash:
    """Wraps the store class of ``url`` to report what is committed and to die at ``point`` once ``armed``."""

    def __init__(self, point: str | None, url: str) -> None:
        self.point = point
        self.url = url
        self.armed = False
        self._in_checkpoint = False

    def _dies_in_checkpoint(self) -> bool:
        return self._in_checkpoint and self.armed and self.point == "checkpoint"

    def install(self) -> None:
        if self.url.startswith(("postgresql://", "postgres://")):
            self._install_postgres()
        else:
            self._install_sqlite()

    def _report(self, store_class: type[Any]) -> None:
        """Wrap ``append`` (report each committed event, die after the crash point's) and the checkpoint write."""
        crash = self
        original_append = store_class.append
        original_checkpoints = store_class._write_checkpoints

        def append(self: Any, *args: Any, **kwargs: Any) -> list[Event]:
            stored: list[Event] = original_append(self, *args, **kwargs)
            for event in stored:  # returned, so committed: report it (the thread's; a large result's
                if event.stream.startswith("thread/"):  # artifact/<sha256> stream is read back from the thread)
                    say("E", event.seq, event.id, event.type)
            if crash.armed and any(event.type == crash.point for event in stored):
                die()
            return stored

        def write_checkpoints(self: Any, checkpoints: list[Any]) -> None:
            seq = checkpoints[-1].seq  # the rows of one checkpoint (its chunks and its main row) share its seq
            say("C+", seq)
            crash._in_checkpoint = True
            try:
                original_checkpoints(self, checkpoints)
            finally:
                crash._in_checkpoint = False
            say("C-", seq)

        store_class.append = append
        store_class._write_checkpoints = write_checkpoints

    def _install_sqlite(self) -> None:
        crash = self
        original_init = SQLiteStore.__init__
        original_write = SQLiteStore._write

        def init(self: SQLiteStore, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            # A tiny page cache: a large transaction spills its pages into the WAL file before COMMIT,
            # so a kill inside it leaves uncommitted frames on disk that the next reader must ignore.
            self._conn.execute("PRAGMA cache_size = 10")

        def write(self: SQLiteStore, fn: Callable[[sqlite3.Connection], _T], *, sync: bool = True) -> _T:
            if not crash._dies_in_checkpoint():
                return original_write(self, fn, sync=sync)

            wal = f"{self.path}-wal"

            def then_die(conn: sqlite3.Connection) -> _T:
                with open(wal, "rb") as file:
                    before = file.read()
                result = fn(conn)  # the checkpoint row is written, the transaction is open
                assert conn.in_transaction
                with open(wal, "rb") as file:
                    after = file.read()
                # Bytes of uncommitted frames already in the WAL: the log may overwrite blocks the file
                # had (the store grows a new WAL before its first append, decision 0018), so compare them.
                changed = 4096 * sum(before[i:i + 4096] != after[i:i + 4096]
                                     for i in range(0, min(len(before), len(after)), 4096))
                changed += max(0, len(after) - len(before))
                say("W", changed)
                die()
                return result  # pragma: no cover

            return original_write(self, then_die, sync=sync)

        self._report(SQLiteStore)
        SQLiteStore.__init__ = init  # type: ignore[method-assign]
        SQLiteStore._write = write  # type: ignore[method-assign]

    def _install_postgres(self) -> None:
        from psycopg.pq import TransactionStatus

        from jixu.ledger.postgres import PostgresStore

        crash = self
        original_run = PostgresStore._run

        def run(self: PostgresStore, fn: Callable[[Any], _T], **how: Any) -> _T:
            if not crash._dies_in_checkpoint():
                return original_run(self, fn, **how)

            def then_die(conn: Any) -> _T:
                start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
                result = fn(conn)  # the checkpoint upsert has run; its transaction is open
                assert conn.info.transaction_status == TransactionStatus.INTRANS
                wrote, xid = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn, "
                                          "pg_current_xact_id_if_assigned()::text", (start,)).fetchone()
                say("W", int(wrote), xid)  # WAL written by the open transaction, and its id
                die()
                return result  # pragma: no cover

            return original_run(self, then_die, **{**how, "transaction": True})

        self._report(PostgresStore)
        PostgresStore._run = run  # type: ignore[method-assign]

    def after_side_effect(self, ctx: ToolContext) -> None:
        say("X", ctx.effect_id, ctx.attempt)
        if self.armed and self.point == "side_effect":
            die()


# --- the two programs ---------------------------------------------------------------


async def run_scenario(url: str, outside: str, semantics: Semantics, point: str) -> None:
    crash = Crash(point, url)
    crash.install()
    harness = Harness(scenario_agent(semantics, outside, crash.after_side_effect), store=url, owner=WORKER_OWNER)
    thread = await harness.create_thread()
    say("T", thread.thread_id)
    await thread.send(FIRST_INPUT)
    state = await asyncio.wait_for(thread.wait(), 30)
    if state.status != "idle":
        raise SystemExit(f"the first turn ended {state.status}: {state.reason}")
    crash.armed = True
    await thread.send(SECOND_INPUT)
    await asyncio.wait_for(thread.wait(), 30)
    raise SystemExit(f"crash point {point!r} was never reached")


async def run_recover(url: str, outside: str, semantics: Semantics, point: str, thread_id: str) -> None:
    crash = Crash(point, url)
    crash.install()
    crash.armed = True
    harness = Harness(scenario_agent(semantics, outside, crash.after_side_effect), store=url, owner=WORKER_OWNER)
    thread = await harness.open_thread(thread_id)
    say("T", thread.thread_id)
    state = await asyncio.wait_for(thread.wait(), 30)
    raise SystemExit(f"crash point {point!r} was never reached; the thread is {state.status}: {state.reason}")


async def run_random(url: str, outside: str, thread_id: str | None) -> None:
    crash = Crash(None, url)
    crash.install()
    harness = Harness(random_agent(outside, crash.after_side_effect), store=url, owner=WORKER_OWNER)
    if thread_id is None:
        thread = await harness.create_thread()
        say("T", thread.thread_id)
    else:  # recover it here: the parent may leave open effects to this process (and kill it meanwhile)
        thread = await harness.open_thread(thread_id)
        say("T", thread.thread_id)
        state = await asyncio.wait_for(thread.wait(), 30)
        say("R", state.status)
        if state.status != "idle":
            raise SystemExit(f"reopened thread is {state.status}: {state.reason}")
    first = len(thread.state().turns)
    for number in range(first, first + 10_000):
        await thread.send(f"turn {number}")
        state = await asyncio.wait_for(thread.wait(), 30)
        say("S", number, state.status)
        if state.status != "idle":
            raise SystemExit(f"turn {number} ended {state.status}: {state.reason}")


def main(argv: Sequence[str]) -> None:
    mode, *args = argv
    if mode == "scenario":
        url, outside, semantics, point = args
        if semantics not in SEMANTICS or point not in CRASH_POINTS:
            raise SystemExit(f"bad arguments {args}")
        asyncio.run(run_scenario(url, outside, semantics, point))
    elif mode == "recover":
        url, outside, semantics, point, thread_id = args
        if semantics not in SEMANTICS or point not in CRASH_POINTS:
            raise SystemExit(f"bad arguments {args}")
        asyncio.run(run_recover(url, outside, semantics, point, thread_id))
    elif mode == "random":
        url, outside, *rest = args
        asyncio.run(run_random(url, outside, rest[0] if rest else None))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Fixtures and helpers for the thread behaviour suites: real stores, recording tools, one-answer checks.

Every thread test runs against a real store of each kind: the in-memory store,
a SQLite file in ``tmp_path`` and a fresh schema in the test session's
PostgreSQL (see ``tests/conftest.py``). SQLite and PostgreSQL ledgers are
opened by URL, so a second Harness on the same ledger really is a second
connection (for PostgreSQL, a second connection pool), as after a process
boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from jixu.ledger import Event, MemoryStore, SQLiteStore, Store, is_valid_id
from jixu.ledger.postgres import PostgresStore, mask_dsn
from jixu.recovery import PHASES, RecoveryResolver
from jixu.threads import Agent, Harness, ModelRequest, ModelResponse, State, Thread, Tool
from jixu.threads.log import stream_of
from tests.conftest import PostgresSchema

T = TypeVar("T")
LEDGER_KINDS = ["memory", "sqlite", "postgres"]
DURABLE_KINDS = ["sqlite", "postgres"]

_POSTGRES_URLS: dict[str, str] = {}
"""The full URL of every PostgreSQL test ledger by its masked form (``PostgresStore.url`` hides a password)."""


def reopen_target(store: Store) -> Store | str:
    """What opens ``store``'s ledger again on a new connection: its URL (the MemoryStore itself)."""
    if isinstance(store, SQLiteStore):
        return store.url
    if isinstance(store, PostgresStore):
        return _POSTGRES_URLS.get(store.url, store.url)
    return store


class Ledger:
    """One ledger of one kind; every Harness made here works on it and is closed at teardown.

    ``memory``: one shared MemoryStore; ``sqlite``: the file ``path``;
    ``postgres``: a fresh schema of its own in the session's server (dropped at
    teardown). For the last two, ``url`` opens the ledger on a new connection.
    """

    def __init__(self, kind: str, tmp_path: Path, postgres_dsn: str | None = None) -> None:
        self.kind = kind
        self.path = tmp_path / "t.db"
        self.url = f"sqlite:///{tmp_path}/t.db"
        self._memory = MemoryStore() if kind == "memory" else None
        self._schema: PostgresSchema | None = None
        if kind == "postgres":
            assert postgres_dsn is not None, "a postgres ledger needs the session's server"
            self._schema = PostgresSchema(postgres_dsn)
            self.url = self._schema.url
            _POSTGRES_URLS[mask_dsn(self.url)] = self.url
        self._harnesses: list[Harness] = []
        self._stores: list[Store] = []

    def target(self) -> Store | str:
        """What to give a Harness: the shared MemoryStore, or the URL (a new connection each time)."""
        return self._memory if self._memory is not None else self.url

    def harness(self, agent: Agent, **options: Any) -> Harness:
        """A new Harness on this ledger (as a fresh process would make)."""
        made = Harness(agent, self.target(), **options)
        self._harnesses.append(made)
        return made

    def store(self) -> Store:
        """A store handle for inspecting (or tampering with) the ledger directly (a new connection)."""
        if self._memory is not None:
            return self._memory
        opened: Store = PostgresStore(self.url, max_size=4) if self.kind == "postgres" else SQLiteStore(self.path)
        self._stores.append(opened)
        return opened

    def close(self) -> None:
        for made in self._harnesses:
            made.close()
        for opened in self._stores:
            opened.close()
        if self._schema is not None:
            _POSTGRES_URLS.pop(mask_dsn(self.url), None)
            self._schema.drop()


def _made(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Ledger:
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else None
    return Ledger(kind, tmp_path, dsn)


@pytest.fixture(params=LEDGER_KINDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """A real ledger: in memory, a SQLite file in tmp_path, or a fresh PostgreSQL schema."""
    made = _made(request, request.param, tmp_path)
    yield made
    made.close()


@pytest.fixture
def sqlite_ledger(tmp_path: Path) -> Iterator[Ledger]:
    """A SQLite-file ledger only (for tests about a reopen from another connection)."""
    made = Ledger("sqlite", tmp_path)
    yield made
    made.close()


@pytest.fixture(params=DURABLE_KINDS)
def durable_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """A ledger other connections can open: a SQLite file or a fresh PostgreSQL schema."""
    made = _made(request, request.param, tmp_path)
    yield made
    made.close()


def run(coro: Awaitable[T]) -> T:
    """Run ``coro`` to completion in a fresh event loop (no pytest-asyncio)."""

    async def main() -> T:
        return await coro

    return asyncio.run(main())


# --- recording drivers -------------------------------------------------------------------------------


class Calls:
    """What a tool saw: its arguments and ToolContext, per call."""

    def __init__(self) -> None:
        self.args: list[dict[str, Any]] = []
        self.contexts: list[Any] = []

    def record(self, ctx: Any, **args: Any) -> None:
        self.args.append(args)
        self.contexts.append(ctx)

    def __len__(self) -> int:
        return len(self.contexts)


class TouchlessModel:
    """A model driver that fails the test if it is ever called (replay and fork must not call it)."""

    def __init__(self, name: str = "touchless") -> None:
        self._name = name
        self.calls = 0

    @property
    def name(self) -> str:
        return self._name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        raise AssertionError(f"the model was called during replay/fork: {request.effect_id}")


# --- reading events ----------------------------------------------------------------------------------


def types_of(events: list[Event]) -> list[str]:
    """The event types, in order."""
    return [e.type for e in events]


def of_type(events: list[Event], event_type: str) -> list[Event]:
    """The events of one type, in order."""
    return [e for e in events if e.type == event_type]


def lifecycle(events: list[Event], effect_id: str) -> list[Event]:
    """The lifecycle events of one effect, in order."""
    return [e for e in events if e.data.get("effect_id") == effect_id]


def effect_ids(events: list[Event], kind: str = "tool") -> list[str]:
    """Effect ids of ``kind`` (``tool`` or ``model``) in the order their intents were recorded."""
    return [e.data["effect_id"] for e in events if e.type == f"{kind}.requested"]


def event_dicts(events: list[Event]) -> list[dict[str, Any]]:
    """Every event as its full dict (id, hashes, data, meta): a byte-for-byte comparable snapshot."""
    return [e.to_dict() for e in events]


def thread_streams(store: Store) -> list[str]:
    """Names of every thread stream in the store."""
    return [info.stream for info in store.list_streams("thread/", limit=100_000)]


def ids_in(value: Any) -> set[str]:
    """Every id-like string (a jixu id, or one embedded as ``call_<id>_<n>``) anywhere inside ``value``."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            found |= ids_in(key) | ids_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            found |= ids_in(item)
    elif isinstance(value, str):
        if is_valid_id(value):
            found.add(value)
        found.update(part for part in value.replace(":", "_").split("_") if is_valid_id(part))
    return found


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the loop until ``predicate()`` holds (fails the test after ``timeout`` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


def assert_lifecycle_order(events: list[Event]) -> None:
    """For every effect: intent first, then each dispatch marker followed by its own receipt.

    A receipt without an attempt is a rejection before dispatch and only
    allowed for an effect that was never dispatched.
    """
    groups: dict[str, list[Event]] = {}
    for event in events:
        effect_id = event.data.get("effect_id")
        if event.type.rpartition(".")[2] in PHASES and isinstance(effect_id, str):
            groups.setdefault(effect_id, []).append(event)
    for effect_id, group in groups.items():
        phases = [e.type.rpartition(".")[2] for e in group]
        assert phases[0] == "requested", (effect_id, phases)
        assert phases.count("requested") == 1, (effect_id, phases)
        in_flight: int | None = None
        for event, phase in zip(group[1:], phases[1:], strict=True):
            if phase == "dispatched":
                assert in_flight is None, f"{effect_id}: dispatched again before a receipt: {phases}"
                in_flight = event.data["attempt"]
            elif phase in ("completed", "failed"):
                if "attempt" in event.data:
                    assert event.data["attempt"] == in_flight, (effect_id, phases)
                    in_flight = None
                else:
                    assert "dispatched" not in phases, (effect_id, phases)


# --- the one-answer check ----------------------------------------------------------------------------


def decision_dicts(state: State) -> dict[str, dict[str, Any]]:
    """A state's effect decisions as plain dicts."""
    return {effect_id: d.to_dict() for effect_id, d in state.effects.items()}


def _view(state: State) -> dict[str, Any]:
    """The parts of a state every path (online, reopen, replay) must agree on."""
    return {"status": state.status, "messages": list(state.messages), "turns": list(state.turns),
            "usage": state.usage, "waiting_on": list(state.waiting_on), "last_reply": state.last_reply,
            "seq": state.seq, "head_hash": state.head_hash, "parent": state.parent}


async def assert_same_answer(harness: Harness, thread: Thread, *, checkpoint: bool = True) -> State:
    """The resolver's answer online, after a reopen and after a full replay is one and the same.

    Online = the state ``thread.wait()`` returns; reopen = ``open_thread``
    on the same harness and on a fresh Harness (a new store connection for
    SQLite and PostgreSQL), both using the checkpoint the loop wrote; replay = the pure
    projection over every event; plus ``RecoveryResolver.analyze`` over every
    event. Decisions are compared as dicts, the flags too, and the thread views.
    """
    online = await thread.wait()  # the loop stops (and checkpoints) where the thread must stop
    events = await thread.events()
    direct = RecoveryResolver.analyze(events)
    fresh = Harness(harness.agent, reopen_target(harness.store), max_attempts=harness.max_attempts)
    try:
        reopened = [await harness.open_thread(thread.thread_id, resume=False),
                    await fresh.open_thread(thread.thread_id, resume=False)]
        replayed = await thread.replay()
        expected = decision_dicts(online)
        assert expected == {eid: d.to_dict() for eid, d in direct.decisions.items()}
        assert online.analysis.to_dict() == direct.to_dict()
        for other in reopened:
            if checkpoint:
                assert other.checkpoint_status == "used"
            assert decision_dicts(other.state()) == expected
            assert other.state().analysis.to_dict() == direct.to_dict()
            assert _view(other.state()) == _view(online)
        assert decision_dicts(replayed) == expected
        assert replayed.analysis.to_dict() == direct.to_dict()
        assert _view(replayed) == _view(online)
        # Reading never writes.
        assert event_dicts(await thread.events()) == event_dicts(events)
    finally:
        fresh.close()
    return online


def same_contract_tools(tools: list[Tool], hit: Callable[[str], None]) -> list[Tool]:
    """Tools with the names, schemas and semantics of ``tools`` whose functions fail if ever called."""
    from jixu.threads import tool as make_tool

    made: list[Tool] = []
    for original in tools:
        name = original.name

        def forbidden(*args: Any, _name: str = name, **kwargs: Any) -> Any:
            hit(_name)
            raise AssertionError(f"tool {_name} was called during replay/fork")

        replacement = _clone(original, forbidden, make_tool)
        assert replacement.contract() == original.contract()
        made.append(replacement)
    return made


def _clone(original: Tool, body: Callable[..., Any], make_tool: Callable[..., Any]) -> Tool:
    """A Tool whose signature is the original's (so the schemas match) but whose body is ``body``."""
    import functools
    import inspect

    fn = original.fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    made: Tool = make_tool(wrapper, name=original.name, semantics=original.semantics,
                           requires_approval=original.requires_approval, timeout=original.timeout)
    return made


__all__ = [
    "DURABLE_KINDS",
    "LEDGER_KINDS",
    "Calls",
    "Ledger",
    "TouchlessModel",
    "assert_lifecycle_order",
    "assert_same_answer",
    "decision_dicts",
    "effect_ids",
    "event_dicts",
    "ids_in",
    "lifecycle",
    "of_type",
    "reopen_target",
    "run",
    "same_contract_tools",
    "stream_of",
    "thread_streams",
    "types_of",
    "wait_for",
]

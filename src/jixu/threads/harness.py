"""The Harness: one Agent definition over one store, making and reopening threads."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import warnings
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from jixu.errors import InvalidInput, ThreadBusy
from jixu.kernel import DEFAULT_LEASE_TTL, check_backoff, tracing
from jixu.ledger import Fence, Store, open_store
from jixu.ledger.event import PreparedEvent
from jixu.threads.agent import Agent
from jixu.threads.home import OwnLoop, on_home_loop
from jixu.threads.log import THREAD_PREFIX, ThreadLog
from jixu.threads.revisions import revision
from jixu.threads.steps import DurableRun
from jixu.threads.thread import Thread
from jixu.threads.tools import stop_calls

if TYPE_CHECKING:
    from jixu.threads.sync import SyncHarness


class _Handles:
    """The :class:`Thread` handles a harness made, by thread id, held weakly (a handle nobody holds goes away).

    A worker holds hundreds of handles at once and looks up the ones of one thread at each turn's start:
    by id that costs O(handles of that thread), not O(every handle). A handle's end (in whatever thread
    frees it) only notes its key; the entries are changed under a lock, where the ended ones are dropped.
    """

    def __init__(self) -> None:
        self._by_id: dict[str, dict[int, weakref.ref[Thread]]] = {}
        self._ended: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def add(self, thread: Thread) -> None:
        thread_id, key, ended = thread.thread_id, id(thread), self._ended
        ref = weakref.ref(thread, lambda _ref: ended.append((thread_id, key)))
        with self._lock:
            self._drop_ended()
            self._by_id.setdefault(thread_id, {})[key] = ref

    def of(self, thread_id: str) -> list[Thread]:
        """The live handles of ``thread_id``."""
        with self._lock:
            self._drop_ended()
            refs = list(self._by_id.get(thread_id, {}).values())
        return [thread for ref in refs if (thread := ref()) is not None]

    def all(self) -> list[Thread]:
        """Every live handle."""
        with self._lock:
            self._drop_ended()
            refs = [ref for by_key in self._by_id.values() for ref in by_key.values()]
        return [thread for ref in refs if (thread := ref()) is not None]

    def _drop_ended(self) -> None:
        while self._ended:
            thread_id, key = self._ended.pop()
            refs = self._by_id.get(thread_id)
            ref = refs.get(key) if refs is not None else None
            if refs is not None and ref is not None and ref() is None:  # not a later handle with the same id
                del refs[key]
                if not refs:
                    del self._by_id[thread_id]


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """A thread as listed: id, head and when it started."""

    thread_id: str
    events: int
    head_hash: str
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {"thread_id": self.thread_id, "events": self.events, "head_hash": self.head_hash,
                "created_at": self.created_at}


class Harness:
    """Runs threads of one :class:`Agent` over a store (a Store, URL or path; default ``sqlite:///jixu.db``).

    ``max_attempts`` bounds automatic retries of retry-safe effects whose
    outcome is unknown (model calls, ``read_only`` and ``idempotent`` tools).

    Provider failures pause the turn: a rate limit or a transient failure is
    retried automatically after the recorded delay (the provider's
    retry-after, else ``retry_backoff * 2**n`` with jitter, capped at
    ``retry_backoff_cap``), at most 3 times, then stays paused; quota and
    authentication failures, and a retry-after longer than an hour
    (:data:`~jixu.kernel.loop.MAX_RETRY_AFTER`), wait for ``thread.resume()``.

    Turn ownership: the process running a turn holds a lease on it, renewed
    every ``lease_ttl / 3`` seconds against the store's clock, and every event
    of the turn is appended fenced by that claim. ``owner`` names this process
    (default: host, pid and a random suffix); a restarted process with the same ``owner``
    reclaims its own turns at once (so give each concurrently running process
    its own name; the default is unique to this Harness object). Another owner's turn whose lease expired is taken over
    automatically only with ``takeover="safe"`` and only when the resolver
    finds every open effect safe; otherwise it must be recovered explicitly
    (``ThreadLog.recover_turn`` / ``jixu turns recover``).

    Threads of this harness that run concurrently on one event loop share
    their commits (:class:`~jixu.kernel.Commits`: the one commit path, always
    on); a thread running alone commits at once. ``group_commits`` is
    accepted for compatibility and changes nothing.

    Event loops (decision 0036): a harness works on the loop that awaits it,
    and a loop's end (``asyncio.run`` returning) never cuts a call in flight:
    the call finishes, its receipt is recorded, and the turn waits, its lease
    given back, for the next ``wait()`` on any loop. :meth:`sync` gives the
    harness a loop of its own instead, for synchronous programs
    (:class:`~jixu.SyncHarness`).
    """

    def __init__(self, agent: Agent, store: Store | str | os.PathLike[str] | None = None, *,
                 max_attempts: int = 3, actor: str = "jixu", owner: str | None = None, lease_ttl: float = DEFAULT_LEASE_TTL,
                 takeover: Literal["never", "safe"] = "never", retry_backoff: float = 1.0,
                 retry_backoff_cap: float = 60.0, group_commits: bool | None = None) -> None:
        if not isinstance(agent, Agent):
            raise InvalidInput("Harness needs a jixu Agent", field="agent")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput("max_attempts must be an integer >= 1", field="max_attempts")
        if takeover not in ("never", "safe"):
            raise InvalidInput("takeover must be 'never' or 'safe'", field="takeover")
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float) or not 0.05 <= lease_ttl <= 3600:
            raise InvalidInput("lease_ttl must be between 0.05 and 3600 seconds", field="lease_ttl")
        owner = owner if owner is not None else f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        if not isinstance(owner, str) or not owner or len(owner) > 200 or not owner.isprintable():
            raise InvalidInput("owner must be 1-200 printable characters", field="owner")
        self.agent = agent
        self._owns_store = not isinstance(store, Store)
        self.store = open_store(store)
        self.max_attempts = max_attempts
        self.actor = actor
        self.owner = owner
        self.lease_ttl = float(lease_ttl)
        self.takeover = takeover
        self.retry_backoff = check_backoff("retry_backoff", retry_backoff)
        """Base delay of automatic retries after transient failures without a provider retry-after."""
        self.retry_backoff_cap = check_backoff("retry_backoff_cap", retry_backoff_cap)
        self.closing = False
        self.held_receipts: dict[str, tuple[Fence, tuple[PreparedEvent, ...]]] = {}
        """By thread: the receipts a lost turn claim (``fence``) could not record. Recorded when this process next
        claims the turn, if nobody claimed it in between (see ``Thread._claim_turn``); at most
        :data:`~jixu.threads.thread.HELD_RECEIPTS` threads' worth."""
        self._threads = _Handles()
        self._own_loop: OwnLoop | None = None
        """The loop of its own this harness's threads live on (see :meth:`sync`), if any."""
        self._sync: SyncHarness | None = None
        if group_commits is not None:
            if not isinstance(group_commits, bool):
                raise InvalidInput("group_commits must be True or False", field="group_commits")
            warnings.warn("Harness(group_commits=...) changes nothing: threads on one event loop always share "
                          "their commits", DeprecationWarning, stacklevel=2)

    @property
    def home_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this harness's threads live on, or ``None``: the loop of whoever awaits them.

        Set once :meth:`sync` gave the harness a loop of its own: a coroutine of the harness or of its threads
        awaited on another loop is then carried out there.
        """
        return None if self._own_loop is None else self._own_loop.loop

    def sync(self, *, drain_timeout: float = 10.0) -> SyncHarness:
        """This harness for synchronous code: its threads move to an event loop of its own, in a daemon thread
        (see :class:`~jixu.SyncHarness`; the same one on every call until it is closed). Call it before any
        of its threads runs."""
        from jixu.threads.sync import SyncHarness  # sync.py builds on this module

        if self._sync is None or self._sync.closed:
            self._sync = SyncHarness(self, drain_timeout=drain_timeout)
        return self._sync

    def _adopt(self, own: OwnLoop) -> None:
        """Live on ``own`` from now on (see :meth:`sync`)."""
        if any(thread.running for thread in self._threads.all()):
            raise ThreadBusy("a thread of this harness is running on a caller's event loop; give the harness a "
                             "loop of its own (sync()) before its threads run")
        self._own_loop = own

    @on_home_loop
    async def create_thread(self, *, metadata: dict[str, Any] | None = None) -> Thread:
        """A new, idle thread recorded under this harness's agent."""
        if self.closing:
            raise ThreadBusy("the harness is shutting down and admits no new threads")
        return self._track(Thread(self, ThreadLog.create(self.store, self.agent.describe(), metadata=metadata,
                                                         actor=self.actor)))

    @on_home_loop
    async def open_thread(self, thread_id: str, *, resume: bool = True) -> Thread:
        """Reopen a thread after a process boundary and, with ``resume``, continue its pending work.

        A thread this harness is working on in this process (its loop running, or its turn starting) is
        returned as it is: a second loop on the same turn would take the claim from the first mid-call.

        A thread recorded under another definition of this agent (same name) takes this one as its next
        revision (``agent.revised``, recorded before it acts); :class:`~jixu.errors.IncompatibleAgent` for
        another agent, or for a change that would alter an effect still open (its tool removed or changed
        while a call of it is not dispatched, unknown or parked), naming the effect and what to do.

        Loads the latest valid checkpoint plus the events after it, asks the
        resolver, then dispatches work that never left the process, retries
        retry-safe effects under their original identity, and waits (status
        ``waiting``) on unknown unsafe effects or parked calls. A corrupt thread
        opens for inspection but does not run.

        Opening trusts a sealed checkpoint for the events before it (so it
        costs O(events after it)); before anything would run, the whole
        history is verified (:meth:`ThreadLog.open_to_act`, O(history)), so a
        change made in the store before the checkpoint stops the thread
        (status ``corrupt``) with nothing appended and no driver called.
        """
        for known in self._threads.of(thread_id):
            if known.busy and not known.following:
                return known
        log = ThreadLog.load(self.store, thread_id, actor=self.actor)
        # Another agent, or a change of this one that would alter an effect still open, is refused here; a
        # compatible change is recorded as the thread's next revision before the thread acts (Thread._revise).
        revision(log.state, log.open_analysis(), self.agent, thread_id=thread_id)
        thread = self._track(Thread(self, log))
        status = log.status(max_steps=self.agent.max_steps, max_attempts=self.max_attempts,
                            context_budget=self.agent.context_budget, owner=self.owner)  # O(open effects)
        if tracing.tracer().enabled:
            open_effects = {effect_id: decision.state for effect_id, decision in log.open_analysis().decisions.items()
                            if decision.state in ("unknown", "not_dispatched", "parked")}
            if open_effects:  # what recovery found on reopening, before anything runs
                tracing.note("jixu.recovery", {"jixu.thread.id": thread_id, "jixu.thread.status": status,
                                               "jixu.effects": [f"{e}:{s}" for e, s in open_effects.items()]})
        # An automatic pause is continued too: whoever continues the turn waits out the rest of its delay.
        if resume and not self.closing and (status == "running" or thread._automatic()) \
                and thread.claim_problem() is None:
            log.establish()  # opening to act: the whole history first (a corrupt thread then stops here)
            if log.corruption() is None:
                thread.wait_in_background()
        return thread

    def durable(self, thread_id: str | None = None, *, name: str = "run", metadata: dict[str, Any] | None = None,
                approval_poll: float = 0.5, run_key: str | None = None) -> DurableRun:
        """A durable run of your own code on a thread (decision 0032)::

            async with harness.durable(thread_id, run_key="order-7") as run:   # thread_id None: a new thread
                receipt = await run.effect("charge", {"order": 7}, call=charge, probe=find_charge)

        Entering continues the thread's unfinished run named ``name`` (after a crash: its completed steps
        return their recorded results without running again) or starts a new one; see
        :class:`~jixu.threads.steps.DurableRun`. ``run_key`` (1-200 characters) names the run for good: once
        the run with that key has ended, entering with it again replays its record (:attr:`DurableRun.finished
        <jixu.threads.steps.DurableRun.finished>`) instead of starting a new run, so code that crashed after the
        run ended, before it learnt so, repeats nothing (decision 0051).
        """
        return DurableRun(self, thread_id, name=name, metadata=metadata, approval_poll=approval_poll, run_key=run_key)

    def working_on(self, thread: Thread) -> Thread | None:
        """Another handle of ``thread``'s thread that this harness is working with now (see :attr:`Thread.busy`).

        One loop per thread and harness: two loops of one owner would take the turn's claim from each other.
        """
        for other in self._threads.of(thread.thread_id):
            if other is not thread and other.busy and not other.following:
                return other
        return None

    def _track(self, thread: Thread) -> Thread:
        self._threads.add(thread)
        return thread

    @on_home_loop
    async def shutdown(self, drain_timeout: float = 10.0) -> None:
        """Stop admitting work, drain this process's running turns and durable runs (up to ``drain_timeout``),
        close the store.

        Each drained turn stays active with its lease released, so another
        process continues it; calls cut off at the timeout are recorded as
        having an unknown outcome. A durable run's next step is refused
        (:class:`~jixu.errors.ThreadBusy`), so its block stops with the run
        unfinished; a block still in a step at the timeout is cancelled, and its steps record their calls cut
        off. A call still running in a worker thread cannot be stopped: its run keeps its lease, and this waits,
        until the call returns (given back earlier, another process could act on the call beside it). Abrupt loss
        (SIGKILL) instead leaves the claims to expire for inspection and explicit recovery.
        """
        self.closing = True
        await asyncio.gather(*(thread.drain(drain_timeout) for thread in self._threads.all()))
        await stop_calls(self)  # calls gone on past their timeout, of threads no handle holds any more too
        self.close()

    @on_home_loop
    async def list_threads(self, *, limit: int = 1000, after: str = "") -> list[ThreadSummary]:
        """Threads in this store, oldest id first."""
        infos = self.store.list_streams(THREAD_PREFIX, after=THREAD_PREFIX + after if after else "", limit=limit)
        return [ThreadSummary(i.stream[len(THREAD_PREFIX):], i.head_seq, i.head_hash, i.created_at) for i in infos]

    def close(self) -> None:
        """Close the store if this harness opened it."""
        if self._owns_store:
            self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Leaving the block is :meth:`shutdown`: a turn still running is drained (left for the next process with
        its lease released), never cut off by the store closing under it."""
        await self.shutdown()


__all__ = ["Harness", "ThreadSummary"]

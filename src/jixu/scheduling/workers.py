"""Worker processes: claim queued threads from the ledger, run their turns, finish the claims.

A :class:`Worker` is one process's loop: a claim (fair across projects,
bounded globally and per project: :func:`jixu.scheduling.queue.claim`, atomic in the store) -> open the thread
with a :class:`~jixu.threads.Harness` whose owner is the worker's stable name
-> run until the turn stops -> ``finish_work``. The work claim is renewed
every ``lease_ttl / 3`` seconds while the item runs (the Harness renews the
turn's lease likewise); both expire by the store's clock. The turn lease, not
the work claim, is what fences the thread's events: even two workers holding
the same item could not both commit a turn.

A :class:`WorkerPool` starts N such processes (``python -c`` children, each
with its own name ``<prefix>-<i>``) and stops them gracefully: SIGTERM or
SIGINT makes each stop claiming, drain its running turn within the drain
timeout (``Harness.shutdown``), put unfinished items back in the queue and
exit 0. Each child also watches the pool's process (a pipe only that process
holds open): when it ends, however abruptly, its children stop the same way
instead of running on as orphans. An abruptly killed worker leaves its claims to expire; a turn it owned
is taken over automatically only with ``takeover="safe"`` when the resolver
finds every open effect safe, otherwise it waits for ``jixu turns recover``.

The agent comes from a factory given as ``MODULE:FACTORY``: a zero-argument
callable returning a :class:`~jixu.Agent`, importable in every worker process.

Runs (keys ``run/<id>``, put in the queue by :func:`~jixu.scheduling.submit_run`) and execution requests
(keys ``request/<id>``, put there when admitted)
are executed by workers given a providers factory (``MODULE:FACTORY``
returning ``dict[str, Provider]``, as for ``jixu runs``): :meth:`Runs.execute
<jixu.runs.Runs.execute>` under the worker's owner name. An automatic pause
(rate limit, transient failure) is never waited out holding the slot: the item
goes back in the queue until the pause's recorded ``resume_at``. A run that
needs an operator (paused for one, interrupted, needs reconciliation) is
finished with an ``operator`` report naming the ``jixu runs …`` command. A
worker without providers leaves run keys in the queue; one without an agent
leaves thread keys likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import IO, Any, Literal, TypeVar

from jixu.errors import (
    AgentStillRunning,
    FencingError,
    IncompatibleAgent,
    InvalidInput,
    JixuError,
    OwnershipLost,
    ProjectCorrupt,
    ProviderMismatch,
    RequestNotFound,
    RequestOwned,
    RunCorrupt,
    RunNotFound,
    RunOwned,
    RunStateError,
    StoreError,
    ThreadCorrupt,
    ThreadNotFound,
    TurnOwned,
    UnknownProvider,
)
from jixu.exports import load_object
from jixu.kernel import DEFAULT_LEASE_TTL
from jixu.kernel.batched import work_renewals
from jixu.kernel.effects import CUT_OFF
from jixu.kernel.ownership import stop_descendants
from jixu.ledger import Store, open_store
from jixu.ledger.encoding import JSONObject
from jixu.ledger.store import WorkClaim, check_owner
from jixu.ledger.urls import is_memory_url
from jixu.runs.engine import Runs
from jixu.runs.model import RunState, run_id_of
from jixu.runs.operations import load_publishers, load_remotes
from jixu.runs.providers import Provider
from jixu.runs.requests import request_id_of
from jixu.scheduling.queue import check_limits, claim_some
from jixu.scheduling.work import repair_queue, thread_id_of
from jixu.threads.agent import Agent
from jixu.threads.harness import Harness
from jixu.threads.tools import CallTrackingExecutor, give_back_held_claims

_T = TypeVar("_T")
UNBOUNDED = 1_000_000
"""The global limit when none is given: each worker process still runs one item at a time."""
CONFIG_ENV = "JIXU_WORKER_CONFIG"
"""The environment variable a pool hands each child its configuration in (kept out of ``ps``)."""
EXIT_OK, EXIT_FAILED, EXIT_STORE, EXIT_INVALID_INPUT = 0, 1, 5, 6
"""Exit codes of a worker process (the same meanings as the ``jixu`` CLI's)."""
PARENT_FD_ENV = "JIXU_WORKER_PARENT_FD"
"""The environment variable naming a pool child's lifeline: the read end of a pipe whose write end only the
pool's process holds, so end of file there means that process is gone (even SIGKILLed) and the child drains."""
_CHILD_CODE = "from jixu.scheduling.workers import child_main; child_main()"
DEFAULT_WORKSPACE_ROOT = "jixu-workspaces"
"""Where a worker makes new runs' workspaces when none is configured (as ``jixu runs``)."""

Report = Callable[[str, str], None]
"""``report(kind, message)``: how a worker says what it does (kinds: ``start``, ``claim``, ``finish``,
``requeue``, ``operator``, ``lost``, ``error``, ``stop``)."""


def load_agent_factory(spec: str) -> Callable[[], Agent]:
    """The factory ``MODULE:FACTORY`` names (e.g. ``myapp.agents:support_agent``; the current directory is
    importable); typed error if unusable."""
    target = load_object(spec, "agent", "myapp.agents:make_agent")
    if not callable(target):
        raise InvalidInput(f"agent {spec!r} is not callable; give a zero-argument factory", field="agent")
    factory: Callable[[], Agent] = target
    return factory


def make_agent(spec: str) -> Agent:
    """Call the factory ``spec`` names and check that it returned an Agent."""
    factory = load_agent_factory(spec)
    try:
        agent = factory()
    except JixuError:
        raise
    except Exception as error:
        raise InvalidInput(f"agent factory {spec!r} failed: {type(error).__name__}: {error}",
                           field="agent") from error
    if not isinstance(agent, Agent):
        raise InvalidInput(f"agent factory {spec!r} returned {type(agent).__name__}, not a jixu Agent",
                           field="agent")
    return agent


def factory_spec(factory: str | Callable[[], Agent]) -> str:
    """``MODULE:FACTORY`` for a factory given as such a string or as an importable module-level callable."""
    if isinstance(factory, str):
        load_agent_factory(factory)
        return factory
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if not callable(factory) or not module or not name or module == "__main__" or "<" in name:
        raise InvalidInput("the agent factory must be MODULE:FACTORY or a module-level function importable by "
                           "worker processes (not defined in __main__ or inside a function)", field="agent")
    return f"{module}:{name}"


MAX_CONCURRENCY = 10_000
"""The most work items one worker runs at once."""
DEFAULT_CONCURRENCY = 100
"""Work items ``jixu worker`` and ``jixu serve`` run at once per process unless told otherwise: turns waiting on
a model or a tool cost little, and claims stop early anyway when the event loop falls behind (``max_loop_lag``)."""
DEFAULT_TOOL_THREADS = 64
"""Threads a worker process runs plain ``def`` tools (and other blocking calls) in, at most, at once."""
LAG_FRACTION = 0.1
"""The default ``max_loop_lag``: this fraction of the heartbeat interval (``lease_ttl / 3``), at least
:data:`MIN_LOOP_LAG`."""
MIN_LOOP_LAG = 0.02
"""The smallest default ``max_loop_lag`` (a very short lease must not turn an event loop's ordinary jitter into
back-pressure)."""


def default_owner() -> str:
    """A worker name stable across restarts on this machine: ``worker@<hostname>``."""
    return f"worker@{socket.gethostname()}"


def _number(value: object, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidInput(f"{name} {value!r} must be a number between {low} and {high}", field=name)
    return float(value)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything one worker process needs (JSON-serialisable, so a pool can hand it to a child)."""

    store_url: str
    agent: str | None = None
    """``MODULE:FACTORY`` of the agent whose threads this worker runs (None: leave thread keys queued)."""
    owner: str = field(default_factory=default_owner)
    lease_ttl: float = DEFAULT_LEASE_TTL
    global_limit: int | None = None
    project_limits: dict[str, int] = field(default_factory=dict)
    default_project_limit: int | None = None
    takeover: Literal["never", "safe"] = "never"
    poll_interval: float = 0.5
    drain_timeout: float = 10.0
    exit_when_idle: bool = False
    """Exit 0 once nothing is pending or claimed (batch runs, benchmarks)."""
    quiet: bool = False
    """Report only start, stop and problems, not every item."""
    concurrency: int = 1
    """Work items this worker runs at once on its event loop (turns waiting on a model or a tool cost little;
    their commits are shared). ``jixu worker`` and ``jixu serve`` default to :data:`DEFAULT_CONCURRENCY`."""
    max_loop_lag: float | None = None
    """Back-pressure: no new item is claimed while the event loop runs this many seconds late (None: a tenth
    of the heartbeat interval, ``lease_ttl / 30``, at least 20 ms), so the heartbeats of the items in hand stay
    on time."""
    tool_threads: int = DEFAULT_TOOL_THREADS
    """The bounded thread pool that plain ``def`` tools run in, when the worker owns its event loop
    (:func:`serve`, ``jixu serve``): a blocking tool holds one of these threads, never the loop or the commits."""
    providers: str | None = None
    """``MODULE:FACTORY`` of the providers this worker executes runs with (None: leave run keys queued)."""
    workspace_root: str | None = None
    """Where new runs' workspaces go (default ``./jixu-workspaces``)."""
    publishers: str | None = None
    """``MODULE:FACTORY`` of the publishers for publication requests (None: only ``git``)."""
    remotes: str | None = None
    """``MODULE:FACTORY`` of the deploy / rollback / knowledge-write providers (None: none; such requests stay
    queued for a worker that has them)."""

    def __post_init__(self) -> None:
        if not isinstance(self.store_url, str) or not self.store_url:
            raise InvalidInput("store must be a store URL or path", field="store")
        for name in ("agent", "providers", "workspace_root", "publishers", "remotes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InvalidInput(f"{name} must be a non-empty string or None", field=name)
        if self.agent is None and self.providers is None:
            raise InvalidInput("a worker needs an agent (--agent MODULE:FACTORY, to run threads), providers "
                               "(--providers MODULE:FACTORY, to execute runs) or both", field="agent")
        check_owner(self.owner)
        _number(self.lease_ttl, "lease_ttl", 0.05, 3600)
        _number(self.poll_interval, "poll_interval", 0.001, 60)
        _number(self.drain_timeout, "drain_timeout", 0, 3600)
        if self.max_loop_lag is not None:
            _number(self.max_loop_lag, "max_loop_lag", 0.001, 3600)
        if isinstance(self.tool_threads, bool) or not isinstance(self.tool_threads, int) \
                or not 1 <= self.tool_threads <= 1024:
            raise InvalidInput("tool_threads must be an integer between 1 and 1024", field="tool_threads")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                or not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise InvalidInput(f"concurrency must be an integer between 1 and {MAX_CONCURRENCY}", field="concurrency")
        check_limits(UNBOUNDED if self.global_limit is None else self.global_limit, self.project_limits,
                     self.default_project_limit)
        if self.takeover not in ("never", "safe"):
            raise InvalidInput("takeover must be 'never' or 'safe'", field="takeover")

    @property
    def loop_lag_limit(self) -> float:
        """Seconds of event-loop lag above which this worker claims nothing new."""
        if self.max_loop_lag is not None:
            return float(self.max_loop_lag)
        return max(MIN_LOOP_LAG, LAG_FRACTION * self.lease_ttl / 3)

    @property
    def limits(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~jixu.scheduling.queue.claim`."""
        return {"global_limit": UNBOUNDED if self.global_limit is None else self.global_limit,
                "project_limits": dict(self.project_limits), "default_project_limit": self.default_project_limit}

    def to_json(self) -> str:
        """The configuration as JSON text."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """A configuration from :meth:`to_json` text (typed error when malformed)."""
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as error:
            raise InvalidInput(f"malformed worker configuration: {error}", field="config") from error


@dataclass
class WorkerStats:
    """What one worker did."""

    claimed: int = 0
    finished: int = 0
    requeued: int = 0
    lost: int = 0
    errors: int = 0
    held_back: int = 0
    """Times a claim was put off because the event loop ran late (back-pressure)."""
    max_in_flight: int = 0
    """The most items this worker ran at once."""
    max_loop_lag: float = 0.0
    """The largest event-loop lag measured, in seconds."""

    def to_dict(self) -> dict[str, int | float]:
        """A JSON-ready dict."""
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}


@dataclass(frozen=True)
class _Outcome:
    requeue: bool
    note: str
    delay: float = 0.0
    kind: str = "finish"


class _CutOff(Exception):
    """A run or execution request that the drain cancelled at its deadline (see ``Worker._executed``)."""


def _automatic_pause(state: RunState) -> JSONObject | None:
    """The run's open pause when it resumes by itself (automatic, with a ``resume_at``), else None."""
    if state.status != "paused" or not state.pauses:
        return None
    pause = state.pauses[-1]
    if pause.get("automatic") and isinstance(pause.get("resume_at"), int | float):
        return pause
    return None


def print_report(owner: str) -> Report:
    """A reporter printing ``HH:MM:SS owner message`` lines on stdout (flushed)."""

    def report(kind: str, message: str) -> None:
        # Saying what it does never stops a worker: a pool child whose parent was killed may have lost the
        # reader of its stdout, and it must still drain. One write per line: a pool's children share one
        # stdout, and ``print`` writes its text and its newline apart when Python runs unbuffered.
        with contextlib.suppress(OSError):
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} {owner} {message}\n")
            sys.stdout.flush()

    return report


CLAIMS_AT_ONCE = 16
"""The most free slots a worker fills with one claim transaction (a burst of queued turns starts with one
commit per this many, and workers sharing a store still take turns)."""


class Worker:
    """One worker loop over a store (see the module docstring). Run it with ``await worker.run()``."""

    def __init__(self, agent: Agent | None, store: Store, config: WorkerConfig, *, report: Report | None = None,
                 providers: Mapping[str, Provider] | None = None) -> None:
        if agent is not None and not isinstance(agent, Agent):
            raise InvalidInput("a worker needs a jixu Agent", field="agent")
        if agent is None and providers is None:
            raise InvalidInput("a worker needs an agent (threads), providers (runs) or both", field="agent")
        self.config = config
        self.store = store
        self.harness: Harness | None = None
        if agent is not None:
            self.harness = Harness(agent, store, owner=config.owner, lease_ttl=config.lease_ttl,
                                   takeover=config.takeover)
        self.runs: Runs | None = None
        if providers is not None:
            self.runs = Runs(store, config.workspace_root or DEFAULT_WORKSPACE_ROOT, providers,
                             owner=config.owner, lease_ttl=config.lease_ttl, wait_automatic_pauses=False,
                             publishers=load_publishers(config.publishers),
                             remotes=load_remotes(config.remotes) if config.remotes else None)
        self._executing: set[asyncio.Task[Any]] = set()
        """Runs and execution requests being carried out by this worker now (drained on shutdown)."""
        self.stats = WorkerStats()
        self._report = report or print_report(config.owner)
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._nudged: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        """Set when an item in flight ends, on a stop and on a nudge: what the claim loop waits for."""
        self._ended: list[asyncio.Task[None]] = []
        """Items that ended since the claim loop last looked (their errors are raised there)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_reason = ""
        self._lag = 0.0
        self._lag_measured = False
        self._queue_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="jixu-queue")

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called: no new work is claimed."""
        return self._stopping

    def report(self, kind: str, message: str) -> None:
        """Say what the worker does (per-item lines only unless ``quiet``)."""
        if self.config.quiet and kind in ("claim", "finish", "requeue"):
            return
        self._report(kind, message)

    def nudge(self) -> None:
        """Look at the queue now instead of at the next poll (something was just queued). Safe from any
        thread; does nothing while the worker is not running, and nudges that come together count once."""
        loop, nudged = self._loop, self._nudged
        if loop is None or nudged is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the worker is gone
            loop.call_soon_threadsafe(self._nudge_now)

    def _nudge_now(self) -> None:
        if self._nudged is not None and self._wake is not None:
            self._nudged.set()
            self._wake.set()

    def stop(self, reason: str = "asked to stop") -> None:
        """Stop admitting work; the item in hand is drained within the drain timeout (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        self._stop_reason = reason
        if self._stop_event is not None:
            self._stop_event.set()
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> WorkerStats:
        """Claim and run items until :meth:`stop` (or, with ``exit_when_idle``, until the queue is empty)."""
        config = self.config
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        self._nudged = asyncio.Event()
        self._wake = asyncio.Event()
        self._ended = []
        self._loop = asyncio.get_running_loop()
        limits = config.limits
        default = limits["default_project_limit"]
        per_project = ", ".join(f"{p}={n}" for p, n in sorted(limits["project_limits"].items()))
        what = ", ".join(([f"agent {config.agent}"] if self.harness is not None else [])
                         + ([f"providers {config.providers}"] if self.runs is not None else []))
        self.report("start", f"started on {self.store.url} (durability {self.store.durability or 'unknown'}): "
                             f"{what}, lease {config.lease_ttl:g}s, "
                             f"global limit {'none' if config.global_limit is None else config.global_limit}, "
                             f"project limits {per_project or '-'} (others: "
                             f"{'global' if default is None else default}), takeover {config.takeover}"
                             + ("" if os.getpgrp() == os.getpid() else
                                "; it does not lead its process group, so what its tools start is not followed "
                                "once it died (decision 0056): start it with setsid, or with --processes N"))
        self._queue_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="jixu-queue")
        lag_limit = config.loop_lag_limit
        look_every = max(0.005, min(0.05, lag_limit / 2))
        monitor = asyncio.create_task(self._watch_loop(look_every), name="jixu-loop-lag")
        repair = asyncio.create_task(self._repair_queue(), name="jixu-repair-queue")
        in_flight: set[asyncio.Task[None]] = set()

        def one_ended(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            self._ended.append(task)
            assert self._wake is not None
            self._wake.set()

        try:
            while not self._stopping:
                if len(in_flight) >= config.concurrency:
                    await self._until_one_ends(None)
                    continue
                if self._lag > lag_limit:
                    # Back-pressure: the loop runs late, so the heartbeats of the items in hand would too. Claim
                    # nothing new until it has caught up (the lag is measured again every few tens of ms).
                    self.stats.held_back += 1
                    await self._until_one_ends(look_every)
                    continue
                try:
                    # In a thread: a claim is a durable write (an fsync on SQLite), which would hold the loop
                    # and every turn on it. Up to CLAIMS_AT_ONCE free slots are filled with one commit, but only
                    # while the loop is known to keep up (measured, and under half its limit): else one.
                    keeping_up = self._lag_measured and self._lag <= lag_limit / 2
                    free = min(config.concurrency - len(in_flight), CLAIMS_AT_ONCE) if keeping_up else 1
                    batch = await self._queue(claim_some, self.store, config.owner, config.lease_ttl, free,
                                              **limits)
                    idle = (not batch and not in_flight and config.exit_when_idle
                            and await self._queue(self._queue_empty))
                except StoreError as error:  # e.g. the database restarting: keep trying, slowly
                    self.stats.errors += 1
                    self.report("error", f"could not claim work ({error.message}); retrying")
                    await self._pause(max(1.0, min(5.0, config.poll_interval * 10)))
                    continue
                if not batch:
                    if idle:
                        self.report("stop", "the queue is empty; exiting")
                        break
                    await self._until_one_ends(config.poll_interval, nudgeable=True)
                    continue
                for claimed in batch:
                    self.stats.claimed += 1
                    self.report("claim", f"claimed {claimed.key} (project {claimed.group}, epoch {claimed.epoch}, "
                                         f"claim #{claimed.number})")
                    task = asyncio.create_task(self._process(claimed), name=f"jixu-work-{claimed.key}")
                    in_flight.add(task)
                    task.add_done_callback(one_ended)
                self.stats.max_in_flight = max(self.stats.max_in_flight, len(in_flight))
            if self._stopping:
                await self._drain(busy=len(in_flight))
            if in_flight:
                await asyncio.gather(*in_flight)
            self._raise_ended()
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            self._queue_pool.shutdown(wait=False)
        if not repair.done():
            repair.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await repair
        if self._stopping:
            self.report("stop", f"stopped ({self._stop_reason}): {json.dumps(self.stats.to_dict())}")
        return self.stats

    async def _queue(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` (a work-queue call on the store) in this worker's queue threads."""
        return await asyncio.get_running_loop().run_in_executor(self._queue_pool, partial(fn, *args, **kwargs))

    async def _watch_loop(self, interval: float) -> None:
        """Measure how late the event loop wakes a sleeper (its lag), every ``interval`` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            self._lag = max(0.0, loop.time() - before - interval)
            self._lag_measured = True
            self.stats.max_loop_lag = max(self.stats.max_loop_lag, self._lag)

    @property
    def loop_lag(self) -> float:
        """The event loop's lag as last measured, in seconds (claims stop above ``config.loop_lag_limit``)."""
        return self._lag

    async def _repair_queue(self) -> None:
        """Put back in the queue what older versions left without a work item (see repair_queue): queued turns
        when this worker runs threads, execution requests when it runs runs."""
        try:
            repaired = await repair_queue(self.store, threads=self.harness is not None, requests=self.runs is not None)
        except JixuError as error:
            self.report("error", f"could not look for queued work without a work item ({error.message})")
            return
        if repaired:
            self.report("repair", f"enqueued {len(repaired)} queued item(s) that had no work item: "
                                  f"{', '.join(repaired[:5])}{' …' if len(repaired) > 5 else ''}")

    async def _until_one_ends(self, timeout: float | None, *, nudgeable: bool = False) -> None:
        """Wait until an item in flight ends, ``timeout`` passes, a stop, or (when ``nudgeable``) a :meth:`nudge`,
        which is then cleared: one that comes later wakes the next wait.

        Each item's end sets one event (see :meth:`run`), so a wait costs the same with hundreds of items in
        flight as with one (waiting on every item's task would cost O(items) at each wake).
        """
        wake, nudged = self._wake, self._nudged
        assert wake is not None and nudged is not None
        wake.clear()  # then look: whatever sets it from here on wakes the wait below
        if not (self._ended or self._stopping or (nudgeable and nudged.is_set())):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await wake.wait()
        if nudgeable:
            nudged.clear()  # before the next claim: a nudge for work queued after it sets it again
        self._raise_ended()

    def _raise_ended(self) -> None:
        """Look at the items that ended: ``_process`` handles its own errors, anything else is a bug worth seeing."""
        ended, self._ended = self._ended, []
        for task in ended:
            task.result()

    async def _pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking at once when the worker is asked to stop."""
        assert self._stop_event is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)

    def _queue_empty(self) -> bool:
        return not any(self.store.list_work(state=state) for state in ("pending", "claimed", "expired"))

    async def _drain(self, *, busy: int) -> None:
        """Let the running turns and runs stop at their next step, cutting them off before the drain timeout."""
        timeout = self.config.drain_timeout
        budget = max(0.0, timeout - min(1.0, 0.25 * timeout))  # leave time to requeue and exit
        executing = {task for task in self._executing if not task.done()}

        async def runs() -> None:
            if not executing:
                return
            self.report("stop", f"draining {len(executing)} run(s) and execution request(s) in flight "
                                f"({self._stop_reason}) for up to {budget:.1f}s")
            await asyncio.wait(executing, timeout=budget)
            for task in executing:
                if not task.done():
                    task.cancel()  # the item's task sees the cancellation and requeues the item

        async def turns() -> None:
            if self.harness is not None and not self.harness.closing:
                if busy and not executing:
                    what = "the turn" if busy == 1 else f"the {busy} turns"
                    self.report("stop", f"draining {what} in flight ({self._stop_reason}) for up to {budget:.1f}s")
                await self.harness.shutdown(budget)

        await asyncio.gather(runs(), turns())

    async def _process(self, claim: WorkClaim) -> None:
        heartbeat = asyncio.create_task(self._heartbeat(claim))
        try:
            outcome = await self._run_item(claim)
        except Exception as error:  # a bug or an unusable store: put the item back, slowly
            self.stats.errors += 1
            outcome = _Outcome(True, f"error {type(error).__name__}: {error}", self.config.lease_ttl, "error")
        finally:
            heartbeat.cancel()
        try:
            await self._queue(self.store.finish_work, claim, requeue=outcome.requeue, delay=outcome.delay)
        except FencingError as error:
            self.stats.lost += 1
            self.report("lost", f"{claim.key}: {outcome.note}; the work claim was lost meanwhile "
                                f"({error.message})")
            return
        except JixuError as error:
            self.stats.errors += 1
            self.report("error", f"{claim.key}: could not finish the claim ({error.message}); it expires")
            return
        if outcome.requeue:
            self.stats.requeued += 1
        else:
            self.stats.finished += 1
        self.report(outcome.kind, f"{claim.key}: {outcome.note}" + (" (requeued)" if outcome.requeue else ""))

    async def _heartbeat(self, claim: WorkClaim) -> None:
        """Renew the work claim every ``lease_ttl / 3`` against the store's clock until cancelled."""
        ttl = self.config.lease_ttl
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                claim = await work_renewals(self.store).renew(claim, ttl)  # with the others due, in one call
            except FencingError as error:
                self.report("lost", f"{claim.key}: lost the work claim ({error.message}); the turn's own lease "
                                    "still fences its events")
                return
            except JixuError as error:
                self.report("error", f"{claim.key}: could not renew the work claim ({error.message})")

    @property
    def _look_again(self) -> float:
        """The delay of an item left for someone else (a worker of its kind, an operator, a process that still holds
        its claim): a lease's time, 5 s at least, so no worker spins on it."""
        return max(self.config.lease_ttl, LOOK_AGAIN_S)

    async def _run_item(self, claim: WorkClaim) -> _Outcome:
        run_id = run_id_of(claim.key)
        if run_id is not None and self.runs is not None:
            return await self._run_run(run_id, self.runs)
        request_id = request_id_of(claim.key)
        if request_id is not None and self.runs is not None:
            return await self._run_request(request_id, self.runs)
        thread_id = thread_id_of(claim.key)
        if thread_id is None or self.harness is None:
            # Work this worker cannot do (a run without providers, a thread without an agent, an unknown
            # kind): leave it in the queue for a worker of its kind, without spinning on it.
            what = ("not a thread" if self.runs is None else "not a run" if self.harness is None
                    else "unknown work")
            return _Outcome(True, f"{what}: left in the queue for a worker of its kind",
                            self._look_again, "error")
        try:
            thread = await self.harness.open_thread(thread_id, resume=False)
        except ThreadNotFound:
            return _Outcome(False, "no such thread", kind="error")
        except IncompatibleAgent as error:
            # Meant for workers of another agent: leave it for them, without spinning on it.
            return _Outcome(True, error.message, self._look_again, "error")
        problem = thread.claim_problem()
        if problem is not None:
            ownership = thread.log.ownership() or {}
            if ownership.get("owner") and not ownership.get("expired") and not ownership.get("released"):
                wait = max(self.config.poll_interval, float(ownership["expires_at"]) - float(ownership["store_now"]))
                return _Outcome(True, f"another process owns the turn: {problem}", min(wait, self.config.lease_ttl),
                                "requeue")
            # Looked at again after a lease's time (5 s at least), not finished: a claim that lapsed while its
            # holder still runs here ends when that holder gives it back or dies, and an operator's recovery puts
            # the turn back too. Finished, the turn was left running for nobody once its holder let go (an audit: a
            # PostgreSQL outage of 45 s left a thread "running" for good).
            again = self._look_again
            return _Outcome(True, f"needs an operator: {problem} (looked at again in {again:.0f}s)", again,
                            "operator")
        if self._stopping:  # stopped before the turn started here: leave it to the next worker
            return _Outcome(True, "not started: the worker is stopping", kind="requeue")
        try:
            state = await thread.wait()
        except TurnOwned as error:  # someone claimed the turn between our look and our claim
            return _Outcome(True, f"turn taken meanwhile: {error.message}", self.config.poll_interval, "requeue")
        except OwnershipLost as error:
            # The turn's lease lapsed (this loop was held past it) or was taken over. Back in the queue, the item
            # is claimed again: the turn continues under a new claim, the resolver deciding about the call that
            # was in flight, or waits for its new owner. Finished, it would leave the turn running for nobody.
            return _Outcome(True, f"OwnershipLost: {error.message}", self.config.poll_interval, "lost")
        except ThreadCorrupt as error:
            return _Outcome(False, f"corrupt: {error.message}", kind="operator")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this worker itself is being cancelled
            state = thread.state()  # the turn was cut off by the drain timeout
        thread.log.sync()
        if self._stopping and thread.log.state.active_turn() is not None:
            shown = thread.state()  # it said "continues elsewhere" of a turn that now waits for an operator
            what = "the turn continues at the next claim" if shown.status == "running" else (
                f"the turn is {shown.status}: {shown.reason}")
            return _Outcome(True, f"drained at seq {thread.log.state.seq}; {what}", kind="requeue")
        state = thread.state()
        if state.status == "running":  # its loop stopped short of the turn's end: finished, nobody would go on
            return _Outcome(True, f"stopped at seq {state.seq} with the turn unfinished; it continues at the next "
                                  "claim", max(self.config.poll_interval, self.config.lease_ttl / 3), "requeue")
        detail = state.reason or (f"reply {state.last_reply!r}"[:120] if state.last_reply is not None else "")
        kind = "operator" if state.status in ("waiting", "corrupt", "paused") else "finish"
        return _Outcome(False, f"{state.status}" + (f": {detail}" if detail else ""), kind=kind)

    async def _run_run(self, run_id: str, runs: Runs) -> _Outcome:
        """Execute one run to its next stop and say what becomes of its work item."""
        ttl, poll = self.config.lease_ttl, self.config.poll_interval
        try:
            state = await runs.state(run_id)
        except RunNotFound:
            return _Outcome(False, "no such run", kind="error")
        pause = _automatic_pause(state)
        if pause is not None and float(pause["resume_at"]) > self.store.now():
            return self._until_resume(pause)  # claimed before its pause ends: nothing to do yet
        if state.status == "running":
            return self._owned(state)
        if self._stopping:
            return _Outcome(True, "not started: the worker is stopping", kind="requeue")
        try:
            state = await self._executed(runs.execute(run_id), f"jixu-run-{run_id}")
        except RunOwned as error:
            return _Outcome(True, f"{error.message}", min(ttl, max(poll, ttl / 3)), "requeue")
        except ProjectCorrupt as error:  # nothing acts under a project that does not verify: an operator's
            return _Outcome(False, error.message, kind="operator")
        except RunStateError as error:  # a cancellation of the run is in doubt: its own request settles it first
            return _Outcome(True, error.message, self._look_again, "requeue")
        except OwnershipLost as error:  # as for a turn: the next claim finds what the run needs
            return _Outcome(True, f"OwnershipLost: {error.message}", poll, "lost")
        except AgentStillRunning as error:  # an earlier attempt's agent outlived its worker: an operator decides
            return _Outcome(False, error.message, kind="operator")
        except (UnknownProvider, ProviderMismatch) as error:
            # Meant for workers configured with another provider: leave it for them, without spinning on it.
            return _Outcome(True, error.message, self._look_again, "error")
        except _CutOff:
            return _Outcome(True, "cut off by the drain; requeued: the next worker continues it, or shows it "
                                  "interrupted for an operator if a task it cut off may have run", kind="requeue")
        pause = _automatic_pause(state)
        if pause is not None:
            return self._until_resume(pause)
        if state.status in ("queued", "running"):
            return self._owned(state)
        if state.status in ("succeeded", "failed", "cancelled"):
            return _Outcome(False, state.status + (f": {state.reason}" if state.reason else ""))
        return _Outcome(False, f"{state.status}" + (f": {state.reason}" if state.reason else "")
                        + f"; operator needed: {self._operator_commands(state)}", kind="operator")

    async def _run_request(self, request_id: str, runs: Runs) -> _Outcome:
        """Carry out one execution request (publication, cancellation) and say what becomes of its work item."""
        if self._stopping:
            return _Outcome(True, "not started: the worker is stopping", kind="requeue")
        try:
            view = await self._executed(runs.execute_request(request_id), f"jixu-request-{request_id}")
        except _CutOff:
            # What it had dispatched without a receipt is unknown: the next claim finds it needing reconciliation.
            return _Outcome(True, "cut off by the drain; the request continues elsewhere", kind="requeue")
        except RequestNotFound as error:
            return _Outcome(False, error.message, kind="error")
        except RunCorrupt as error:  # nothing acts on its run's journal: an operator's, not the queue's, to retry
            return _Outcome(False, error.message, kind="operator")
        except RequestOwned as error:  # another process carries it out: look again once its claim may be gone
            return _Outcome(True, error.message, max(self.config.poll_interval, self.config.lease_ttl / 3),
                            "requeue")
        except OwnershipLost as error:  # its claim lapsed mid-call: the next claim finds it needing reconciliation
            return _Outcome(True, error.message, self.config.poll_interval, "lost")
        except UnknownProvider as error:
            # Meant for workers configured with another publisher: leave it for them, without spinning on it.
            return _Outcome(True, error.message, self._look_again, "error")
        kind = "operator" if view.status in ("needs_reconciliation", "corrupt") else "finish"
        return _Outcome(False, f"{view.kind} request {view.status}: {view.reason}", kind=kind)

    async def _executed(self, work: Coroutine[Any, Any, _T], name: str) -> _T:
        """``await work``, as a task the drain reaches (it waits for the task within its budget, then cancels it);
        :class:`_CutOff` when the drain cancelled it."""
        executing = asyncio.create_task(work, name=name)
        self._executing.add(executing)
        try:
            return await executing
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this worker itself is being cancelled
            raise _CutOff from None
        finally:
            self._executing.discard(executing)

    def _until_resume(self, pause: JSONObject) -> _Outcome:
        delay = max(0.0, float(pause["resume_at"]) - self.store.now())
        return _Outcome(True, f"paused ({pause.get('reason')}): resumes automatically in {delay:.2f}s", delay,
                        "requeue")

    def _owned(self, state: RunState) -> _Outcome:
        """Another process holds the run (or it is still queued): look again when its lease may have expired."""
        ttl, poll = self.config.lease_ttl, self.config.poll_interval
        owner = state.owner or {}
        wait = ttl
        if isinstance(owner.get("expires_at"), int | float) and isinstance(owner.get("store_now"), int | float):
            wait = float(owner["expires_at"]) - float(owner["store_now"])
        return _Outcome(True, f"{state.status}" + (f": {state.reason}" if state.reason else ""),
                        min(ttl, max(poll, wait)), "requeue")

    def _operator_commands(self, state: RunState) -> str:
        """The ``jixu runs …`` commands an operator may use now (the store's password masked)."""
        from jixu.runs.operations import next_operations

        store = self.config.store_url
        if store.lower().startswith(("postgresql://", "postgres://")):
            from jixu.ledger.postgres import mask_dsn

            store = mask_dsn(store)
        commands = [str(op["command"]) for op in next_operations(state, store, self.config.providers)]
        return " | ".join(commands) or f"jixu runs show {store} {state.run_id}"


class _ReportHandler(logging.Handler):
    """Warnings of any library in a worker process (psycopg's pool, say) as the worker's own lines."""

    def __init__(self, report: Callable[[str, str], None]) -> None:
        super().__init__(logging.WARNING)
        self._report = report

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._report("error" if record.levelno >= logging.ERROR else "log",
                         f"{record.name}: {record.getMessage()}")
        except Exception:  # a log line never stops a worker
            self.handleError(record)


@contextlib.contextmanager
def logs_as_reports(report: Callable[[str, str], None]) -> Iterator[None]:
    """While serving: log records of WARNING and above, from any logger, become ``report`` lines (time, the
    worker's name), unless the process configured logging itself. Without it they went to Python's last-resort
    handler, bare (an audit: psycopg_pool's "discarding closed connection" lines, no time, no worker)."""
    root = logging.getLogger()
    if root.handlers:
        yield
        return
    handler = _ReportHandler(report)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


LOOK_AGAIN_S = 5.0
"""The shortest delay before a worker looks again at an item it left for someone else (see ``Worker._look_again``)."""

_STOPPED_EARLY: list[str] = []
"""SIGTERM / SIGINT received while a worker process started (see :func:`stop_early_on_signals`)."""


def stop_early_on_signals() -> None:
    """Keep a SIGTERM or SIGINT that arrives while this worker process starts (loading its agent, opening its
    store) instead of dying of it (exit 143, nothing said, seen by an audit): :func:`serve` then stops at once,
    exit 0, as it would have a moment later. For a process that is a worker (the CLI's, a pool's child): an
    embedding application keeps its own handlers."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: _STOPPED_EARLY.append(
            f"{signal.Signals(number).name} received while starting"))


async def serve(config: WorkerConfig, *, report: Report | None = None,
                on_ready: Callable[[Worker], None] | None = None, lifeline: int | None = None) -> WorkerStats:
    """Run one worker in this process until SIGTERM/SIGINT (or an empty queue with ``exit_when_idle``).

    ``lifeline``: a file descriptor that reaches end of file when the process that started this one is gone
    (see :data:`PARENT_FD_ENV`); the worker then stops as on SIGTERM, so a killed pool leaves no orphans."""
    agent = make_agent(config.agent) if config.agent is not None else None
    if agent is not None:
        agent.prepare()
    providers = load_run_providers(config.providers) if config.providers is not None else None
    store = open_store(config.store_url)
    try:
        worker = Worker(agent, store, config, report=report, providers=providers)
        loop = asyncio.get_running_loop()
        tools = use_tool_pool(loop, config)
        tune_collector()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.stop, f"{signal.Signals(signum).name} received")
        if _STOPPED_EARLY:
            worker.stop(_STOPPED_EARLY[0])
        if lifeline is not None:
            loop.add_reader(lifeline, _watch_lifeline, loop, lifeline, worker)
        if on_ready is not None:
            on_ready(worker)
        try:
            with logs_as_reports(worker.report):
                return await worker.run()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            if lifeline is not None:
                loop.remove_reader(lifeline)
            if tools.running:
                # A call the drain cut off still runs in its thread (a thread cannot be stopped): asyncio.run would
                # wait for it at its end. The process is to end by end_serving_process instead.
                loop.set_default_executor(ThreadPoolExecutor(max_workers=1, thread_name_prefix="jixu-idle"))
                tools.shutdown(wait=False, cancel_futures=True)
    finally:
        store.close()


def _watch_lifeline(loop: asyncio.AbstractEventLoop, fd: int, worker: Worker) -> None:
    """The lifeline is readable: at end of file (nobody holds its write end any more) the worker stops."""
    try:
        gone = not os.read(fd, 64)
    except OSError:
        gone = True
    if gone:
        loop.remove_reader(fd)
        worker.stop("the pool's parent process is gone")


class ToolPool(CallTrackingExecutor):
    """The bounded pool a worker's plain ``def`` tools run in (:func:`use_tool_pool`); it counts the calls running,
    and what a call hands it counts as that call in flight (:class:`~jixu.threads.tools.CallTrackingExecutor`)."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="jixu-tool")
        self._counting = threading.Lock()
        self.running = 0
        """Calls running in its threads now."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        def counted() -> _T:
            with self._counting:
                self.running += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._counting:
                    self.running -= 1

        return super().submit(counted)


_TOOL_POOLS: weakref.WeakSet[ToolPool] = weakref.WeakSet()


def use_tool_pool(loop: asyncio.AbstractEventLoop, config: WorkerConfig) -> ToolPool:
    """Make a bounded pool of ``config.tool_threads`` the default executor of ``loop`` (the one a worker owns):
    plain ``def`` tools and other blocking calls run there, never on the loop (the commits have their own thread,
    so even a full pool of blocking tools never holds a commit)."""
    pool = ToolPool(config.tool_threads)
    loop.set_default_executor(pool)
    _TOOL_POOLS.add(pool)
    return pool


def end_serving_process(code: int) -> None:
    """Before a serving process ends: when the drain cut calls off, stop what they started; then, when a tool
    call still runs in one of its tool threads, end the process now with ``code``.

    A drain records a call it cut off as of unknown outcome and gives its claim back, but a thread cannot be
    stopped: left running, the call could still act after that record (an operator may have settled it
    ``not_occurred`` meanwhile), and the process would wait for it well past its drain timeout. Ending the
    process ends the call, as a crash would (its outcome is the record's: unknown). A process a cut-off call
    started (a ``def`` tool's or an ``async`` one's subprocess) would outlive it and act all the same: when a
    call was cut off, this process's descendants are stopped first (SIGTERM, then SIGKILL; they cannot be told
    apart from the processes of calls that ended). Call it once the worker, its store and the server have
    stopped; it returns when no call runs."""
    if CUT_OFF.calls:
        stopped = stop_descendants(DESCENDANTS_GRACE_S)
        if stopped:
            print(f"jixu: {CUT_OFF.calls} call(s) were cut off; stopped the processes this one still ran "
                  f"(pids {', '.join(map(str, stopped))})", file=sys.stderr, flush=True)
    running = sum(pool.running for pool in list(_TOOL_POOLS))
    if not running:
        return
    print(f"jixu: {running} tool call(s) still running in threads are cut off by ending the process (each is "
          "recorded with an unknown outcome)", file=sys.stderr, flush=True)
    give_back_held_claims()  # held while those calls ran (decision 0065): they end with the process now
    sys.stdout.flush()
    os._exit(code)


DESCENDANTS_GRACE_S = 2.0
"""Seconds a serving process that cut calls off gives its remaining child processes between SIGTERM and SIGKILL."""


SERVING_GC_THRESHOLD = 10_000
"""Allocations between two collections of the cyclic GC's youngest generation in a serving process (CPython's
default is 700)."""


def tune_collector() -> None:
    """Tune CPython's cyclic garbage collector for a process that serves turns from now on.

    What exists now (modules, the agent, the store) is frozen out of every later collection (``gc.freeze``),
    and the youngest generation is collected every :data:`SERVING_GC_THRESHOLD` allocations instead of 700:
    a worker allocates containers fast and nearly all of them are freed by reference counting, so most
    collections found nothing while holding the event loop. (``bench/fleet.py``, K=500: collections took ~9 %
    of a worker's CPU, with four full ones of ~40 ms; tuned, ~4 % and none full.) A threshold set higher
    beforehand, or a collector switched off, is left as it is.
    """
    gc.freeze()
    first, second, third = gc.get_threshold()
    if gc.isenabled() and 0 < first < SERVING_GC_THRESHOLD:
        gc.set_threshold(SERVING_GC_THRESHOLD, second, third)


def load_run_providers(spec: str) -> dict[str, Provider]:
    """The providers the factory ``MODULE:FACTORY`` returns (as ``jixu runs --providers``; typed error if unusable)."""
    from jixu.runs.operations import load_providers

    return load_providers(spec)


def exit_code_of(error: BaseException) -> int:
    """A worker process's exit code for ``error``: 6 bad input, 5 store problem, 1 anything else."""
    if isinstance(error, InvalidInput):
        return EXIT_INVALID_INPUT
    if isinstance(error, StoreError):
        return EXIT_STORE
    return EXIT_FAILED


def child_main() -> None:
    """Entry point of a pool's child process: the configuration is in ``$JIXU_WORKER_CONFIG``."""
    text = os.environ.get(CONFIG_ENV)
    if not text:
        print(f"{CONFIG_ENV} is not set", file=sys.stderr)
        sys.exit(EXIT_INVALID_INPUT)
    stop_early_on_signals()
    try:
        config = WorkerConfig.from_json(text)
        asyncio.run(serve(config, lifeline=_lifeline()))
    except JixuError as error:
        print(f"worker error ({error.code}): {error.message}", file=sys.stderr, flush=True)
        sys.exit(exit_code_of(error))
    end_serving_process(EXIT_OK)
    sys.exit(EXIT_OK)


def _lifeline() -> int | None:
    """The lifeline the pool handed this child (:data:`PARENT_FD_ENV`), kept from the child's own children."""
    text = os.environ.pop(PARENT_FD_ENV, "")
    if not text:
        return None
    try:
        fd = int(text)
        os.set_inheritable(fd, False)
    except (ValueError, OSError):
        print(f"{PARENT_FD_ENV}={text!r} is not an open file descriptor; not watching the parent",
              file=sys.stderr, flush=True)
        return None
    return fd


RESTART_BACKOFF = (1.0, 60.0)
"""A dead pool worker is started again after 1 s, doubling while it keeps dying, at most 60 s; a worker that ran
for 60 s starts from 1 s again."""


class WorkerPool:
    """N worker processes over one store (see the module docstring).

    ``agent_factory`` is ``MODULE:FACTORY`` or an importable module-level
    callable (None: the workers execute runs only, with ``providers``, a
    ``MODULE:FACTORY`` returning ``dict[str, Provider]``); each child is named ``<owner_prefix>-<i>`` (stable across
    restarts, so a restarted pool reclaims its own turns at once: give each
    concurrently running pool its own prefix). Limits are enforced by the
    store on every claim; give every worker of a deployment the same limits.
    """

    def __init__(self, agent_factory: str | Callable[[], Agent] | None, store_url: str, *, processes: int = 1,
                 owner_prefix: str | None = None, lease_ttl: float = DEFAULT_LEASE_TTL, global_limit: int | None = None,
                 project_limits: dict[str, int] | None = None, default_project_limit: int | None = None,
                 takeover: Literal["never", "safe"] = "never", poll_interval: float = 0.5,
                 drain_timeout: float = 10.0, exit_when_idle: bool = False, quiet: bool = False,
                 env: dict[str, str] | None = None, stdout: IO[str] | int | None = None,
                 stderr: IO[str] | int | None = None, providers: str | None = None,
                 workspace_root: str | None = None, publishers: str | None = None,
                 remotes: str | None = None, concurrency: int = 1, max_loop_lag: float | None = None,
                 tool_threads: int = DEFAULT_TOOL_THREADS) -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or not 1 <= processes <= 256:
            raise InvalidInput("processes must be an integer between 1 and 256", field="processes")
        if isinstance(store_url, str) and is_memory_url(store_url):
            raise InvalidInput("worker processes need a store they can share (a SQLite file or PostgreSQL); a "
                               f"{store_url} store lives in one process", field="store")
        spec = factory_spec(agent_factory) if agent_factory is not None else None
        prefix = owner_prefix if owner_prefix is not None else default_owner()
        base = WorkerConfig(store_url=store_url, agent=spec, owner=prefix, lease_ttl=lease_ttl,
                            global_limit=global_limit, project_limits=dict(project_limits or {}),
                            default_project_limit=default_project_limit, takeover=takeover,
                            poll_interval=poll_interval, drain_timeout=drain_timeout, exit_when_idle=exit_when_idle,
                            quiet=quiet, providers=providers, workspace_root=workspace_root, publishers=publishers,
                            remotes=remotes, concurrency=concurrency, max_loop_lag=max_loop_lag,
                            tool_threads=tool_threads)
        self.configs = [replace(base, owner=f"{prefix}-{i}") for i in range(1, processes + 1)]
        self.drain_timeout = float(drain_timeout)
        self._env = dict(env or {})
        self._stdout, self._stderr = stdout, stderr
        self.processes: list[subprocess.Popen[str]] = []
        self._stopping = False
        self._lifeline: int | None = None
        """The write end of the children's lifeline (open while this pool may have children)."""
        self._lifeline_read: int | None = None
        """Its read end, kept to hand to a worker started again (its EOF comes only when the write end closes)."""
        self._started_at: list[float] = []
        self._backoff: list[float] = []
        self._due: list[float | None] = []
        self.restarts = 0
        """How many workers this pool started again after they died."""

    @classmethod
    def of(cls, config: WorkerConfig, processes: int, *, env: dict[str, str] | None = None,
           stdout: IO[str] | int | None = None, stderr: IO[str] | int | None = None) -> WorkerPool:
        """A pool of ``processes`` workers configured as ``config``, named ``<config.owner>-<i>``."""
        settings = {name: value for name, value in asdict(config).items() if name not in ("store_url", "agent",
                                                                                            "owner")}
        return cls(config.agent, config.store_url, processes=processes, owner_prefix=config.owner, env=env,
                   stdout=stdout, stderr=stderr, **settings)

    @property
    def owners(self) -> list[str]:
        """The workers' names, in process order."""
        return [c.owner for c in self.configs]

    @property
    def pids(self) -> list[int]:
        """Process ids of the started workers."""
        return [p.pid for p in self.processes]

    def start(self) -> None:
        """Start every worker process.

        Each child watches a pipe only this process holds the write end of: when this process ends, however
        it ends (SIGKILL too), the children stop claiming, drain within the drain timeout and exit."""
        if self.processes:
            raise InvalidInput("this pool was started already", field="pool")
        self._lifeline_read, self._lifeline = os.pipe()  # neither end is inherited but where passed explicitly
        for config in self.configs:
            self.processes.append(self._spawn(config))
            self._started_at.append(time.monotonic())
            self._backoff.append(RESTART_BACKOFF[0])
            self._due.append(None)

    def _spawn(self, config: WorkerConfig) -> subprocess.Popen[str]:
        read_end = self._lifeline_read
        assert read_end is not None
        env = {**os.environ, **self._env, CONFIG_ENV: config.to_json(), PARENT_FD_ENV: str(read_end)}
        # Each worker leads a process group of its own: what its tools start is found (and stopped) by the claimant
        # that takes its work over once it died (kernel.ownership.left_running). Signals come from this pool.
        return subprocess.Popen([sys.executable, "-c", _CHILD_CODE], env=env, text=True, stdout=self._stdout,
                                stderr=self._stderr, pass_fds=(read_end,), start_new_session=True)

    def restart_dead(self) -> list[tuple[str, int]]:
        """Start again, under the same name, each worker that died (a signal or a non-zero exit) while the pool
        is not stopping: ``(owner, exit code)`` of each started now. A worker exits 0 only when it was asked to
        (or found the queue empty with ``exit_when_idle``), so that one is left alone. One that keeps dying is
        started again after a delay doubling from 1 s to 60 s, reset once it ran for a minute. Its turns are
        reclaimed at once by the new process (the same owner name)."""
        started: list[tuple[str, int]] = []
        if self._stopping or self._lifeline is None:
            return started
        now = time.monotonic()
        for index, process in enumerate(self.processes):
            code = process.poll()
            if code is None or code == 0:
                continue
            due = self._due[index]
            if due is None:  # just found dead: start it again after its backoff
                if now - self._started_at[index] >= RESTART_BACKOFF[1]:
                    self._backoff[index] = RESTART_BACKOFF[0]
                self._due[index] = now + self._backoff[index]
                continue
            if now < due:
                continue
            self.processes[index] = self._spawn(self.configs[index])
            self._started_at[index], self._due[index] = now, None
            self._backoff[index] = min(self._backoff[index] * 2, RESTART_BACKOFF[1])
            self.restarts += 1
            started.append((self.configs[index].owner, code))
        return started

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to every worker still running."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    def wait(self, timeout: float | None = None) -> list[int | None]:
        """Wait up to ``timeout`` seconds (forever if None) for every worker; their exit codes (None: running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self.processes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(left)
        codes = [p.poll() for p in self.processes]
        if all(code is not None for code in codes) and (self._stopping or all(code == 0 for code in codes)):
            self._close_lifeline()  # none is started again (restart_dead needs the lifeline for a new one)
        return codes

    def stop(self, grace: float = 5.0) -> list[int | None]:
        """SIGTERM every worker, wait for them to drain (drain timeout + ``grace``), SIGKILL stragglers."""
        self._stopping = True
        self.signal(signal.SIGTERM)
        codes = self.wait(self.drain_timeout + grace)
        if any(code is None for code in codes):
            self.signal(signal.SIGKILL)
            codes = self.wait(grace)
        self._close_lifeline()
        return codes

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._lifeline_read is not None:
            os.close(self._lifeline_read)
            self._lifeline_read = None

    def run(self) -> int:
        """Start the workers and wait for them; SIGTERM/SIGINT here stops them gracefully.

        Returns 0 when every worker exited 0, else 1.
        """
        previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}

        def forward(signum: int, frame: object) -> None:
            self._stopping = True
            self.signal(signal.SIGTERM)

        for signum in previous:
            signal.signal(signum, forward)
        try:
            self.start()
            while True:
                codes = self.wait(0.2)
                for owner, code in self.restart_dead():
                    print(f"jixu worker: {owner} died (exit {code}); started it again", file=sys.stderr, flush=True)
                codes = [p.poll() for p in self.processes]
                if all(code is not None for code in codes) and not any(due is not None for due in self._due):
                    break
                if self._stopping:
                    deadline = time.monotonic() + self.drain_timeout + 5.0
                    codes = self.wait(1.0)
                    while any(code is None for code in codes) and time.monotonic() < deadline:
                        # Again (a worker stops once): one sent while a worker was still starting, between its
                        # fork and its exec, was lost, and that worker ran on until it was killed.
                        self.signal(signal.SIGTERM)
                        codes = self.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                    if any(code is None for code in codes):
                        self.signal(signal.SIGKILL)
                        codes = self.wait(5.0)
                    break
            if self._stopping:
                # A worker that died earlier and waited for its restart was reported then (and handled): the stop
                # is judged by the workers it stopped. One the SIGTERM ended while still starting (before its
                # handler was installed) stopped as asked.
                codes = [0 if due is not None or code == -signal.SIGTERM else code
                         for code, due in zip(codes, self._due, strict=True)]
            return EXIT_OK if all(code == 0 for code in codes) else EXIT_FAILED
        finally:
            self._close_lifeline()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["CONFIG_ENV", "DEFAULT_CONCURRENCY", "DEFAULT_TOOL_THREADS", "DEFAULT_WORKSPACE_ROOT", "PARENT_FD_ENV",
           "UNBOUNDED", "Report", "ToolPool", "Worker", "WorkerConfig", "WorkerPool", "WorkerStats", "child_main",
           "default_owner", "exit_code_of", "end_serving_process", "factory_spec", "load_agent_factory",
           "load_run_providers", "logs_as_reports", "make_agent", "print_report", "serve", "stop_early_on_signals", "tune_collector", "use_tool_pool"]

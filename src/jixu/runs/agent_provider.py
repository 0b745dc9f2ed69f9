"""The built-in jixu agent worker: a durable thread with a model driver and the workspace tools.

:class:`AgentProvider` implements :class:`~jixu.runs.providers.Provider`
(kind ``agent``). ``implement(workspace, context)`` runs one jixu thread whose
agent has the tools of :mod:`jixu.runs.workspace_tools` bound to the run's
workspace, and whose instructions carry the brief (and, for a repair attempt,
the recorded evidence of the failed checks). It sends the brief, waits for
the thread, and maps the thread's outcome onto the provider interface.

One thread per run, provider and request
----------------------------------------
The thread is created with metadata ``{"source": "jixu.runs.agent_provider",
"run_id", "provider", "request_digest", "attempt"}`` (the digest covers the
brief and ``repair_of``; ``attempt`` is the task attempt that started it),
recorded atomically with the thread itself. Every call first looks for a
thread whose ``source``, ``run_id``, ``provider`` and ``request_digest`` are
this call's (a scan of the store's ``thread/`` streams, reading one event
each, cached per provider object) and continues it instead of starting over:
a call repeated after the worker crashed (the same task attempt dispatched
again), after a pause (the run's next task attempt), after an operator's
resume, or a handoff back to this provider re-dispatches only what the
thread's resolver says is open, so completed tool calls are never repeated,
and a thread that already finished returns its reply without calling the
model. The task attempt is deliberately not part of the lookup: the run
engine starts a new task attempt after every pause, and a new attempt must
continue the conversation, not lose it. A repair (different ``repair_of``),
another provider name or another run gets a fresh thread. The thread id is
reported in the result's ``details`` and in the details of every error
raised once the thread exists (:func:`run_threads` lists a run's threads).

Outcome mapping
---------------

=======================================================  ==================================================
thread after ``wait()``                                  ``implement``
=======================================================  ==================================================
``idle``, last turn completed                            returns ``ImplementResult(summary=reply, details=
                                                         {thread_id, turn_id, usage, reopened,
                                                         settled_unknown, ...})``
``paused`` (``rate_limit``, ``transient``, ``quota``,    raises ``ProviderError(kind=<reason>,
``authentication``)                                      retry_after=<provider's hint>)``. The thread has
                                                         already made its own recorded automatic retries of
                                                         rate limits and transient failures (at most 3,
                                                         ``details.automatic_retries_used``); quota and
                                                         authentication pause at once. When the run calls
                                                         again (its automatic retry, an operator's resume or
                                                         a handoff back), the paused turn is resumed
                                                         explicitly with the run as the actor.
``waiting`` on tool calls whose outcome is unknown       settled here, then the thread continues (no error)
(an ``edit_file``/``run_command`` cut off by a crash,
a tool that raised unexpectedly, an idempotent call
that exhausted its retries)
``failed`` (model error, ``max_steps`` used, …)          raises :class:`AgentImplementationFailed`
``corrupt``                                              raises :class:`AgentImplementationFailed`
turn owned by another live process (lease not expired),  raises ``ProviderError(kind="transient",
or this process lost its claim                           retry_after=<lease time left>)``
=======================================================  ==================================================

Why unknown tool outcomes are settled rather than escalated: every tool of
this agent acts only on the run's retained workspace, and the workspace,
not the thread, is the ground truth of the run. The run reconciles it (git
root, origin, HEAD, tree) before calling the provider again, and verifies it
with the project's checks after; ``implement`` is ``idempotent`` with respect
to the workspace (decision 0005). So there is no outside state for an
operator to inspect that the run does not already inspect, and none of the
pause kinds would be true (nothing is transient, no quota, no credentials):
the provider records, for each such effect, an ``abandoned_unknown``
resolution whose evidence is the workspace's observed git state (HEAD and
a digest of ``git status``), with the run as the actor. It never claims the
call happened or not; the model is told the outcome is unknown and
re-inspects the workspace with its read-only tools. This is only done when no
other live process owns the turn (otherwise the call may still be running:
``ProviderError(kind="transient")``). A command that escaped the workspace
(a network call, a detached process) is not undone by any of this; the
settled resolutions are listed in ``details.settled_unknown`` so the run can
record them.

``test()`` checks that the store answers and the model driver is usable: for
a :class:`~jixu.threads.model.ScriptedModel` without any call (no network),
for a real driver (OpenAI, Anthropic, …) by one tiny model call, whose
tokens are billed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
import subprocess
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from jixu.errors import InvalidInput, JixuError, ModelError, OwnershipLost, TurnOwned
from jixu.kernel import DEFAULT_LEASE_TTL
from jixu.ledger import Store, new_id, open_store
from jixu.ledger.encoding import JSONObject, content_hash
from jixu.runs.providers import (
    PAUSE_KINDS,
    ImplementContext,
    ImplementResult,
    ProviderError,
    ProviderErrorKind,
    ProviderTest,
)
from jixu.runs.workspace_tools import Workspace, check_globs, workspace_tools
from jixu.threads.agent import Agent
from jixu.threads.harness import Harness
from jixu.threads.log import THREAD_PREFIX, State
from jixu.threads.model import ModelDriver, ModelRequest, ScriptedModel
from jixu.threads.thread import Thread

THREAD_SOURCE = "jixu.runs.agent_provider"
"""The ``source`` of the metadata of every thread this provider starts."""

DEFAULT_INSTRUCTIONS = """\
You are a careful software engineer working in a git checkout of a project. Implement the brief below.

- Look before you change: list_files and read_file show the project; run_command runs its tests or \
other programs (argv as a list, no shell unless you call ["sh", "-c", ...]).
- Change files with edit_file (one exact, unique occurrence) or write_file (whole content). Paths are \
relative to the checkout's root.
- Keep changes focused on the brief. Do not commit, push, or change git configuration: the run records, \
verifies and publishes your changes itself.
- If a tool call's outcome is reported as unknown, inspect the workspace before relying on it.
- When you are done, reply without calling tools: a short summary of what you changed and why, and what \
you verified."""

CONTINUE_MESSAGE = ("Your previous turn on this brief was interrupted before it finished; calls it left "
                    "unfinished have unknown outcomes. Inspect the workspace and continue the brief.")
REPAIR_MESSAGE = ("This is a repair attempt: the project's checks failed after the previous attempt (the "
                  "recorded evidence is in your instructions). Find and fix the cause, keeping the work "
                  "already in the workspace.")
MAX_EVIDENCE_CHARS = 20_000
"""How much of the repair evidence and knowledge (as JSON) goes into the instructions."""
TEST_TIMEOUT = 60.0
"""Seconds ``test()`` waits for a real driver's tiny call."""
SCAN_PAGE = 1000
T = TypeVar("T")


class AgentImplementationFailed(JixuError):
    """The agent's thread failed (or is corrupt): the implementation did not succeed.

    ``details`` carry ``thread_id``, ``status`` and the turn's recorded ``error``.
    """

    code = "agent_implementation_failed"


def thread_key(context: ImplementContext, provider: str) -> JSONObject:
    """What identifies the thread of a run's request for one provider (see the module docstring).

    The thread's metadata is this plus ``attempt``, the task attempt that started it.
    """
    if not isinstance(context, ImplementContext):
        raise InvalidInput("context must be an ImplementContext", field="context")
    if not isinstance(context.run_id, str) or not context.run_id.strip():
        raise InvalidInput("context.run_id must be a non-empty string", field="run_id")
    if isinstance(context.attempt, bool) or not isinstance(context.attempt, int) or context.attempt < 0:
        raise InvalidInput("context.attempt must be an integer >= 0", field="attempt")
    if not isinstance(context.brief, str) or not context.brief.strip():
        raise InvalidInput("context.brief must be a non-empty string", field="brief")
    return {"source": THREAD_SOURCE, "run_id": context.run_id, "provider": provider,
            "request_digest": content_hash({"brief": context.brief, "repair_of": context.repair_of})}


def run_threads(store: Store, run_id: str | None = None) -> list[tuple[str, JSONObject]]:
    """``(thread_id, metadata)`` of the threads agent providers started (for ``run_id`` only, if given).

    Oldest first. Reads the first event of every thread in the store.
    """
    found: list[tuple[str, JSONObject]] = []
    after = ""
    while True:
        infos = store.list_streams(THREAD_PREFIX, after=after, limit=SCAN_PAGE)
        for info in infos:
            first = store.read(info.stream, 1, 1)
            if not first or first[0].type != "thread.created":
                continue  # forks copy their parent's metadata: only the thread that was started counts
            metadata = first[0].data.get("metadata")
            if isinstance(metadata, dict) and metadata.get("source") == THREAD_SOURCE \
                    and (run_id is None or metadata.get("run_id") == run_id):
                found.append((info.stream[len(THREAD_PREFIX):], dict(metadata)))
        if len(infos) < SCAN_PAGE:
            return found
        after = infos[-1].stream


def workspace_evidence(root: Path) -> JSONObject:
    """What the workspace looks like now: git HEAD, a digest of ``git status`` and the changed paths."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30, check=False,
                                  env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.decode("utf-8", errors="replace") if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain=v1", "--untracked-files=all")
    changed = [line[3:] for line in (status or "").splitlines() if len(line) > 3]
    return {"head": head.strip() if head else None,
            "status_digest": hashlib.sha256(status.encode()).hexdigest() if status is not None else None,
            "changed_paths": changed[:100], "changed_count": len(changed)}


def _excerpt(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > MAX_EVIDENCE_CHARS:
        text = text[:MAX_EVIDENCE_CHARS] + f"\n[... {len(text) - MAX_EVIDENCE_CHARS} characters omitted]"
    return text


class AgentProvider:
    """The jixu agent as a run worker (see the module docstring for the thread mapping and outcomes).

    ``store`` holds the agent's threads (a Store, or a URL/path opened here and
    closed by :meth:`close`). ``owner`` names this process for turn leases
    (default: host, pid and a random suffix, stable for this object): a
    restarted worker given the same owner reclaims its turns at once; another
    owner waits until the lease (``lease_ttl`` seconds) expires, then takes
    over when every open effect is safe to retry. ``instructions`` replace
    :data:`DEFAULT_INSTRUCTIONS` (the workspace rules, the brief and any repair
    evidence are always appended). ``command_timeout`` bounds each
    ``run_command``; ``command_env`` replaces the commands' scrubbed environment.
    """

    def __init__(self, name: str, model: ModelDriver, *, instructions: str | None = None,
                 store: Store | str | os.PathLike[str], owner: str | None = None, max_steps: int = 64,
                 allowed_paths: Sequence[str] = ("**",), context_budget: int | None = None,
                 command_timeout: float = 120.0, lease_ttl: float = DEFAULT_LEASE_TTL,
                 command_env: Mapping[str, str] | None = None) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > 100 or not name.isprintable():
            raise InvalidInput("a provider name must be 1-100 printable characters", field="name")
        if instructions is not None and (not isinstance(instructions, str) or not instructions.strip()):
            raise InvalidInput("instructions must be a non-empty string or None", field="instructions")
        # The agent's own checks (model, max_steps, context_budget), before anything is opened.
        Agent(name, model, max_steps=max_steps, context_budget=context_budget)
        check_globs(allowed_paths)
        if isinstance(command_timeout, bool) or not isinstance(command_timeout, int | float) \
                or not 0 < command_timeout <= 86_400:
            raise InvalidInput("command_timeout must be between 0 and 86400 seconds", field="command_timeout")
        if owner is not None and (not isinstance(owner, str) or not owner or len(owner) > 200
                                  or not owner.isprintable()):
            raise InvalidInput("owner must be 1-200 printable characters", field="owner")
        if store is None:
            raise InvalidInput("an agent provider needs a store for its threads", field="store")
        self._name = name
        self._model = model
        self._instructions = instructions if instructions is not None else DEFAULT_INSTRUCTIONS
        self._max_steps = max_steps
        self._allowed_paths = tuple(allowed_paths)
        self._context_budget = context_budget
        self._command_timeout = float(command_timeout)
        self._command_env = dict(command_env) if command_env is not None else None
        self._lease_ttl = lease_ttl
        self._owns_store = not isinstance(store, Store)
        self.store = open_store(store)
        self.owner = owner if owner is not None else \
            f"{socket.gethostname()}:{os.getpid()}:agent:{secrets.token_hex(3)}"
        self._known: dict[str, str] = {}
        """Thread ids found or created by this object, by the content hash of their key."""

    # --- the Provider interface -------------------------------------------------------

    @property
    def kind(self) -> str:
        """``agent``."""
        return "agent"

    @property
    def name(self) -> str:
        """The configured provider's name (also the agent's name in its threads)."""
        return self._name

    def settings(self) -> JSONObject:
        """The configuration frozen into a run's provider snapshot (no secrets: the model's name only)."""
        return {"model": self._model.name, "max_steps": self._max_steps,
                "allowed_paths": list(self._allowed_paths), "instructions_digest": content_hash(self._instructions),
                "context_budget": self._context_budget, "command_timeout": self._command_timeout}

    async def test(self) -> ProviderTest:
        """Whether the store answers and the model is usable (one tiny call for real drivers; none for scripts)."""
        try:
            self.store.list_streams(THREAD_PREFIX, limit=1)
        except JixuError as error:
            return ProviderTest(False, f"the store is not usable: {error.message}")
        model = self._model
        if isinstance(model, ScriptedModel):
            # A script with no step at all cannot answer anything (its fields are read, nothing is called).
            if getattr(model, "_fn", None) is None and not getattr(model, "_steps", ()):
                return ProviderTest(False, f"scripted model {model.name!r} has an empty script")
            return ProviderTest(True, f"scripted model {model.name!r} is ready (no call made)")
        request = ModelRequest(
            instructions="This is a connectivity test. Reply with the single word: ok",
            messages=({"role": "user", "content": "ok?"},), tools=(), effect_id=new_id(),
            idempotency_key=f"jixu:provider-test:{new_id()}", attempt=1, thread_id="provider-test",
            turn_id="provider-test")
        try:
            await asyncio.wait_for(model.complete(request), TEST_TIMEOUT)
        except ModelError as error:
            return ProviderTest(False, f"model {model.name!r} failed ({error.kind}): {error.message}")
        except TimeoutError:
            return ProviderTest(False, f"model {model.name!r} did not answer within {TEST_TIMEOUT:g}s")
        except Exception as error:
            return ProviderTest(False, f"model {model.name!r} failed: {type(error).__name__}: {error}")
        return ProviderTest(True, f"model {model.name!r} answered")

    async def implement(self, workspace: Path, context: ImplementContext) -> ImplementResult:
        """Run (or continue) the thread of this run's request in ``workspace``; see the module docstring."""
        key = thread_key(context, self._name)
        root = Workspace(workspace, self._allowed_paths).root
        agent = self.agent_for(root, context)
        harness = Harness(agent, self.store, owner=self.owner, takeover="safe", lease_ttl=self._lease_ttl,
                          actor=self._actor(context))
        thread_id = self.find_thread(context)
        if thread_id is None:
            thread = await harness.create_thread(metadata={**key, "attempt": context.attempt})
            self._known[content_hash(key)] = thread.thread_id
        else:
            thread = await harness.open_thread(thread_id, resume=False)
        try:
            return await self._drive(thread, agent, root, context, reopened=thread_id is not None)
        except asyncio.CancelledError:
            # The run's worker is stopping: stop the thread too (its calls in flight get unknown outcomes).
            with contextlib.suppress(Exception):
                await thread.drain(0)
            raise

    # --- helpers the run layer may use --------------------------------------------------

    def agent_for(self, root: Path, context: ImplementContext) -> Agent:
        """The agent this provider runs for ``context`` in the workspace ``root``."""
        tools = workspace_tools(root, allowed_paths=self._allowed_paths, command_timeout=self._command_timeout,
                                env=self._command_env)
        return Agent(self._name, self._model, instructions=self.instructions_for(context), tools=tools,
                     max_steps=self._max_steps, context_budget=self._context_budget)

    def instructions_for(self, context: ImplementContext) -> str:
        """The system instructions: the base text, the workspace rules, the brief, repair evidence, knowledge."""
        parts = [self._instructions,
                 "## Workspace rules\n"
                 f"You may write only paths matching {', '.join(self._allowed_paths)} (never .git). "
                 f"Each command is killed after {self._command_timeout:g} seconds.",
                 "## Brief\n" + context.brief]
        if context.repair_of is not None:
            parts.append("## Repair\nThe previous attempt did not pass the project's checks. Their recorded "
                         "evidence:\n" + _excerpt(context.repair_of))
        if context.knowledge:
            parts.append("## Knowledge\n" + _excerpt(context.knowledge))
        return "\n\n".join(parts)

    def find_thread(self, context: ImplementContext) -> str | None:
        """The id of the thread already started for this run's request (oldest, if several), or ``None``."""
        key = thread_key(context, self._name)
        digest = content_hash(key)
        known = self._known.get(digest)
        if known is not None:
            return known
        for thread_id, metadata in run_threads(self.store, context.run_id):
            if all(metadata.get(field) == value for field, value in key.items()):
                self._known[digest] = thread_id
                return thread_id
        return None

    def close(self) -> None:
        """Close the store if this provider opened it."""
        if self._owns_store:
            self.store.close()

    # --- driving the thread ----------------------------------------------------------

    def _actor(self, context: ImplementContext) -> str:
        return f"run:{context.run_id}"[:200]

    async def _drive(self, thread: Thread, agent: Agent, root: Path, context: ImplementContext, *,
                     reopened: bool) -> ImplementResult:
        state = await thread.refresh()
        last = state.turns[-1] if state.turns else None
        if state.status == "corrupt":
            raise self._failed(thread, state)
        if last is None:
            message = context.brief + (f"\n\n{REPAIR_MESSAGE}" if context.repair_of is not None else "")
            await self._owned(thread, thread.send(message))
        elif state.status == "paused":
            # The run called again after this pause: its automatic retry, or an operator's resume or handoff.
            await self._owned(thread, thread.resume(actor=self._actor(context), note="continued by the run"))
        elif state.status == "idle" and last.get("status") == "interrupted":
            await self._owned(thread, thread.send(CONTINUE_MESSAGE))
        settled: list[JSONObject] = []
        for _ in range(2 * self._max_steps + 8):
            state = await self._owned(thread, thread.wait())
            if state.status == "idle":
                last = state.turns[-1] if state.turns else {}
                if last.get("status") == "completed":
                    reply = str(last.get("reply") or "").strip()
                    return ImplementResult(summary=reply or "the agent finished without a summary", details={
                        "thread_id": thread.thread_id, "turn_id": last.get("turn_id"), "reopened": reopened,
                        "usage": dict(state.usage), "settled_unknown": settled, "model": self._model.name,
                        "agent_digest": agent.digest, "thread_seq": state.seq,
                        "thread_head_hash": state.head_hash})
                raise ProviderError(f"thread {thread.thread_id}'s turn was interrupted by another process",
                                    kind="transient", thread_id=thread.thread_id)
            if state.status == "paused":
                raise self._paused(thread, state)
            if state.status == "waiting":
                settled.extend(self._settle(thread, state, root, context))
                continue
            if state.status in ("failed", "corrupt"):
                raise self._failed(thread, state)
            raise ProviderError(f"thread {thread.thread_id} stopped while {state.status} (the harness is "
                                "shutting down?)", kind="transient", thread_id=thread.thread_id)
        raise AgentImplementationFailed(f"thread {thread.thread_id} kept stopping on unknown outcomes; gave up "
                                        "after settling them repeatedly", thread_id=thread.thread_id,
                                        status="waiting")

    async def _owned(self, thread: Thread, step: Awaitable[T]) -> T:
        """Await ``step``, turning a turn owned elsewhere into a transient provider error."""
        try:
            return await step
        except TurnOwned as error:
            raise ProviderError(f"thread {thread.thread_id}'s turn is owned by another process: {error.message}",
                                kind="transient", retry_after=self._lease_left(thread),
                                thread_id=thread.thread_id) from error
        except OwnershipLost as error:
            raise ProviderError(f"this process lost thread {thread.thread_id}'s turn: {error.message}",
                                kind="transient", retry_after=self._lease_ttl, thread_id=thread.thread_id) from error

    def _lease_left(self, thread: Thread) -> float:
        ownership = thread.log.ownership() or {}
        expires, now = ownership.get("expires_at"), ownership.get("store_now")
        if isinstance(expires, int | float) and isinstance(now, int | float) and expires > now:
            return round(expires - now + 0.05, 3)
        return self._lease_ttl

    def _settle(self, thread: Thread, state: State, root: Path, context: ImplementContext) -> list[JSONObject]:
        """Record ``abandoned_unknown`` for the tool calls the thread waits on (see the module docstring)."""
        ownership = thread.log.ownership()
        if ownership is not None and not ownership["released"] and not ownership["expired"] \
                and ownership["owner"] not in (None, self.owner):
            raise ProviderError(f"thread {thread.thread_id} waits on calls that another live process "
                                f"({ownership['owner']}) may still be running", kind="transient",
                                retry_after=self._lease_left(thread), thread_id=thread.thread_id)
        pending = [w for w in state.waiting_on if w.get("state") == "unknown" and w.get("kind") == "tool"]
        if not pending or len(pending) != len(state.waiting_on):
            raise AgentImplementationFailed(
                f"thread {thread.thread_id} is waiting ({state.reason}) on something the run cannot settle",
                thread_id=thread.thread_id, status=state.status, waiting_on=list(state.waiting_on))
        evidence = {"workspace": workspace_evidence(root), "run_id": context.run_id, "attempt": context.attempt}
        settled: list[JSONObject] = []
        for item in pending:
            effect_id = str(item["effect_id"])
            thread.log.resolve(effect_id, "abandoned_unknown", actor=self._actor(context), evidence=evidence,
                               owner=self.owner,
                               note="settled by the run: this tool acts only on the run's workspace, which the "
                                    "run reconciles and verifies; the agent is told the outcome is unknown")
            settled.append({"effect_id": effect_id, "tool": item.get("name"), "reason": item.get("reason")})
        return settled

    def _paused(self, thread: Thread, state: State) -> ProviderError:
        turn = state.turns[-1] if state.turns else {}
        pause = turn.get("pause") or {}
        reason = str(pause.get("reason"))
        kind = cast("ProviderErrorKind", reason if reason in PAUSE_KINDS else "transient")
        retry_after = pause.get("retry_after")
        return ProviderError(f"the agent's model provider paused thread {thread.thread_id}: {state.reason}",
                             kind=kind, retry_after=float(retry_after) if isinstance(retry_after, int | float)
                             else None, thread_id=thread.thread_id, delay=pause.get("delay"),
                             automatic_retries_used=pause.get("automatic_retries_used"))

    def _failed(self, thread: Thread, state: State) -> AgentImplementationFailed:
        turn = state.turns[-1] if state.turns else {}
        error = turn.get("error") if isinstance(turn.get("error"), dict) else None
        what = (f"{error.get('type') or error.get('kind') or 'error'}: {error.get('message', '')}".strip()
                if error else state.reason)
        return AgentImplementationFailed(f"the agent's thread {thread.thread_id} is {state.status}: {what}",
                                         thread_id=thread.thread_id, status=state.status, error=error)


__all__ = ["DEFAULT_INSTRUCTIONS", "THREAD_SOURCE", "AgentImplementationFailed", "AgentProvider", "run_threads",
           "thread_key", "workspace_evidence"]

"""A thread's durable record and the operator operations that need no agent.

:class:`ThreadLog` loads a thread's events (checkpoint + tail), keeps the
projected state current, appends with optimistic concurrency, and records
operator decisions: outcome resolutions, approvals and denials, forks and
interruptions. It never calls a model or a tool, so the CLI and the HTTP API
use it directly; :class:`~jixu.threads.thread.Thread` runs the agent loop on top.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from jixu.errors import (
    ConcurrencyError,
    EffectNotParked,
    FencingError,
    InvalidId,
    InvalidInput,
    KeyUnavailable,
    LeaseHeld,
    NoActiveTurn,
    NotFound,
    ResolutionConflict,
    ThreadBusy,
    ThreadCorrupt,
    ThreadNotFound,
    TurnNotPaused,
    TurnOwned,
)
from jixu.kernel import (
    DEFAULT_LEASE_TTL,
    LiveClaim,
    StreamWriter,
    acquire_claim,
    dead_holder,
    given_back_on_failure,
    live_claim,
    own_lease,
    process_identity,
    record,
    recovery_claim,
    release,
    tracing,
)
from jixu.ledger import Event, Fence, NewEvent, Store, VerifyReport, new_id, project
from jixu.ledger.artifacts import ArtifactRef, get_text
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.ledger.event import PreparedEvent, keep_parsed, parse_json, shared_meta
from jixu.ledger.ids import is_valid_id
from jixu.ledger.projection import (
    STATE_NESTING,
    audit_checkpoint,
    fold,
    make_chunked_checkpoint,
    write_chunked_checkpoint,
)
from jixu.ledger.store import Lease, check_text
from jixu.ledger.trust import verdict
from jixu.recovery import Analysis, EffectDecision, RecoveryResolver
from jixu.recovery.corruption import Corruption, corruption
from jixu.recovery.decision_text import decode_decisions
from jixu.recovery.resolutions import admit_resolution, resolution_body
from jixu.threads.decide import Action, InterruptTurn, Stop, decide, probe_record
from jixu.threads.projection import ThreadProjection, ThreadState, Turn, fork_state
from jixu.threads.tools import claim_taken_again

THREAD_PREFIX = "thread/"
DEFAULT_PROJECT = "default"
"""The project of a thread whose metadata names none."""


def indexed_project(metadata: dict[str, Any]) -> str | None:
    """The project a thread's first event names in its ``meta`` (so the ledger indexes the thread under it): the
    metadata's ``project``, :data:`DEFAULT_PROJECT` when it names none, ``None`` when what it names is no name."""
    found = metadata.get("project", DEFAULT_PROJECT)
    return found if isinstance(found, str) and 0 < len(found) <= 100 and found.isprintable() else None
DEFAULT_MAX_STEPS = 32
DEFAULT_MAX_ATTEMPTS = 3
MAX_NOTE_CHARS = 10_000
MAX_INPUT_CHARS = 200_000
REQUEST_ID = re.compile(r"^[0-9a-f]{32}$")
RECOVERY_TTL = 30.0
ARTIFACT_CACHE = 8
"""Artifact texts a thread's record keeps at hand (for its next model calls and its last reply)."""
START_TRIES = 5
"""How often a turn's start is decided again after another writer appended first."""
DECISION_TRIES = 20
"""How often an operator's decision is: a durable run's steps may append all the time (one approval of an audit
needed all 5 tries of the first version under 8 appending tasks)."""
_T = TypeVar("_T")
INHERIT_CHUNK_CHARS = 128 * 1024
"""Characters of inherited state per ``thread.inherited`` event: even if every character needed a
six-byte escape, a chunk stays under the ledger's 1 MiB payload limit."""


def stream_of(thread_id: str) -> str:
    """The ledger stream that holds a thread's events."""
    return f"{THREAD_PREFIX}{thread_id}"


@dataclass(frozen=True)
class State:
    """A thread's state as users see it: a snapshot, derived from events only."""

    thread_id: str
    status: str
    """``idle``, ``running``, ``waiting``, ``failed`` or ``corrupt``."""
    reason: str
    messages: tuple[dict[str, Any], ...]
    turns: tuple[dict[str, Any], ...]
    effects: dict[str, EffectDecision]
    """The RecoveryResolver's decision for every effect, by effect id."""
    waiting_on: tuple[dict[str, Any], ...]
    last_reply: str | None
    usage: dict[str, Any]
    seq: int
    head_hash: str
    parent: dict[str, Any] | None
    agent: dict[str, Any]
    analysis: Analysis
    corruption: Corruption | None = None
    """Why the thread is corrupt (first bad seq and reason), when it is (``status`` is then ``corrupt``)."""
    probes: dict[str, tuple[dict[str, Any], ...]] = dataclasses.field(default_factory=dict)
    """What the tools' probes were asked and answered, by the effect id of the call asked about (oldest first;
    see ``ThreadState.probes``). An unknown call in ``waiting_on`` carries its latest probe as ``probe``."""
    revisions: tuple[dict[str, Any], ...] = ()
    """The agent's revisions, oldest first (``ThreadState.revisions``); ``agent`` is the last one's record."""

    @property
    def revision(self) -> int:
        """The number of the agent revision the thread runs under now."""
        return int(self.revisions[-1]["revision"]) if self.revisions else 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the analysis flags included, the decisions as dicts)."""
        return {
            "thread_id": self.thread_id,
            "status": self.status,
            "reason": self.reason,
            "messages": list(self.messages),
            "turns": list(self.turns),
            "effects": {k: d.to_dict() for k, d in self.effects.items()},
            "waiting_on": list(self.waiting_on),
            "last_reply": self.last_reply,
            "usage": self.usage,
            "seq": self.seq,
            "head_hash": self.head_hash,
            "parent": self.parent,
            "agent": self.agent,
            "safe_to_continue": self.analysis.safe_to_continue,
            "has_corruption": self.analysis.has_corruption,
            "corruption": None if self.corruption is None else self.corruption.to_dict(),
            "probes": {effect_id: list(records) for effect_id, records in self.probes.items()},
            "revision": self.revision,
            "revisions": list(self.revisions),
        }


def probe_text(record: dict[str, Any] | None) -> str:
    """What a tool's probe answered about a call (a ``State.probes`` record) in one line; ``""`` for none."""
    if not record:
        return ""
    answer = record.get("answer")
    head = f"its probe (effect {record.get('effect_id')})"
    if not isinstance(answer, dict):
        return f"{head} has not answered"
    if answer.get("answer") == "dont_know":
        return f"{head} answered don't know: {_one_line(answer.get('reason'))}"
    found = answer.get("evidence")
    return f"{head} answered {answer.get('answer')}" + (f": {_one_line(found)}" if found else "")


def _one_line(value: object, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


InProgress = Callable[[], "str | None"]
"""Why another live process holds the active turn's claim, or None (:meth:`ThreadLog.in_progress_elsewhere`);
asked only of a thread that would otherwise wait."""


def shown_status(action: Action, analysis: Analysis, *, running: bool, in_progress: InProgress | None,
                 unheld: Callable[[], str] | None = None) -> tuple[str, str, bool]:
    """The status and reason every surface shows of a sound thread whose loop decided ``action``, and whether the
    turn is in progress in another process.

    ``running``: this process runs the turn. When another live process holds the turn's claim (``in_progress``),
    the calls without a receipt are in flight there, not waiting for an operator (a resolution is refused until
    the claim ends): the thread shows ``running``, or ``waiting`` for the approval of its parked calls only. A
    turn that goes on but that no live process holds says what continues it (``unheld``, e.g.
    :meth:`ThreadLog.unheld_reason`)."""
    if isinstance(action, InterruptTurn):
        asked = f"{action.request.get('actor')} asked to interrupt it: the turn ends at its next step"
        elsewhere = in_progress() if not running and in_progress is not None else None
        if elsewhere is None and not running:  # its runner is gone (a review): say how it ends now
            elsewhere = ("no process runs the turn now: it ends when a worker or a program claims it, or interrupt "
                         "it again to end it at once")
            return "running", f"{asked}; {elsewhere}", False
        return "running", asked + (f"; {elsewhere}" if elsewhere else ""), elsewhere is not None
    if isinstance(action, Stop) and action.status == "paused":
        return action.status, action.reason, False  # also while this process waits out an automatic pause
    if isinstance(action, Stop) and not running:
        if in_progress is not None and action.status == "waiting":
            elsewhere = in_progress()
            if elsewhere is not None and analysis.waiting_on_parked:
                return "waiting", (f"calls wait for an operator's approval: {', '.join(analysis.waiting_on_parked)}; "
                                   f"{elsewhere}"), True
            if elsewhere is not None:
                return "running", elsewhere, True
        return action.status, action.reason, False
    if not running and in_progress is not None and unheld is not None:
        # The turn goes on, but not in this process: in another that holds its claim, or in none (a drain gave the
        # claim back; its holder died): say which, so "running" is not read as a stuck worker.
        elsewhere = in_progress()
        if elsewhere is not None:
            return "running", elsewhere, True
        return "running", unheld(), False
    return "running", "", False


NOBODY_RUNS = ("no process runs the turn now: it goes on when a worker claims its queued work, or a program "
               "waits on the thread")
"""The reason of a turn that goes on but that no process holds (see :meth:`ThreadLog.unheld_reason`)."""


def build_state(thread_state: ThreadState, analysis: Analysis, *, max_steps: int = DEFAULT_MAX_STEPS,
                max_attempts: int = DEFAULT_MAX_ATTEMPTS, running: bool = False,
                context_budget: int | None = None, corrupt: Corruption | None = None,
                in_progress: InProgress | None = None, unheld: Callable[[], str] | None = None) -> State:
    """The public :class:`State` of a projected thread (pure but for ``in_progress`` and ``unheld``, see
    :func:`shown_status`); ``corrupt``: the thread's corruption verdict."""
    action = decide(thread_state, analysis, max_steps=max_steps, max_attempts=max_attempts,
                    context_budget=context_budget)
    elsewhere = False
    if corrupt is not None:
        status, reason = "corrupt", f"{corrupt.summary()}; it will not run"
    else:
        status, reason, elsewhere = shown_status(action, analysis, running=running, in_progress=in_progress,
                                                 unheld=unheld)
    waiting = []
    blocking = action.effect_ids if isinstance(action, Stop) else ()
    # A corrupt thread waits for nothing an operator could give it: no decision is offered on it. Nor does one
    # whose turn another live process holds: its calls without a receipt are in flight there.
    if corrupt is not None:
        open_items: tuple[str, ...] = ()
    elif elsewhere:
        open_items = analysis.waiting_on_parked
    else:
        open_items = (*analysis.requires_resolution, *analysis.waiting_on_parked, *blocking)
    for effect_id in dict.fromkeys(open_items):
        decision = analysis.decisions[effect_id]
        entry: dict[str, Any] = {"effect_id": effect_id, "kind": decision.kind, "name": decision.name,
                                 "state": decision.state, "reason": decision.reason}
        probe = probe_record(thread_state, analysis, effect_id)
        if probe is not None:
            entry["probe"] = dict(probe)  # what the tool's probe answered before an operator was asked
        waiting.append(entry)
    replies = [t.reply for t in thread_state.turns if t.status == "completed"]
    return State(
        thread_id=thread_state.thread_id,
        status=status,
        reason=reason,
        messages=tuple(dict(m) for m in thread_state.messages),
        turns=tuple(t.to_dict() for t in thread_state.turns),
        effects=dict(analysis.decisions),
        waiting_on=tuple(waiting),
        last_reply=replies[-1] if replies else None,
        usage=dict(thread_state.usage),
        seq=thread_state.seq,
        head_hash=thread_state.head_hash,
        parent=thread_state.parent,
        agent=dict(thread_state.agent),
        analysis=analysis,
        corruption=corrupt,
        probes={effect_id: tuple(dict(r) for r in records) for effect_id, records in thread_state.probes.items()},
        revisions=tuple(dict(r) for r in thread_state.revisions),
    )


class ThreadLog:
    """One thread's events and projected state in a store; operator operations, no agent loop."""

    def __init__(self, store: Store, state: ThreadState, *, chain_break_seq: int | None = None,
                 checkpoint_status: str = "none", actor: str = "jixu", chain: VerifyReport | None = None) -> None:
        self.store = store
        self.thread_id = state.thread_id
        self.stream = stream_of(state.thread_id)
        self._projection = ThreadProjection()
        self.writer: StreamWriter[ThreadState] = StreamWriter(
            store, self.stream, self._projection, state, chain_break=chain_break_seq, reload=self._reloaded,
            seal=_seal_staged)
        """The kernel's writer of this thread's stream: the projected state and every append go through it."""
        self.checkpoint_status = checkpoint_status
        """How opening used the checkpoint: ``used``, ``none`` or why it was ignored."""
        self.chain = chain
        """What the ledger said about this thread's chain: the opening's report, or the verdict once established."""
        self.established = False
        """True once :meth:`establish` verified the whole history (this record may then act on it)."""
        self._explained: int | None = None  # the break the last verdict was asked about
        self.actor = actor
        self._checkpoint_seq = 0
        self._artifact_texts: dict[str, str] = {}
        """Texts of recently used artifacts by hash (content-addressed, so never stale)."""
        self._last_reply: tuple[str, str] | None = None  # (sha256, decoded text) of the last reply read
        self._open_analysis: tuple[ThreadState, int, int | None, Analysis] | None = None
        self._decoded: tuple[ThreadState, dict[str, EffectDecision]] | None = None

    @property
    def state(self) -> ThreadState:
        """The projected state: durable events only (a staged receipt never survives a yield)."""
        return self.writer.state

    @property
    def chain_break_seq(self) -> int | None:
        """The first seq whose hash link is broken, once one was seen (``None`` while the chain holds)."""
        return self.writer.chain_break

    @chain_break_seq.setter
    def chain_break_seq(self, seq: int | None) -> None:
        self.writer.chain_break = seq

    @property
    def appending(self) -> bool:
        """True while an append of this record waits for its commit (see :meth:`append_async`)."""
        return self.writer.busy

    @classmethod
    def load(cls, store: Store, thread_id: str, *, actor: str = "jixu", verify: bool = False) -> ThreadLog:
        """Open a thread's record from its latest sealed checkpoint plus the events after it.

        Only the events after the checkpoint are chain-checked, so opening costs
        O(tail); a break recorded earlier, or a sealed checkpoint the events
        contradict, shows at once. ``verify=True`` establishes the record
        (:meth:`establish`: the whole chain, O(history)), so a change made
        inside the store before the checkpoint marks the thread corrupt too:
        every surface that reports a thread's status loads it so.
        """
        if not isinstance(thread_id, str) or not is_valid_id(thread_id):
            raise InvalidInput(f"thread id {thread_id!r} is not a valid id", field="thread_id")
        stream = stream_of(thread_id)
        try:
            projected = project(store, stream, ThreadProjection())
        except NotFound as missing:  # project's own refusal of a stream without events (read its head once)
            if type(missing) is not NotFound:
                raise
            raise ThreadNotFound(f"no thread {thread_id} in {store.url}", thread_id=thread_id) from None
        chain_break = None if projected.chain.valid else projected.chain.first_bad_seq
        if projected.state.thread_id != thread_id:
            # Its first event does not hold (the state stops before it): the thread is the stream's, not nobody's.
            projected.state.thread_id = thread_id
        log = cls(store, projected.state, chain_break_seq=chain_break, checkpoint_status=projected.checkpoint,
                  actor=actor, chain=projected.chain)
        log._checkpoint_seq = projected.checkpoint_seq or 0
        if projected.chunks is not None:
            # A checkpoint chunk read later that is missing or damaged is rebuilt by replay; say so here too.
            projected.chunks.on_problem.append(lambda problem: setattr(log, "checkpoint_status", problem))
        if verify:
            log.establish()
        return log

    # --- trust (decision 0025) ------------------------------------------------------------

    def establish(self) -> VerifyReport:
        """Verify the whole history once (the ledger's :func:`~jixu.ledger.trust.verdict`, O(history)): the
        chain from the genesis, the sealed checkpoint against its anchor, a break recorded earlier.

        Opening from a checkpoint trusts it for the events before it; this
        re-reads them, so a change made there after the checkpoint was
        written is found before this record acts. A break found is recorded
        in the store (every later opening sees it) and marks the thread
        corrupt. Idempotent: the second call costs nothing.
        """
        if not self.established or self.chain is None:
            report = verdict(self.store, self.stream, checkpoints=(self._projection.name,))
            self.chain = report
            self.established = True
            self._explained = self.chain_break_seq
            if not report.valid and report.first_bad_seq is not None:
                current = self.chain_break_seq
                self.chain_break_seq = report.first_bad_seq if current is None else min(current,
                                                                                         report.first_bad_seq)
                if self.state.seq >= report.first_bad_seq and not self.writer.has_staged:
                    # The state came from a checkpoint sealed after the break: rebuild it as every later opening
                    # does (the break is recorded now), from the events before the break only, so this answer and
                    # the next reader's are the same.
                    state, _break = self._reloaded()
                    self.writer.state = state
                    self._checkpoint_seq = 0
                    self.chain = report
        return self.chain

    def verification(self) -> dict[str, Any]:
        """What ``verify`` reports (the HTTP API, the Studio and the CLI show this): the established chain,
        the corruption verdict, and what re-projecting the checkpoint found (``valid`` is all of them)."""
        report = self.establish()
        analysis = self.analysis()
        found = self.corruption()
        audit = audit_checkpoint(self.store, self.stream, self._projection)
        return {"thread_id": self.thread_id, "valid": found is None and not (audit is not None and audit.failed),
                "chain": report.to_dict(), "corruption": None if found is None else found.to_dict(),
                "checkpoint": None if audit is None else audit.to_dict(), "corrupt_effects": list(analysis.corrupt),
                "unattributed_events": list(analysis.unattributed_events)}

    def open_to_act(self) -> None:
        """The line every operation that writes to this thread crosses first: send, the agent loop (a wait,
        a resume, a worker's claim), approve, deny, resolve, recover, interrupt, fork.

        Establishes the record (:meth:`establish`), takes in a break another
        process recorded since (one row read), then refuses a corrupt thread
        (:class:`~jixu.errors.ThreadCorrupt`, naming the first bad seq and the
        reason): nothing is appended and nothing is dispatched.
        """
        self.establish()
        self.writer.heed_recorded_break()
        self.refuse_if_corrupt()

    def _open_to_append(self) -> None:
        """What every append checks first: :meth:`open_to_act` without its read of the recorded break (the
        operation that appends crossed that line, and the agent loop reads it at every step)."""
        self.establish()
        self.refuse_if_corrupt()

    def corruption(self) -> Corruption | None:
        """The thread's corruption verdict (:func:`jixu.recovery.corruption.corruption`), or ``None``.

        What every surface shows and refuses by: the chain as the ledger
        reported it, a break seen since (its reason established then), the
        resolver's contradictions and the projection's.
        """
        seen = self.chain_break_seq
        if seen is not None and seen != self._explained and (self.chain is None or self.chain.valid
                                                              or self.chain.first_bad_seq != seen):
            self.established = False  # a break seen since the last verdict: ask the ledger for its reason
            self.establish()
        analysis = self.open_analysis()
        if analysis.has_corruption and not (analysis.corrupt or analysis.unattributed_events):
            analysis = self.analysis()
        if self.chain is not None and self.chain.valid and self.chain_break_seq is None \
                and not analysis.has_corruption and not self.state.contradiction:
            return None

        def seq_of(event_id: str) -> int | None:
            event = self.store.get_event(event_id)
            return event.seq if event is not None and event.stream == self.stream else None

        return corruption(self.stream, chain=self.chain, analysis=analysis, chain_break_seq=self.chain_break_seq,
                          contradiction=self.state.contradiction, seq_of=seq_of)

    @classmethod
    def create(cls, store: Store, agent_record: dict[str, Any], *, metadata: dict[str, Any] | None = None,
               actor: str = "jixu") -> ThreadLog:
        """Record a new thread (its ``thread.created`` event)."""
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidInput("metadata must be a JSON object", field="metadata")
        thread_id = new_id()
        meta: dict[str, Any] = {"actor": actor}
        project_name = indexed_project(metadata or {})
        if project_name is not None:
            meta["project"] = project_name
        created = NewEvent("thread.created", {"thread_id": thread_id, "agent": agent_record,
                                              "metadata": metadata or {}}, meta)
        [event] = record(store, stream_of(thread_id), [created], 0)
        projection = ThreadProjection()
        return cls(store, projection.apply(projection.initial(), event), actor=actor)

    # --- reading ------------------------------------------------------------------------

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for every effect of this thread as it stands."""
        state = self.state
        if state.contradiction:
            return RecoveryResolver.analyze(self.store.read(self.stream), chain_break_seq=self.chain_break_seq)
        return state.analysis(self.chain_break_seq, current=self.open_analysis(), settled=self._decoded_settled())

    def _decoded_settled(self) -> dict[str, EffectDecision]:
        """The settled decisions of this record's state, decoded once each and kept.

        A settled decision never changes and the projection only adds new
        ones, so a full analysis decodes only what settled since the last one
        (the state keeps them as compact text, which is what bounds its memory
        until somebody asks for everything).
        """
        state = self.state
        cached = self._decoded
        if cached is None or cached[0] is not state or len(cached[1]) > len(state.settled):
            cached = self._decoded = (state, {})
        decoded = cached[1]
        settled = state.settled
        if len(decoded) != len(settled):
            missing = [effect_id for effect_id in settled if effect_id not in decoded]
            decoded.update(zip(missing, decode_decisions([settled.text(effect_id) for effect_id in missing]),
                               strict=True))
        return decoded

    def open_analysis(self) -> Analysis:
        """The resolver's answer for the effects still open: all the agent loop needs, at O(open) cost.

        Kept until the state moves (the loop asks before deciding and again before each append).
        """
        state = self.state
        if state.contradiction:
            return self.analysis()
        cached = self._open_analysis
        if cached is not None and cached[0] is state and cached[1] == state.seq and cached[2] == self.chain_break_seq:
            return cached[3]
        analysis = state.open_analysis(self.chain_break_seq)
        self._open_analysis = (state, state.seq, self.chain_break_seq, analysis)
        return analysis

    def snapshot(self, *, max_steps: int = DEFAULT_MAX_STEPS, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 running: bool = False, context_budget: int | None = None, owner: str | None = None) -> State:
        """The public state (``last_reply`` whole, read from its artifact when it was stored as one).

        ``owner``: the viewer's own owner name (its own claim is not another process's; see :func:`shown_status`).
        """
        corrupt = self.corruption()
        return self._whole_reply(build_state(self.state, self.analysis(), max_steps=max_steps,
                                             max_attempts=max_attempts, running=running and corrupt is None,
                                             context_budget=context_budget, corrupt=corrupt,
                                             in_progress=partial(self.in_progress_elsewhere, owner),
                                             unheld=partial(self.unheld_reason, owner)))

    def _whole_reply(self, state: State) -> State:
        """``state`` with ``last_reply`` read from its artifact when the reply was stored as one.

        The turns keep the short placeholder and ``reply_artifact``; the last
        text read is kept, so polling the state does not read it again.
        """
        completed = [turn for turn in state.turns if turn.get("status") == "completed"]
        ref = completed[-1].get("reply_artifact") if completed else None
        if not isinstance(ref, dict):
            return state
        sha256 = ArtifactRef.from_dict(ref).sha256
        if self._last_reply is None or self._last_reply[0] != sha256:
            self._last_reply = (sha256, json.loads(self.artifact_text(ref)))
        return dataclasses.replace(state, last_reply=self._last_reply[1])

    def artifact_text(self, ref: dict[str, Any]) -> str:
        """The stored text of an artifact reference (hash-checked; the last few are kept at hand)."""
        artifact = ArtifactRef.from_dict(ref)
        text = self._artifact_texts.get(artifact.sha256)
        if text is None:
            text = get_text(self.store, artifact)
            self.remember_artifact(artifact.sha256, text)
        return text

    def remember_artifact(self, sha256: str, text: str) -> None:
        """Keep ``text`` (the artifact ``sha256``, just stored or read) at hand for the next reads."""
        if len(self._artifact_texts) >= ARTIFACT_CACHE:
            self._artifact_texts.pop(next(iter(self._artifact_texts)))
        self._artifact_texts[sha256] = text

    def status(self, *, max_steps: int = DEFAULT_MAX_STEPS, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
               running: bool = False, context_budget: int | None = None, owner: str | None = None) -> str:
        """:meth:`snapshot`'s ``status`` by the same rule, at O(open effects) cost.

        It copies no message and decodes no settled decision: the open analysis
        has the same flags as the full one (see ``ThreadState.open_analysis``),
        and it is what the agent loop decides on.
        """
        if self.corruption() is not None:
            return "corrupt"
        analysis = self.open_analysis()
        action = decide(self.state, analysis, max_steps=max_steps, max_attempts=max_attempts,
                        context_budget=context_budget)
        return shown_status(action, analysis, running=running,
                            in_progress=partial(self.in_progress_elsewhere, owner))[0]

    def events(self, from_seq: int = 1) -> list[Event]:
        """The thread's events, in order."""
        return self.store.read(self.stream, from_seq)

    def sync(self) -> None:
        """Apply events other writers appended since this record's head.

        :class:`~jixu.errors.StreamBusy` while an append of this record waits for its commit (its own
        events may be committed and not yet applied: reading now would apply them twice).
        """
        self.writer.sync()

    # --- writing ------------------------------------------------------------------------

    def holder_process(self, lease: Lease) -> object:
        """The process identity the claim of ``lease``'s holder recorded (``turn.started`` or ``turn.claimed`` of
        the latest turn with that owner and epoch), or None. Reads that turn's events: only asked while another
        owner holds the turn's lease."""
        found = self._claim_of(lease)
        return found.data.get("process") if found is not None else None

    def claim_recorded(self, lease: Lease) -> bool:
        """Whether ``lease``'s holder recorded its claim at its epoch in the active turn (``turn.started``,
        ``turn.claimed``, or an explicit recovery's ``turn.recovered``). A holder that did not, recorded nothing
        else under that epoch either: its claim is its first write, and its later ones are fenced out once
        another owner takes the lease."""
        return self._claim_of(lease) is not None

    def _claim_of(self, lease: Lease) -> Event | None:
        # The latest turn (the active one, when there is one): the lease's claims are recorded there, also after an
        # operator ended it (its holder may still be proven gone, so a resolution need not wait for the lease).
        turn = self.state.turns[-1] if self.state.turns else None
        if turn is None:
            return None
        found = None
        for event in self.store.read(self.stream, max(1, turn.started_seq)):
            data = event.data
            if data.get("epoch") != lease.epoch:
                continue
            if (event.type in ("turn.started", "turn.claimed") and data.get("owner") == lease.owner) \
                    or event.type == "turn.recovered":
                found = event
        return found

    @property
    def turn_key(self) -> str:
        """The lease key that fences the owner of this thread's active turn."""
        return f"{self.stream}/turn"

    def append(self, events: Sequence[NewEvent], fence: Fence | None = None, *,
               enqueue: tuple[str, str] | None = None) -> list[Event]:
        """Append after this record's head, now, and project (see :class:`~jixu.kernel.StreamWriter`).

        With ``fence``, the store refuses the append unless that turn claim is still current. Staged
        events (see :meth:`stage`) are committed first, in the same atomic append. Receipts are kept across
        another writer's events; anything else meets :class:`~jixu.errors.ConcurrencyError`. Nothing is
        appended to a record that was not established (:meth:`open_to_act`) or is corrupt.
        """
        self._open_to_append()
        return self.writer.append(events, fence, enqueue=enqueue)

    async def append_async(self, events: Sequence[NewEvent], fence: Fence | None, *,
                           user: bool = False) -> list[Event]:
        """:meth:`append` through the loop's shared commits, behind this record's appends in flight.

        The state moves only when the events are durable. ``user``: the caller is the thread's agent loop
        (a running user of the loop's commits, see :class:`~jixu.kernel.Commits`).
        """
        self._open_to_append()  # checked on the state the caller decided from
        return await self.writer.append_async(events, fence, user=user)

    def can_stage(self) -> bool:
        """Whether a receipt may be staged now (see :meth:`stage`)."""
        return self.writer.can_stage()

    def stage(self, events: Sequence[NewEvent], fence: Fence | None = None) -> None:
        r"""Project ``events`` now and commit them with the next append (decision 0011).

        For a call's receipt: the agent loop decides its next step from the
        state with the receipt in it, and the receipt is committed in the same
        append as that step's first event (the next intent and its dispatch
        marker), so nothing leaves the process before the receipt is durable.
        Only when :meth:`can_stage` holds (the loop's only running user, nothing
        in flight: that commit is made at once, so no other task sees the
        receipt before it is durable), and the caller appends (or
        :meth:`flush`\ es) before it yields. If that commit fails, the staged
        events are dropped from the state (reloaded from the store) and, on a
        conflict with another writer, recorded again after its events.
        """
        self.writer.stage(events, fence, provisional=self._provisional)

    def _provisional(self, encoded: PreparedEvent, seq: int) -> Event:
        """The event the projection sees for a staged one: exactly what a reload would give, but for the
        hashes and time the store assigns."""
        data = parse_json(encoded.data_json)
        keep_parsed(encoded, data)  # the stored event shares it: the same text is not parsed twice
        return Event(id=encoded.id, stream=self.stream, seq=seq, type=encoded.type, data=data,
                     meta=shared_meta(encoded.meta_json), recorded_at="", prev_hash=self.state.head_hash, hash="")

    @property
    def has_staged(self) -> bool:
        """True while events are staged (projected, not yet committed)."""
        return self.writer.has_staged

    def flush(self) -> None:
        """Commit the staged events on their own (nothing if none are staged)."""
        self.writer.flush()

    def _reloaded(self) -> tuple[ThreadState, int | None]:
        """The state rebuilt from what the store holds (staged events that failed to commit are forgotten)."""
        projected = project(self.store, self.stream, ThreadProjection())
        self._open_analysis = self._decoded = None
        if not projected.chain.valid:
            self.chain = projected.chain
        return projected.state, (self.chain_break_seq if projected.chain.valid else projected.chain.first_bad_seq)

    def meta(self, actor: str | None = None) -> dict[str, Any]:
        """The ``meta`` of events written on behalf of ``actor``."""
        return {"actor": actor or self.actor, "thread_id": self.thread_id}

    def refuse_if_corrupt(self) -> None:
        """Raise :class:`~jixu.errors.ThreadCorrupt` (first bad seq, reason) when :meth:`corruption` finds any."""
        found = self.corruption()
        if found is not None:
            raise thread_corrupt(self.thread_id, found)

    def checkpoint(self) -> bool:
        """Write a sealed checkpoint of the current state if it moved since the last one; True if written.

        The state comes from verified events (a sealed checkpoint and the chain-checked events after it, or
        the whole chain); a corrupt record writes none. With no key to seal it with
        (:class:`~jixu.errors.KeyUnavailable`), none is written (opening then replays).
        """
        self.flush()
        state = self.state
        if state.seq <= self._checkpoint_seq or self.corruption() is not None:
            return False
        # Chunks first (only those the store does not have yet), then the main checkpoint that names them.
        try:
            main, chunks = make_chunked_checkpoint(self.stream, self._projection, state, state.seq, state.head_hash)
        except KeyUnavailable:
            return False
        write_chunked_checkpoint(self.store, main, chunks, state.chunks_stored)
        self._checkpoint_seq = state.seq
        return True

    # --- operator decisions -------------------------------------------------------------

    def resolve(self, effect_id: str, resolution: str, *, resolution_id: str | None = None,
                note: str | None = None, actor: str = "operator", evidence: dict[str, Any] | None = None,
                result: Any = None, owner: str | None = None) -> bool:
        """Record an operator's decision about an unknown effect; False if it was an idempotent repeat.

        See :meth:`jixu.threads.thread.Thread.resolve_tool_outcome` for the rules. Refused with
        :class:`~jixu.errors.TurnOwned` while another process holds a live claim on the thread's turn: the
        call may still be in flight there, and its receipt would contradict the resolution. ``owner``: the
        caller's own owner name (a claim it holds itself does not stop it).
        """
        body = resolution_body(effect_id, resolution, new_id() if resolution_id is None else resolution_id, actor=actor, note=note,
                               evidence=evidence, result=result)

        def decide() -> NewEvent | None:
            self.sync()
            self.open_to_act()
            event = self.resolution_event(body)
            if event is None:
                return None
            self._refuse_while_owned_elsewhere(effect_id, owner)
            self.append([event])
            return event

        event = self._decided_again(decide)
        if event is None:
            return False
        tracing.note("jixu.resolution", {"jixu.thread.id": self.thread_id, "jixu.effect.id": effect_id,
                                         "jixu.effect.kind": event.type.split(".")[0], "jixu.resolution": resolution,
                                         "jixu.actor": actor})
        return True

    def resolution_event(self, body: dict[str, Any]) -> NewEvent | None:
        """The ``<kind>.outcome_resolved`` event of ``body`` (:func:`~jixu.recovery.resolutions.resolution_body`)
        once the thread's analysis admits it, or ``None`` when it repeats the recorded resolution exactly.

        The one admission of every resolution of a thread, an operator's (:meth:`resolve`) and a probe's (the
        agent loop): :func:`~jixu.recovery.resolutions.admit_resolution`'s rules, nothing appended here.
        """
        decision = admit_resolution(self.analysis(), body, where=f"thread {self.thread_id}")
        if decision is None:
            return None
        return NewEvent(f"{decision.kind}.outcome_resolved", body, self.meta(str(body["actor"])))

    def live_claim(self, owner: str | None = None, *, released_too: bool = False) -> LiveClaim | None:
        """The live claim of a process other than ``owner`` on the thread's turn, or None
        (:func:`~jixu.kernel.ownership.live_claim`: released, its holder proven gone with nothing left running, or
        expired with a holder not known to still run on this machine)."""
        return live_claim(self.store, self.turn_key, self.holder_process, owner, released_too=released_too)

    def unheld_reason(self, owner: str | None = None) -> str:
        """What continues the active turn that no live process holds: a worker or a program waiting on the thread
        (:data:`NOBODY_RUNS`: no claim, one given back, its holder proven gone, ``owner``'s own, which it takes
        back at once), or an operator's recovery (a claim that expired while its holder is not proven gone)."""
        turn = self.state.active_turn()
        lease = self.store.get_lease(self.turn_key)
        if turn is None or lease is None or lease.released or own_lease(lease, owner, self.holder_process) \
                or dead_holder(lease, self.holder_process) is not None:
            return NOBODY_RUNS
        late = self.store.now() - lease.expires_at
        if late <= 0 or not self.claim_recorded(lease):
            return NOBODY_RUNS  # its own holder's (a restart takes it back), or one that recorded nothing under it
        return (f"its owner {lease.owner} (epoch {lease.epoch}) stopped renewing its claim {late:.1f}s ago and is "
                f"not proven gone: recover the turn (jixu turns recover STORE {self.thread_id} {turn.turn_id} "
                f"--request-id HEX --expected-epoch {lease.epoch}), or let a worker with --takeover safe continue "
                "it when nothing of it is in doubt")

    def in_progress_elsewhere(self, owner: str | None = None) -> str | None:
        """Why the thread's turn is in progress in a process other than ``owner`` (its live claim, even on a turn
        an operator ended: its calls may still be in flight), or None (see :func:`shown_status`)."""
        turn = self.state.turns[-1] if self.state.turns else None
        claim = self.live_claim(owner) if turn is not None else None
        if turn is None or claim is None:
            return None
        return (f"turn {turn.turn_id} is in progress in {claim.lease.owner} (epoch {claim.lease.epoch}, "
                f"{claim.held_for()}): what it has in flight settles there")

    def _refuse_while_owned_elsewhere(self, effect_id: str, owner: str | None) -> None:
        """:class:`~jixu.errors.TurnOwned` while a process other than ``owner`` holds a live claim on the turn, or
        its last holder, gone, left processes running (a drained process's cut-off call)."""
        claim = self.live_claim(owner, released_too=True)
        if claim is None:
            return
        raise TurnOwned(f"effect {effect_id} may still be in flight: thread {self.thread_id}'s turn is owned by "
                        f"{claim.lease.owner} (epoch {claim.lease.epoch}; {claim.held_for()}). Resolve it once that "
                        "process has stopped (its claim released or expired), or recover the turn first (jixu turns "
                        "recover)", thread_id=self.thread_id, effect_id=effect_id)

    def decide_parked(self, effect_id: str, decision_phase: str, *, actor: str = "operator",
                      note: str | None = None) -> None:
        """Record ``approved`` or ``denied`` for a parked call."""
        check_text(effect_id, "effect_id", 100, required=True)
        if decision_phase not in ("approved", "denied"):
            raise InvalidInput("the decision must be 'approved' or 'denied'", field="decision")
        check_text(actor, "actor", 200, required=True)
        check_text(note, "note", MAX_NOTE_CHARS)

        def decide() -> None:
            self.sync()
            self.open_to_act()
            decision = self.analysis().decisions.get(effect_id)
            if decision is None:
                raise NotFound(f"thread {self.thread_id} has no effect {effect_id!r}", effect_id=effect_id)
            if decision.state != "parked":
                # Another operator may have decided it a moment ago: the reason says how (denied, approved, ...).
                raise EffectNotParked(f"effect {effect_id} is {decision.state} ({decision.reason}), not parked"
                                      + (": another decision was recorded first" if decision.reason in (
                                          "denied", "approved_not_dispatched") else ""),
                                      effect_id=effect_id, state=decision.state, reason=decision.reason)
            self.append([NewEvent(f"{decision.kind}.{decision_phase}",
                                  {"effect_id": effect_id, "actor": actor, "note": note}, self.meta(actor))])

        self._decided_again(decide)

    def _decided_again(self, decide: Callable[[], _T]) -> _T:
        """``decide()``: an operator's decision taken on the events read and appended after them. When another
        writer appended first (a durable run's steps, which run while one of them is parked), the refused append
        was decided on an old head: decide again on the new events, a few times."""
        for tries_left in reversed(range(DECISION_TRIES)):
            try:
                return decide()
            except ConcurrencyError:
                if not tries_left:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises

    def start_turn(self, text: str, *, owner: str | None = None, ttl: float = DEFAULT_LEASE_TTL,
                   enqueue: tuple[str, str] | None = None) -> tuple[str, Fence | None]:
        """Record ``turn.started``; returns (turn id, fence).

        With ``owner``, the thread's turn lease is claimed first and the turn is
        started fenced by it (:class:`~jixu.errors.TurnOwned` while another
        process holds a live claim). Without, the turn is queued: recorded
        unowned, for whichever process (a worker, the owning application)
        claims it next; ``enqueue`` = ``(key, group)`` puts it in the work
        queue in the same transaction (the scheduling layer says which).
        """
        turn_id, fence, events = self._turn_start(text, owner, ttl)
        with given_back_on_failure(self.store, fence):  # not recorded: a turn nobody runs
            self.append(events, fence, enqueue=enqueue)
        return turn_id, fence

    async def start_turn_async(self, text: str, *, owner: str | None = None, ttl: float = DEFAULT_LEASE_TTL,
                               steps: bool = False, run_key: str | None = None) -> tuple[str, Fence | None]:
        """:meth:`start_turn`, with ``turn.started`` committed through the loop's shared commits (see
        :meth:`append_async`): turns started together on one event loop share a commit, and none holds the
        loop while it commits. Another writer that appended first (an operator's note, say) is folded in and the
        start decided again on its events (:class:`~jixu.errors.ThreadBusy` if they started a turn, or a durable run
        with ``run_key``)."""
        for tries_left in reversed(range(START_TRIES)):
            turn_id, fence, events = self._turn_start(text, owner, ttl, steps=steps, run_key=run_key)
            try:
                with given_back_on_failure(self.store, fence):
                    await self.append_async(events, fence)
            except ConcurrencyError:
                if not tries_left:
                    raise
                continue  # the writer folded the other events: decide again on them
            return turn_id, fence
        raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises

    def _turn_start(self, text: str, owner: str | None, ttl: float, *, steps: bool = False,
                    run_key: str | None = None) -> tuple[str, Fence | None, list[NewEvent]]:
        """Check a new turn, claim its lease (with ``owner``); its id, fence and ``turn.started`` event.

        ``steps``: a durable run of the caller's own code (``Harness.durable``), which needs an owner; ``run_key``
        names it for good (decided on the events the start is appended after: two starts never share a key)."""
        check_text(text, "input", MAX_INPUT_CHARS, required=True)
        self.open_to_act()
        if run_key is not None and self.state.keyed_run(run_key) is not None:
            raise ThreadBusy(f"thread {self.thread_id} already has a durable run with key {run_key!r}",
                             thread_id=self.thread_id, run_key=run_key)
        if self.state.active_turn() is not None:
            raise ThreadBusy(f"thread {self.thread_id} already has an active turn", thread_id=self.thread_id)
        if owner is None:
            turn_id = new_id()
            return turn_id, None, [NewEvent("turn.started", {"turn_id": turn_id, "input": text, "owner": None,
                                                             "epoch": 0, "queued": True}, self.meta())]
        try:
            fence = acquire_claim(self.store, self.turn_key, owner, ttl)
            claim_taken_again(self.turn_key)  # a give-back waiting for an earlier turn's calls must not take it
        except LeaseHeld as error:
            raise TurnOwned(f"thread {self.thread_id}'s turn lease is held by {error.details.get('owner')!r}; "
                            "wait for it to finish", thread_id=self.thread_id) from error
        turn_id = new_id()
        started: dict[str, Any] = {"turn_id": turn_id, "input": text, "owner": owner, "epoch": fence.epoch,
                                   "process": process_identity()}
        if steps:
            started["steps"] = True
        if run_key is not None:
            started["run_key"] = run_key
        return turn_id, fence, [NewEvent("turn.started", started, self.meta())]

    def end_running_turn(self, reason: str, fence: Fence | None = None) -> bool:
        """Record that the active turn was interrupted; False if no turn was active."""
        self.open_to_act()
        turn = self.state.active_turn()
        if turn is None:
            return False
        self.append([NewEvent("turn.ended", {"turn_id": turn.turn_id, "outcome": "interrupted",
                                             "reason": str(reason)}, self.meta())], fence)
        return True

    def interrupt(self, *, actor: str = "operator", reason: str | None = None) -> str:
        """Stop the active turn from any process (decision 0071): ``"ended"`` or ``"requested"``.

        While a process runs the turn (a live claim), the ask is recorded (``turn.interrupt_requested``) and that
        process ends the turn ``interrupted`` at its next step: what it has in flight finishes and is recorded,
        nothing new starts. While none does (a queued turn, one waiting for an operator or paused, its owner
        gone), the turn is ended here, under a claim taken for it. :class:`~jixu.errors.NoActiveTurn` without a
        turn; a durable run is refused (:class:`~jixu.errors.ThreadBusy`: its own code stops it); nothing is
        written on a corrupt thread.
        """
        check_text(actor, "actor", 200, required=True)
        check_text(reason, "reason", MAX_NOTE_CHARS)

        def decide() -> str:
            self.sync()
            self.open_to_act()
            turn = self.state.active_turn()
            if turn is None:
                raise NoActiveTurn(f"thread {self.thread_id} has no turn in progress to interrupt",
                                   thread_id=self.thread_id)
            if turn.steps:
                raise ThreadBusy(f"thread {self.thread_id}'s turn {turn.turn_id} is a durable run of code: its code "
                                 "stops it (or stop the process running it)", thread_id=self.thread_id,
                                 turn_id=turn.turn_id)
            request: JSONObject = {"turn_id": turn.turn_id, "actor": actor, "reason": reason}
            if self.live_claim() is not None:
                if turn.interrupt is None:
                    self.append([NewEvent("turn.interrupt_requested", request, self.meta(actor))])
                return "requested"
            lease = self.store.get_lease(self.turn_key)
            try:
                fence, _ = recovery_claim(self.store, self.turn_key, f"interrupt:{new_id()}", RECOVERY_TTL,
                                          expected_epoch=lease.epoch if lease is not None else 0,
                                          require_expired=False)  # nobody runs it (no live claim, above)
            except (FencingError, LeaseHeld) as error:
                raise ConcurrencyError(f"turn {turn.turn_id} was claimed meanwhile",
                                       thread_id=self.thread_id) from error
            try:
                self.append([interrupted_end(turn.turn_id, request, self.meta(actor))], fence)
            finally:
                release(self.store, fence)
            return "ended"

        return self._decided_again(decide)

    def resume_turn(self, *, actor: str = "operator", note: str | None = None) -> None:
        """Record an explicit resume of a paused turn (the application's loop then continues it)."""
        check_text(actor, "actor", 200, required=True)
        check_text(note, "note", MAX_NOTE_CHARS)

        def decide() -> None:
            self.sync()
            self.open_to_act()
            turn = self.state.active_turn()
            if turn is None or turn.pause is None:
                raise TurnNotPaused(f"thread {self.thread_id} has no paused turn to resume",
                                    thread_id=self.thread_id)
            self.append([NewEvent("turn.resumed", {"turn_id": turn.turn_id, "reason": "explicit", "actor": actor,
                                                   "note": note}, self.meta(actor))])

        self._decided_again(decide)

    def ownership(self) -> dict[str, Any] | None:
        """Who owns the active turn, by the store's clock: owner, epoch, expiry, heartbeat, expired."""
        turn = self.state.active_turn()
        if turn is None:
            return None
        lease = self.store.get_lease(self.turn_key)
        now = self.store.now()
        if lease is None:
            return {"turn_id": turn.turn_id, "status": turn.status, "owner": None, "epoch": 0,
                    "expires_at": None, "heartbeat_at": None, "released": False, "expired": False,
                    "legacy": True}
        return {"turn_id": turn.turn_id, "status": turn.status, "owner": lease.owner, "epoch": lease.epoch,
                "expires_at": lease.expires_at, "heartbeat_at": lease.heartbeat_at, "released": lease.released,
                "expired": lease.expires_at <= now, "legacy": False, "store_now": now}

    def recovery_reason(self, ownership: dict[str, Any] | None) -> str | None:
        """How :meth:`recover_turn` would accept the active turn now, given :meth:`ownership`'s answer:
        ``"lease_expired"`` (its owner's lease expired by the store's clock), ``"legacy_confirmed_stopped"``
        (recorded before turn ownership existed: on the operator's assertion that its process stopped), or
        ``None`` (no active turn, already recovered, or still owned). A forecast for offering the control; the
        store decides when the recovery is made."""
        turn = self.state.active_turn()
        if ownership is None or turn is None or turn.status == "needs_reconciliation":
            return None
        if ownership.get("released"):
            # Given back (a loop that stopped for an operator, a drain): nobody holds it, nothing to fence out (an
            # audit: the Studio offered every waiting thread's recovery, "held by an owner that is gone").
            return None
        if _legacy_turn(turn):
            return "legacy_confirmed_stopped" if ownership.get("legacy") else None
        return "lease_expired" if ownership.get("expired") and not ownership.get("legacy") else None

    def recover_turn(self, turn_id: str, *, request_id: str, expected_epoch: int,
                     legacy_confirmed_stopped: bool = False, actor: str = "operator",
                     note: str | None = None) -> dict[str, Any]:
        """Fence out the owner of an expired turn and record an immutable recovery receipt.

        The store verifies expiry by its own clock and increments the epoch;
        the turn becomes ``needs_reconciliation``: nothing is retried, no model
        is called, and a late reply from the former owner is refused. A turn
        recorded before ownership existed (epoch 0, no owner) needs
        ``legacy_confirmed_stopped=True``, your assertion that its process
        stopped, recorded as such. ``note`` (optional) is the operator's reason,
        recorded in the receipt. Idempotent on ``request_id`` (32 hex
        characters): the same request returns the original receipt; the same id
        with another body raises :class:`~jixu.errors.ResolutionConflict`.
        """
        check_text(turn_id, "turn_id", 100, required=True)
        if not is_valid_id(turn_id):
            raise InvalidId(f"turn id {turn_id!r} is not a jixu id (26 characters of Crockford base32)",
                            field="turn_id")
        if not isinstance(request_id, str) or not REQUEST_ID.match(request_id):
            raise InvalidInput("request_id must be 32 lower-case hex characters", field="request_id")
        if isinstance(expected_epoch, bool) or not isinstance(expected_epoch, int) or expected_epoch < 0:
            raise InvalidInput("expected_epoch must be an integer >= 0", field="expected_epoch")
        if not isinstance(legacy_confirmed_stopped, bool):
            raise InvalidInput("legacy_confirmed_stopped must be true or false", field="legacy_confirmed_stopped")
        check_text(actor, "actor", 200, required=True)
        body: dict[str, Any] = {"turn_id": turn_id, "expected_epoch": expected_epoch,
                                "legacy_confirmed_stopped": legacy_confirmed_stopped}
        if note is not None:
            check_text(note, "note", MAX_NOTE_CHARS)
            body["note"] = note
        self.sync()
        self.open_to_act()
        earlier = self.state.recovery(request_id)
        if earlier is not None:
            if {k: earlier.get(k) for k in body} == body:
                return earlier
            raise ResolutionConflict(f"recovery request {request_id} was already used with another body",
                                     request_id=request_id)
        turn = self.state.active_turn()
        if turn is None or turn.turn_id != turn_id:
            raise NotFound(f"turn {turn_id} is not the active turn of thread {self.thread_id}", turn_id=turn_id)
        if turn.status == "needs_reconciliation":
            raise ThreadBusy(f"turn {turn_id} was already recovered; reconcile its effects and continue it",
                             turn_id=turn_id)
        legacy = _legacy_turn(turn)
        if legacy and not legacy_confirmed_stopped:
            raise InvalidInput(f"turn {turn_id} was recorded before turn ownership existed (epoch 0, no owner): "
                               "recover it only with legacy_confirmed_stopped=True, asserting that its process "
                               "has stopped", field="legacy_confirmed_stopped")
        if not legacy and legacy_confirmed_stopped:
            raise InvalidInput(f"turn {turn_id} has an owner; it is recovered by lease expiry, not by assertion",
                               field="legacy_confirmed_stopped")
        claim = None if legacy else self.live_claim()
        if claim is not None:  # its holder (or what it left running) can still act: a recovery would not stop it
            raise TurnOwned(f"turn {turn_id} is still owned by {claim.lease.owner} (epoch {claim.lease.epoch}; "
                            f"{claim.held_for()}). Recover it only after its lease expired and its process stopped",
                            thread_id=self.thread_id, turn_id=turn_id)
        try:
            fence, previous = recovery_claim(self.store, self.turn_key, f"recovery:{request_id}", RECOVERY_TTL,
                                             expected_epoch=expected_epoch, require_expired=not legacy)
        except LeaseHeld as error:
            raise TurnOwned(f"turn {turn_id} is still owned: {error.message}. Recover it only after its "
                            "lease expired", thread_id=self.thread_id, turn_id=turn_id) from error
        receipt = {**body, "request_id": request_id, "epoch": fence.epoch, "actor": actor,
                   "previous_owner": previous.owner if previous else None,
                   "previous_expires_at": previous.expires_at if previous else None,
                   "reason": "legacy_confirmed_stopped" if legacy else "lease_expired",
                   "store_time": self.store.now()}
        self.append([NewEvent("turn.recovered", receipt, self.meta(actor))], fence)
        release(self.store, fence)
        return receipt

    # --- replay and fork ----------------------------------------------------------------

    def replay(self, upto: int | str | None = None) -> State:
        """Rebuild the state from events alone, calling no driver; decisions come from the resolver afresh.

        Of a broken history only the events before the first bad one are folded, as opening does: the replay's
        state is the opening's (SPEC 3)."""
        last = self.resolve_upto(upto)
        report = verdict(self.store, self.stream, checkpoints=(self._projection.name,))
        break_seq = None if report.valid else report.first_bad_seq
        if break_seq is not None:
            last = min(last, break_seq - 1) if last is not None else break_seq - 1
        events = self.store.read(self.stream, 1, last) if last is None or last >= 1 else []
        state = fold(self._projection, events)
        analysis = RecoveryResolver.analyze(events, chain_break_seq=break_seq)
        seqs = {event.id: event.seq for event in events}
        found = corruption(self.stream, chain=report, analysis=analysis, contradiction=state.contradiction,
                           seq_of=seqs.get)
        return self._whole_reply(build_state(state, analysis, corrupt=found))

    def fork(self, at: str, *, agent_record: dict[str, Any] | None = None, input: str | None = None,
             enqueue: Callable[[str], tuple[str, str]] | None = None) -> ThreadLog:
        """Record a child thread with this thread's state at event ``at`` (open effects not inherited).

        The inherited state travels in ``thread.inherited`` chunks appended with
        the ``thread.forked`` event in one atomic batch, so any size fits the
        per-event limit. With ``input``, the child's first turn is recorded too,
        queued, and ``enqueue(child_id)`` = ``(key, group)`` puts it in the work
        queue in the same transaction (the scheduling layer says which).
        """
        if input is not None:
            check_text(input, "input", MAX_INPUT_CHARS, required=True)
        if not isinstance(at, str) or not is_valid_id(at):
            raise InvalidInput(f"fork point {at!r} is not an event id", field="at")
        event = self.store.get_event(at)
        if event is None or event.stream != self.stream:
            raise NotFound(f"event {at} is not in thread {self.thread_id}; fork at one of its events",
                           event_id=at)
        self.establish()
        self.writer.heed_recorded_break()  # a break another process recorded since bounds the fork too
        found = self.corruption()
        if found is not None and event.seq >= found.sound_before:
            error = thread_corrupt(self.thread_id, found)
            error.message = (f"thread {self.thread_id} is corrupt from event #{found.sound_before} on "
                             f"({found.summary()}); fork it at an earlier event" if found.sound_before > 1 else
                             f"thread {self.thread_id} is corrupt ({found.summary()}); no event of it can be "
                             "forked from")
            error.args = (error.message,)
            raise error
        events = self.store.read(self.stream, 1, event.seq)
        parent_state = fold(self._projection, events)
        if RecoveryResolver.analyze(events).has_corruption or parent_state.contradiction:
            raise ThreadCorrupt(f"thread {self.thread_id} is corrupt at or before event {at}; cannot fork there")
        forked_id = new_id()
        child_state = fork_state(parent_state, cause=forked_id)
        child_id = new_id()
        parent = {"thread_id": self.thread_id, "event_id": event.id, "seq": event.seq, "hash": event.hash}
        child_state.thread_id = child_id
        child_state.parent = parent
        text = canonical_text(self._projection.dump(child_state), max_nesting=STATE_NESTING)
        parts = [text[i:i + INHERIT_CHUNK_CHARS] for i in range(0, len(text), INHERIT_CHUNK_CHARS)] or [""]
        meta = self.meta()
        project_name = indexed_project(parent_state.metadata)
        batch = [NewEvent("thread.forked", {
            "thread_id": child_id, "parent": parent, "agent": agent_record or parent_state.agent,
            "metadata": parent_state.metadata, "inherited_parts": len(parts)},
            meta if project_name is None else {**meta, "project": project_name}, id=forked_id)]
        batch.extend(NewEvent("thread.inherited", {"part": i, "of": len(parts), "text": part}, meta)
                     for i, part in enumerate(parts))
        if input is not None:
            batch.append(NewEvent("turn.started", {"turn_id": new_id(), "input": input, "owner": None, "epoch": 0,
                                                   "queued": True}, meta))
        stored = record(self.store, stream_of(child_id), batch, 0, genesis_hash=event.hash,
                        enqueue=enqueue(child_id) if enqueue is not None and input is not None else None)
        state = ThreadProjection().initial()
        for item in stored:
            state = self._projection.apply(state, item)
        return ThreadLog(self.store, state, actor=self.actor)

    def resolve_upto(self, upto: int | str | None) -> int | None:
        """A seq from a seq or an event id of this thread (None stays None)."""
        if upto is None:
            return None
        if isinstance(upto, bool):
            raise InvalidInput("upto must be a seq or an event id", field="upto")
        if isinstance(upto, int):
            info = self.store.stream_info(self.stream)
            head = info.head_seq if info else 0
            if not 1 <= upto <= head:
                raise InvalidInput(f"upto {upto} is outside thread {self.thread_id}'s events (1..{head})",
                                   field="upto")
            return upto
        if not isinstance(upto, str) or not is_valid_id(upto):
            raise InvalidInput(f"upto {upto!r} is neither a seq nor an event id", field="upto")
        event = self.store.get_event(upto)
        if event is None or event.stream != self.stream:
            raise NotFound(f"event {upto} is not in thread {self.thread_id}", event_id=upto)
        return event.seq


def interrupted_end(turn_id: str, request: JSONObject, meta: dict[str, Any]) -> NewEvent:
    """The ``turn.ended`` of a turn stopped because ``request`` (``turn.interrupt_requested`` data) asked it."""
    by, why = request.get("actor"), request.get("reason")
    return NewEvent("turn.ended", {"turn_id": turn_id, "outcome": "interrupted", "requested_by": by,
                                   "reason": f"interrupted by {by}" + (f": {why}" if why else "")}, meta)


def thread_corrupt(thread_id: str, found: Corruption) -> ThreadCorrupt:
    """The error every refusal of a corrupt thread raises: what is wrong, where, and what to do."""
    return ThreadCorrupt(f"thread {thread_id} is corrupt: {found.summary()}. It will not run and takes no decision; "
                         f"inspect it with `jixu threads verify STORE {thread_id}`", thread_id=thread_id,
                         stream=found.stream_name, first_bad_seq=found.first_bad_seq, reason=found.reason,
                         detail=found.detail)


def _legacy_turn(turn: Turn) -> bool:
    """Whether ``turn`` was recorded before turn ownership existed (no owner, not queued for a worker)."""
    return turn.owner is None and not turn.queued


def _seal_staged(state: ThreadState, stored: list[Event]) -> ThreadState:
    """Put the stored events (real time and hashes) where the projection kept their provisional copies."""
    by_id = {event.id: event for event in stored}
    for group in state.open_events.values():
        for index, event in enumerate(group):
            if event.id in by_id:
                group[index] = by_id[event.id]
    state.stray_events = [by_id.get(event.id, event) for event in state.stray_events]
    if state.seq == stored[-1].seq:
        state.head_hash = stored[-1].hash
    return state


__all__ = ["DEFAULT_MAX_ATTEMPTS", "DEFAULT_MAX_STEPS", "DEFAULT_PROJECT", "THREAD_PREFIX", "State", "ThreadLog",
           "build_state", "check_text", "indexed_project", "probe_text", "stream_of", "thread_corrupt"]

"""The pure projection of a thread's events into its state.

``ThreadProjection.apply`` folds one event into a :class:`ThreadState` and
does no I/O. Effect status is never derived here: the projection keeps the
lifecycle events of effects that are still open and asks the
:class:`~jixu.recovery.RecoveryResolver` about them; once the resolver calls
an effect settled (``completed``, or ``unknown`` with an operator resolution)
only its decision is kept. An event that touches a settled effect marks the
state ``contradiction``: the caller must then analyze the full history.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import TYPE_CHECKING, Any

from jixu.errors import StoreError
from jixu.ledger.encoding import JSONObject
from jixu.ledger.event import Event
from jixu.ledger.projection import ChunkSource, chunk_digest
from jixu.recovery import Analysis, EffectDecision, RecoveryResolver, decide_effect
from jixu.recovery.decision_text import decode_decision, encode_decision, ordinary_decision_text
from jixu.threads.compaction import summary_message
from jixu.threads.model import unfinished_answer

REDUCER_VERSION = 11
"""5: probes (``state.probes``, the ``probe.*`` effects and the answers they recorded). 6: agent revisions
(``state.revisions``, ``agent.revised``, each turn's ``revisions``) and durable runs (``Turn.steps``). 7:
``closed_calls`` holds effect ids, not tool call ids (a model may reuse a call id in a later turn). 8: an answer
with tool calls cut off at a limit is the turn's failure, not calls to run. 9: a durable run's key
(``Turn.run_key``) and the turns a fork inherited (``Turn.inherited``). 10: only an answer the model finished runs its
calls (:func:`~jixu.threads.model.unfinished_answer`: a stop reason not known to end a finished answer, such as
Anthropic's ``refusal`` or an incomplete Responses answer, is the turn's failure too). 11: an interrupt another
process asked for (``Turn.interrupt``, ``turn.interrupt_requested``)."""


LIFECYCLE_PHASES = frozenset(
    {"requested", "parked", "approved", "denied", "dispatched", "completed", "failed", "outcome_resolved"}
)
_SETTLING_PHASES = frozenset({"completed", "failed", "denied", "outcome_resolved"})
_TOKEN_KEYS = ("input_tokens", "output_tokens", "cached_tokens")

RESOLUTION_MESSAGES = {
    "occurred": "An operator confirmed that this call happened.",
    "not_occurred": "An operator confirmed that this call did NOT happen. You may call the tool again "
                    "if it is still needed.",
    "abandoned_unknown": "The outcome of this call is unknown: an operator accepted the uncertainty "
                         "without confirming whether it happened.",
}
PROBE_RESOLUTION_MESSAGES = {
    "occurred": "A probe of the outside system found that this call happened.",
    "not_occurred": "A probe of the outside system found that this call did NOT happen. You may call the tool "
                    "again if it is still needed.",
}
"""What the model is told when a tool's probe settled its call (the resolution's actor is ``probe:<tool>``)."""
PROBE_ACTOR_PREFIX = "probe:"
NOT_INHERITED_MESSAGE = "This tool call was not carried into the fork: it did not run in this thread."
INTERRUPTED_MESSAGE = ("The turn ended before this call's result was recorded; its outcome is unknown. "
                       "Do not assume it happened or that it did not.")


_TOOL_CONTENT_JSON = json.JSONEncoder(ensure_ascii=False, sort_keys=True)
# Module-level encoder: json.dumps with options builds a new encoder on every call.


SETTLED_CHUNK = 1000
"""Settled decisions per checkpoint chunk."""
MESSAGES_CHUNK = 1000
"""Messages per checkpoint chunk."""

# Chunk texts: compact JSON, keys sorted, so equal content always has the same digest.
_CHUNK_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


class _SettledChunk:
    """Up to :data:`SETTLED_CHUNK` decisions sealed into one immutable checkpoint chunk."""

    __slots__ = ("digest", "ids", "rows")

    def __init__(self, digest: str, ids: list[str], rows: dict[str, str] | None) -> None:
        self.digest = digest
        self.ids = ids
        self.rows = rows
        """The decisions' text by effect id; ``None`` until read from the checkpoint's chunk."""


def _settled_chunk_text(ids: list[str], rows: dict[str, str]) -> str:
    return _CHUNK_JSON.encode([[effect_id, rows[effect_id]] for effect_id in ids])


class SettledDecisions(MutableMapping[str, EffectDecision]):
    """The resolver's decisions on settled effects, kept as compact JSON text and decoded on access.

    A long thread settles one effect per model or tool call, so this mapping
    grows with history. Membership (the reducer's only question on the hot
    path) costs a dict lookup; a decision is decoded only when someone asks
    for it (``analysis()``, a resolution's idempotency check), and the decoded
    object is not kept, so the state's memory stays about the size of the text.

    For checkpoints, decisions are sealed in settle order into chunks of
    :data:`SETTLED_CHUNK` (:meth:`seal`). A state loaded from a checkpoint
    knows which chunk holds each settled effect but reads a chunk's texts only
    when one of its decisions is asked for.
    """

    __slots__ = ("_chunks", "_rows", "_source", "_where")

    def __init__(self, rows: dict[str, str] | None = None) -> None:
        self._rows: dict[str, str] = rows if rows is not None else {}
        """Decisions not sealed into a chunk yet, in settle order."""
        self._chunks: list[_SettledChunk] = []
        self._where: dict[str, int] = {}
        """Effect id -> index of the chunk that holds its decision."""
        self._source: ChunkSource[ThreadState] | None = None

    def _chunk_rows(self, index: int) -> dict[str, str]:
        chunk = self._chunks[index]
        if chunk.rows is None:
            chunk.rows = self._read_chunk(chunk)
        return chunk.rows

    def _read_chunk(self, chunk: _SettledChunk) -> dict[str, str]:
        source = self._source
        if source is None:
            raise StoreError(f"settled decisions chunk {chunk.digest} has no store to be read from")
        text = source(chunk.digest)
        if text is not None:
            try:
                pairs = json.loads(text)
                rows = {str(pair[0]): pair[1] for pair in pairs}
                if list(rows) == chunk.ids and all(type(value) is str for value in rows.values()):
                    return rows
            except (ValueError, TypeError, IndexError, KeyError):
                pass
            source.report("chunk_mismatch")
        # The chunk cannot be used: take the decisions from the state replayed up to the checkpoint.
        replayed = source.replayed().settled
        try:
            rows = {effect_id: replayed.text(effect_id) for effect_id in chunk.ids}
        except KeyError as missing:
            raise StoreError(f"checkpoint chunk {chunk.digest} names effect {missing} that the events up to the "
                             "checkpoint never settled") from None
        chunk.digest = chunk_digest(_settled_chunk_text(chunk.ids, rows))  # written again at the next checkpoint
        return rows

    def text(self, effect_id: str) -> str:
        """The compact text of one decision (``KeyError`` if the effect is not settled)."""
        found = self._rows.get(effect_id)
        if found is not None:
            return found
        return self._chunk_rows(self._where[effect_id])[effect_id]

    def __getitem__(self, effect_id: str) -> EffectDecision:
        return decode_decision(self.text(effect_id))

    def __setitem__(self, effect_id: str, decision: EffectDecision) -> None:
        self.set_text(effect_id, encode_decision(decision))

    def set_text(self, effect_id: str, text: str) -> None:
        """Keep a decision already written as text (:func:`encode_decision`'s)."""
        if effect_id in self._where:
            self._unseal()
        self._rows[effect_id] = text

    def __delitem__(self, effect_id: str) -> None:
        if effect_id in self._where:
            self._unseal()
        del self._rows[effect_id]

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk.ids
        yield from self._rows

    def __len__(self) -> int:
        return len(self._where) + len(self._rows)

    def __contains__(self, effect_id: object) -> bool:
        return effect_id in self._rows or effect_id in self._where

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SettledDecisions):
            return self.encoded() == other.encoded()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SettledDecisions({len(self)} effects)"

    def encoded(self) -> dict[str, str]:
        """The compact text of every decision, by effect id (reads every chunk)."""
        if not self._chunks:
            return self._rows
        rows: dict[str, str] = {}
        for index in range(len(self._chunks)):
            rows.update(self._chunk_rows(index))
        rows.update(self._rows)
        return rows

    def _unseal(self) -> None:
        """Back to one mapping of texts (a sealed decision is replaced or removed: rare)."""
        rows = dict(self.encoded())
        self._rows, self._chunks, self._where = rows, [], {}

    def seal(self) -> list[tuple[_SettledChunk, str]]:
        """Seal the oldest unsealed decisions into full chunks; returns the new chunks with their texts."""
        sealed = []
        while len(self._rows) >= SETTLED_CHUNK:
            ids = list(islice(self._rows, SETTLED_CHUNK))
            rows = {effect_id: self._rows.pop(effect_id) for effect_id in ids}
            text = _settled_chunk_text(ids, rows)
            chunk = _SettledChunk(chunk_digest(text), ids, rows)
            index = len(self._chunks)
            self._chunks.append(chunk)
            for effect_id in ids:
                self._where[effect_id] = index
            sealed.append((chunk, text))
        return sealed

    def dump_chunked(self, stored: set[str]) -> tuple[JSONObject, dict[str, str]]:
        """The checkpoint form (chunk digests with their effect ids, the unsealed texts) and the texts of
        the chunks whose digest is not in ``stored`` and whose decisions are in memory."""
        texts = {chunk.digest: text for chunk, text in self.seal()}
        for chunk in self._chunks:
            if chunk.digest not in stored and chunk.digest not in texts and chunk.rows is not None:
                texts[chunk.digest] = _settled_chunk_text(chunk.ids, chunk.rows)
        data = {"chunks": [[chunk.digest, chunk.ids] for chunk in self._chunks], "tail": dict(self._rows)}
        return data, texts

    @classmethod
    def from_chunked(cls, data: dict[str, Any], source: ChunkSource[ThreadState]) -> SettledDecisions:
        """From :meth:`dump_chunked`'s checkpoint form; chunks are read from ``source`` when needed."""
        settled = cls({str(k): str(v) for k, v in data["tail"].items()})
        settled._source = source
        for index, (digest, ids) in enumerate(data["chunks"]):
            chunk = _SettledChunk(str(digest), list(map(str, ids)), None)
            settled._chunks.append(chunk)
            settled._where.update(dict.fromkeys(chunk.ids, index))
        return settled

    def chunk_digests(self) -> list[str]:
        """The digests of the sealed chunks."""
        return [chunk.digest for chunk in self._chunks]

    @classmethod
    def from_dump(cls, data: dict[str, Any]) -> SettledDecisions:
        """From a checkpoint or fork record: compact text (reducer >= 4) or decision dicts (older records)."""
        rows = {}
        for effect_id, value in data.items():
            rows[str(effect_id)] = value if isinstance(value, str) else encode_decision(
                EffectDecision.from_dict(value))
        return cls(rows)


class _Conversation:
    """The messages of a state loaded from a chunked checkpoint, not decoded yet."""

    __slots__ = ("chunks", "events", "messages", "source")

    def __init__(self, chunks: list[tuple[str, int]], messages: list[JSONObject], events: list[str],
                 source: ChunkSource[ThreadState]) -> None:
        self.chunks = chunks
        self.messages = messages
        self.events = events
        self.source = source

    def materialize(self) -> tuple[list[JSONObject], list[str]]:
        """Every message and source event id: the chunks (verified) then the unsealed tail."""
        messages: list[JSONObject] = []
        events: list[str] = []
        source = self.source
        for digest, count in self.chunks:
            part = self._read(digest, count)
            if part is None:
                replayed = source.replayed()
                start = len(messages)
                part = (replayed.messages[start:start + count], replayed.message_events[start:start + count])
            messages.extend(part[0])
            events.extend(part[1])
        messages.extend(self.messages)
        events.extend(self.events)
        return messages, events

    def _read(self, digest: str, count: int) -> tuple[list[JSONObject], list[str]] | None:
        text = self.source(digest)
        if text is None:
            return None
        try:
            part = json.loads(text)
            messages, events = part["messages"], part["message_events"]
            if (type(messages) is list and type(events) is list and len(messages) == len(events) == count
                    and all(type(m) is dict for m in messages) and all(type(e) is str for e in events)):
                return messages, events
        except (ValueError, TypeError, KeyError):
            pass
        self.source.report("chunk_mismatch")
        return None


@dataclass
class Turn:
    """One ``send``: its input, and how it ended."""

    turn_id: str
    input: str
    status: str = "running"  # running | needs_reconciliation | completed | failed | interrupted
    reply: str | None = None
    reply_artifact: JSONObject | None = None
    """Where a long reply is stored (``reply`` is then a short placeholder naming it)."""
    error: JSONObject | None = None
    model_calls: int = 0
    started_seq: int = 0
    ended_seq: int | None = None
    message_index: int = 0
    """Index of this turn's user message in the conversation."""
    owner: str | None = None
    """The process that claimed the turn last (``None`` for turns recorded before ownership existed)."""
    epoch: int = 0
    """The claim epoch of that owner's lease; 0 for a legacy turn."""
    recoveries: list[JSONObject] = field(default_factory=list)
    """Immutable receipts of explicit recoveries (``turn.recovered`` data)."""
    queued: bool = False
    """Recorded without an owner, for the next process that claims it (not a legacy turn)."""
    failure: JSONObject | None = None
    """The latest model failure not yet acted on: ``{effect_id, error, indeterminate}``."""
    pause: JSONObject | None = None
    """The current pause (``turn.paused`` data) while the turn is paused."""
    auto_retries: int = 0
    """Automatic resumes since the last successful model call or explicit resume."""
    compaction_failed: bool = False
    """A compaction of this turn failed: the turn keeps the full context and does not try again."""
    revisions: list[int] = field(default_factory=list)
    """The agent revisions the turn ran under: the one current when it started, and one more for each
    ``agent.revised`` recorded while it was active (empty for turns projected before revisions existed)."""
    steps: bool = False
    """A durable run of code the user owns (``Harness.durable``): no model call, its steps are the tool calls."""
    run_key: str | None = None
    """The key the durable run was started with (``Harness.durable(run_key=...)``): it names the run for good."""
    inherited: bool = False
    """Recorded in the thread this one was forked from (its events are in the parent's stream, not this one's)."""
    interrupt: JSONObject | None = None
    """An interrupt asked by another process while this one ran (``turn.interrupt_requested`` data): the
    process running the turn ends it at its next step."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {"turn_id": self.turn_id, "input": self.input, "status": self.status, "reply": self.reply,
                "reply_artifact": self.reply_artifact, "error": self.error, "model_calls": self.model_calls, "started_seq": self.started_seq,
                "ended_seq": self.ended_seq, "message_index": self.message_index, "owner": self.owner,
                "epoch": self.epoch, "recoveries": self.recoveries, "queued": self.queued,
                "failure": self.failure, "pause": self.pause, "auto_retries": self.auto_retries,
                "compaction_failed": self.compaction_failed, "revisions": self.revisions, "steps": self.steps,
                "run_key": self.run_key, "inherited": self.inherited, "interrupt": self.interrupt}


_TURN_FIELDS = frozenset(f.name for f in fields(Turn))


def _turn_of(data: dict[str, Any]) -> Turn:
    """``Turn(**data)``; without running ``__init__`` when ``data`` holds exactly a turn's fields, as every
    checkpoint written since they all exist does (opening a 100k-event thread loads ~1,500 turns)."""
    if data.keys() == _TURN_FIELDS:
        turn = object.__new__(Turn)
        turn.__dict__.update(data)
        return turn
    return Turn(**data)


@dataclass
class ThreadState:
    """Everything the projection knows (mutable; owned by the reducer)."""

    thread_id: str = ""
    agent: JSONObject = field(default_factory=dict)
    parent: JSONObject | None = None
    metadata: JSONObject = field(default_factory=dict)
    messages: list[JSONObject] = field(default_factory=list)
    message_events: list[str] = field(default_factory=list)
    """The id of the event each message came from (parallel to ``messages``): ``turn.started``,
    ``model.completed``, a tool receipt, denial or resolution, ``turn.ended`` or ``thread.forked`` for a
    placeholder answer, ``compaction.completed`` for a summary (``thread.inherited`` for the messages of
    a fork recorded before sources were kept)."""
    turns: list[Turn] = field(default_factory=list)
    open_events: dict[str, list[Event]] = field(default_factory=dict)
    """Lifecycle events of effects not yet settled, by effect id."""
    settled: SettledDecisions = field(default_factory=SettledDecisions)
    """Decisions of settled effects (compact; decoded on access)."""
    effect_turn: dict[str, str] = field(default_factory=dict)
    """Turn id of every open effect."""
    step_calls: dict[str, str] = field(default_factory=dict)
    """Tool call id -> effect id, for the calls of the latest assistant message."""
    stray_events: list[Event] = field(default_factory=list)
    """Lifecycle events without a usable effect id (they make the thread corrupt)."""
    closed_calls: list[str] = field(default_factory=list)
    """Effect ids of the tool calls answered with a placeholder when their turn ended before they settled (by
    effect, not call id: a model may give a call of a later turn the same id, and that call's answer counts)."""
    inherit_parts: list[str] = field(default_factory=list)
    """Chunks of a fork's inherited state, until the last one arrives."""
    probes: dict[str, list[JSONObject]] = field(default_factory=dict)
    """The probes asked about each call, by the call's effect id, in order: ``{effect_id`` (the probe's),
    ``attempt`` (of the call asked about), ``tool``, ``requested_seq``, ``answer`` (``None`` until it
    answered, then ``{"answer": "occurred" | "not_occurred" | "dont_know", ...}``), ``answered_seq}``."""
    revisions: list[JSONObject] = field(default_factory=list)
    """The agent's revisions, oldest first: ``{revision, agent, seq, event_id, turn_id, changes}``; the first is the
    one ``thread.created`` (or ``thread.forked``) recorded, the last is ``agent``."""
    usage: JSONObject = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0,
                                                       "cached_tokens": 0, "cost": None,
                                                       "model_calls": 0, "tool_calls": 0})
    contradiction: bool = False
    seq: int = 0
    head_hash: str = ""
    chunks_stored: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    """Digests of the checkpoint chunks known to be in the store (a cache for writing checkpoints, not state)."""
    _conversation: _Conversation | None = field(default=None, init=False, repr=False, compare=False)
    """Messages still in the checkpoint's chunks: ``messages`` and ``message_events`` are read on first use."""

    if not TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            # Called only for attributes not set on the instance: the lazily loaded conversation.
            if name in ("messages", "message_events"):
                pending = self.__dict__.get("_conversation")
                if pending is not None:
                    messages, events = pending.materialize()
                    self.__dict__.setdefault("messages", messages)
                    self.__dict__.setdefault("message_events", events)
                    self._conversation = None
                    return self.__dict__[name]
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def conversation_pending(self) -> bool:
        """True while the messages are still in the checkpoint's chunks (not read yet)."""
        return self._conversation is not None and "messages" not in self.__dict__ \
            and "message_events" not in self.__dict__

    # --- derived views (pure) ------------------------------------------------------------

    def active_turn(self) -> Turn | None:
        """The turn not yet ended (``running`` or ``needs_reconciliation``), if any."""
        if self.turns and self.turns[-1].status in ("running", "needs_reconciliation"):
            return self.turns[-1]
        return None

    def keyed_run(self, run_key: str) -> Turn | None:
        """The durable run started with ``run_key`` (the latest, should a fork's history hold two), if any."""
        for turn in reversed(self.turns):
            if turn.steps and turn.run_key == run_key:
                return turn
        return None

    @property
    def revision(self) -> int:
        """The number of the agent revision the thread runs under now (1 before any ``agent.revised``)."""
        return int(self.revisions[-1]["revision"]) if self.revisions else 1

    def recovery(self, request_id: str) -> JSONObject | None:
        """The receipt of the turn recovery with this request id, if one was recorded."""
        for turn in self.turns:
            for receipt in turn.recoveries:
                if receipt.get("request_id") == request_id:
                    return receipt
        return None

    def open_event_list(self) -> list[Event]:
        """All open lifecycle events plus stray ones, in seq order."""
        events = [e for group in self.open_events.values() for e in group]
        events.extend(self.stray_events)
        events.sort(key=lambda e: e.seq)
        return events

    def open_analysis(self, chain_break_seq: int | None = None) -> Analysis:
        """The resolver's answer for the effects still open (settled ones cannot need any action).

        Its flags (corruption, effects to dispatch, to resolve, parked) equal the
        full analysis's, at a cost that does not grow with the thread's history.
        """
        return RecoveryResolver.analyze(self.open_event_list(), check_links=False,
                                        chain_break_seq=chain_break_seq)

    def analysis(self, chain_break_seq: int | None = None, *, current: Analysis | None = None,
                 settled: Mapping[str, EffectDecision] | None = None) -> Analysis:
        """The resolver's answer for every effect: settled decisions plus the open ones analyzed now.

        ``current`` (this state's :meth:`open_analysis`) and ``settled`` (its
        settled decisions, decoded) may be given by a caller that keeps them.
        """
        current = current if current is not None else self.open_analysis(chain_break_seq)
        if not self.settled:
            return current
        decisions = dict(settled if settled is not None else self.settled)
        decisions.update(current.decisions)
        ordered = dict(sorted(decisions.items(), key=lambda item: item[1].requested_seq or item[1].last_seq))
        return Analysis.from_decisions(ordered, chain_break_seq=current.chain_break_seq,
                                       unattributed_events=current.unattributed_events)

    def intent(self, effect_id: str) -> JSONObject | None:
        """The ``requested`` data of an open effect."""
        group = self.open_events.get(effect_id)
        if group and group[0].type.endswith(".requested"):
            return group[0].data
        return None


def _phase(event_type: str) -> tuple[str, str] | None:
    kind, _dot, phase = event_type.rpartition(".")
    return (kind, phase) if kind and phase in LIFECYCLE_PHASES else None


_PHASE_OF: dict[str, tuple[str, str] | None] = {}
"""``_phase`` of the event types seen (a thread uses a few dozen; cleared if it ever grows large)."""
_NOT_SEEN: tuple[str, str] = ("", "")


def _phase_of(event_type: str) -> tuple[str, str] | None:
    """``_phase(event_type)``, remembered."""
    if len(_PHASE_OF) >= 1024:
        _PHASE_OF.clear()
    parsed = _PHASE_OF[event_type] = _phase(event_type)
    return parsed


def _add_message(state: ThreadState, message: JSONObject, event_id: str) -> None:
    """Append ``message`` to the conversation, remembering the event it came from."""
    state.messages.append(message)
    state.message_events.append(event_id)


def tool_content(content: Any) -> str:
    """The text a tool message carries for a tool's result (a str as is, anything else as JSON)."""
    if isinstance(content, str):
        return content
    return "null" if content is None else _TOOL_CONTENT_JSON.encode(content)  # None: what the encoder writes


def _tool_message(call_id: str, name: str, content: Any, status: str) -> JSONObject:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": tool_content(content),
            "status": status}


class ThreadProjection:
    """The reducer from thread events to :class:`ThreadState` (a :class:`~jixu.ledger.Projection`)."""

    name = "thread"
    version = REDUCER_VERSION

    def initial(self) -> ThreadState:
        """The state before any event."""
        return ThreadState()

    def apply(self, state: ThreadState, event: Event) -> ThreadState:
        """Fold ``event`` into ``state`` (mutates and returns it)."""
        state.seq = event.seq
        state.head_hash = event.hash
        parsed = _PHASE_OF.get(event.type, _NOT_SEEN)
        if parsed is _NOT_SEEN:
            parsed = _phase_of(event.type)
        if parsed is not None:
            self._lifecycle(state, event, parsed[0], parsed[1])
            return state
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(state, event)
        return state

    def apply_all(self, state: ThreadState, events: Iterable[Event]) -> ThreadState:
        """:meth:`apply` of each of ``events`` in order, in one loop (what :func:`~jixu.ledger.projection.fold`
        calls: a replay applies every event of the thread, and this saves a call per event).

        The loop's body is :meth:`apply`'s; ``tests/threads/test_reducer_fast_paths.py`` pins the two equal.
        A subclass that overrides :meth:`apply` gets its own ``apply`` called per event.
        """
        if type(self).apply is not ThreadProjection.apply:
            for event in events:
                state = self.apply(state, event)
            return state
        lifecycle, phase_of, handlers = self._lifecycle, _PHASE_OF.get, _HANDLERS.get
        for event in events:
            state.seq = event.seq
            state.head_hash = event.hash
            parsed = phase_of(event.type, _NOT_SEEN)
            if parsed is _NOT_SEEN:
                parsed = _phase_of(event.type)
            if parsed is not None:
                lifecycle(state, event, parsed[0], parsed[1])
                continue
            handler = handlers(event.type)
            if handler is not None:
                handler(state, event)
        return state

    # --- effect lifecycle -------------------------------------------------------------

    def _lifecycle(self, state: ThreadState, event: Event, kind: str, phase: str) -> None:
        data = event.data
        effect_id = data.get("effect_id")
        if type(effect_id) is not str or not effect_id:  # as the resolver attributes events
            state.stray_events.append(event)
            return
        known = state.settled
        if effect_id in known._rows or effect_id in known._where:  # ``in state.settled``, without the method call
            state.contradiction = True
            return
        group = state.open_events.get(effect_id)
        if group is None:
            group = state.open_events[effect_id] = [event]
        else:
            group.append(event)
        if phase == "requested":
            turn_id = data.get("turn_id")
            if isinstance(turn_id, str):
                state.effect_turn[effect_id] = turn_id
            if kind == "tool":
                call_id = data.get("call_id")
                if isinstance(call_id, str):
                    state.step_calls[call_id] = effect_id
            elif kind == "probe":
                _probe_asked(state, event)
            elif kind == "model":
                turn = state.active_turn()
                if turn is not None and turn.turn_id == turn_id:
                    turn.model_calls += 1
            return
        if phase not in _SETTLING_PHASES:
            return
        if kind == "model" and phase == "failed":
            turn = state.active_turn()
            if turn is not None and turn.turn_id == state.effect_turn.get(effect_id):
                # Recorded whether or not the failure is determinate: decide() pauses or fails the turn.
                turn.failure = {"effect_id": effect_id, "error": data.get("error") or {},
                                "indeterminate": data.get("indeterminate") is True}
        if kind == "compaction" and phase == "failed":
            turn = state.active_turn()
            if turn is not None and turn.turn_id == state.effect_turn.get(effect_id):
                # Any failed summary request, determinate or not: the old context stays, no second try.
                turn.compaction_failed = True
        # The ordinary lifecycle's decision is written as text at once (most settled effects; see
        # ordinary_decision_text); anything else is decided in full and then written.
        text = ordinary_decision_text(effect_id, group[0], group[1], group[2]) if len(group) == 3 else None
        if text is None:
            decision = decide_effect(effect_id, group)
            if decision is None:
                return
            settled = decision.state == "completed" or (decision.state == "unknown" and decision.resolution)
            if not settled:
                return
            text = encode_decision(decision)
        intent = group[0].data if group[0].type.endswith(".requested") else {}
        del state.open_events[effect_id]
        turn_id = state.effect_turn.pop(effect_id, None)
        known._rows[effect_id] = text  # set_text without the call: no sealed chunk holds it (checked above)
        if kind == "model":
            self._model_settled(state, event, phase, turn_id)
        elif kind == "tool":
            self._tool_settled(state, event, phase, intent)
        elif kind == "compaction":
            self._compaction_settled(state, event, phase, turn_id, intent)
        elif kind == "probe":
            _probe_answered(state, event, phase, intent)

    def _model_settled(self, state: ThreadState, event: Event, phase: str, turn_id: str | None) -> None:
        turn = state.active_turn()
        if turn is None or turn.turn_id != turn_id:
            return
        if phase == "completed":
            result = event.data.get("result") or {}
            calls = result.get("tool_calls") or []
            message = {"role": "assistant", "content": result.get("text"), "tool_calls": calls}
            artifact = result.get("text_artifact")
            if isinstance(artifact, dict):
                # A long text is stored once, as an artifact: the conversation keeps its reference (the agent
                # loop puts the text back into the model's requests, see Thread._model_messages).
                message["artifact"] = artifact
            _add_message(state, message, event.id)
            state.step_calls = {}
            stop = result.get("stop_reason")
            unfinished = unfinished_answer(stop, len(calls)) if calls else None
            if unfinished is not None:
                turn.failure = {"effect_id": event.data.get("effect_id"), "indeterminate": False, "error": {
                    "kind": "output_truncated", "type": "output_truncated", "stop_reason": stop,
                    "message": unfinished}}
            usage = result.get("usage") or {}
            totals = state.usage
            for key in _TOKEN_KEYS:
                count = usage.get(key)
                if count:  # int(count or 0), skipping the zeros and the call for an int
                    totals[key] += count if type(count) is int else int(count)
            if usage.get("cost") is not None:
                totals["cost"] = (totals["cost"] or 0.0) + float(usage["cost"])
            totals["model_calls"] += 1
            turn.auto_retries = 0

    def _compaction_settled(self, state: ThreadState, event: Event, phase: str, turn_id: str | None,
                            intent: JSONObject) -> None:
        """A summary arrived: it replaces the messages it covers, if they are still the ones it covers."""
        turn = state.active_turn()
        if turn is None or turn.turn_id != turn_id or phase != "completed":
            return
        args = intent.get("args") or {}
        upto, covers = args.get("upto_message"), args.get("covers")
        result = event.data.get("result") or {}
        summary = result.get("summary") if isinstance(result, dict) else None
        if not (isinstance(upto, int) and not isinstance(upto, bool) and isinstance(covers, list)
                and isinstance(summary, str) and summary.strip() and 1 <= upto == len(covers)
                and upto <= turn.message_index and state.message_events[:upto] == covers):
            turn.compaction_failed = True  # the conversation moved on meanwhile: keep it whole
            return
        state.messages[0:upto] = [summary_message(summary, [str(c) for c in covers])]
        state.message_events[0:upto] = [event.id]
        for each in state.turns:
            # A turn whose user message is now inside the summary points at the summary.
            each.message_index = each.message_index - (upto - 1) if each.message_index >= upto else 0
        usage = result.get("usage") or {}
        for key in _TOKEN_KEYS:
            state.usage[key] += int(usage.get(key) or 0)
        if usage.get("cost") is not None:
            state.usage["cost"] = (state.usage["cost"] or 0.0) + float(usage["cost"])

    def _tool_settled(self, state: ThreadState, event: Event, phase: str, intent: JSONObject) -> None:
        call_id = str(intent.get("call_id") or "")
        name = str(intent.get("name") or "")
        data = event.data
        effect_id = data.get("effect_id")
        if effect_id in state.closed_calls:
            # Its turn already ended and the conversation holds a placeholder answer for it;
            # the decision is kept (see ``settled``), the conversation stays valid.
            state.closed_calls.remove(effect_id)
            return
        if phase == "completed":
            artifact = data.get("result_artifact")
            if isinstance(artifact, dict):
                # A large result is stored once, as an artifact; the conversation keeps its reference and the
                # agent loop puts the text back into the model's request (see Thread._model_messages).
                message = _tool_message(call_id, name, f"[tool result stored as artifact sha256:"
                                        f"{artifact.get('sha256')}, {artifact.get('size')} bytes]", "ok")
                message["artifact"] = artifact
                _add_message(state, message, event.id)
            else:
                _add_message(state, _tool_message(call_id, name, data.get("result"), "ok"), event.id)
            state.usage["tool_calls"] += 1
        elif phase == "failed":
            _add_message(state, _tool_message(call_id, name, {"error": data.get("error")}, "error"), event.id)
            state.usage["tool_calls"] += 1
        elif phase == "denied":
            note = data.get("note") or ""
            _add_message(state, _tool_message(call_id, name, f"An operator denied this call. {note}".strip(),
                                              "denied"), event.id)
        elif phase == "outcome_resolved":
            resolution = str(data.get("resolution"))
            actor = data.get("actor")
            by_probe = isinstance(actor, str) and actor.startswith(PROBE_ACTOR_PREFIX)
            content: Any = (PROBE_RESOLUTION_MESSAGES if by_probe else RESOLUTION_MESSAGES).get(resolution, resolution)
            if resolution == "occurred" and data.get("result") is not None:
                content = {"note": content, "result": data.get("result")}
            _add_message(state, _tool_message(call_id, name, content, resolution), event.id)

    # --- checkpoints ------------------------------------------------------------------

    def _dump_common(self, state: ThreadState) -> JSONObject:
        """Everything but the conversation and the settled decisions."""
        return {
            "thread_id": state.thread_id,
            "agent": state.agent,
            "parent": state.parent,
            "metadata": state.metadata,
            "turns": [t.to_dict() for t in state.turns],
            "open_events": {k: [e.to_dict() for e in v] for k, v in state.open_events.items()},
            "effect_turn": state.effect_turn,
            "step_calls": state.step_calls,
            "stray_events": [e.to_dict() for e in state.stray_events],
            "closed_calls": state.closed_calls,
            "inherit_parts": state.inherit_parts,
            "probes": state.probes,
            "revisions": state.revisions,
            "usage": state.usage,
            "contradiction": state.contradiction,
            "seq": state.seq,
            "head_hash": state.head_hash,
        }

    def dump(self, state: ThreadState) -> JSONObject:
        """The state as one self-contained JSON object (for fork records; reads every chunk)."""
        data = self._dump_common(state)
        data["messages"] = state.messages
        data["message_events"] = state.message_events
        data["settled"] = dict(state.settled.encoded())
        return data

    def dump_chunked(self, state: ThreadState) -> tuple[JSONObject, dict[str, str]]:
        """The state for a checkpoint: the main object, and the chunk texts it names (by digest).

        Settled decisions are sealed in settle order into chunks of
        :data:`SETTLED_CHUNK`, messages into chunks of :data:`MESSAGES_CHUNK`
        from the start of the conversation; the main object keeps the settled
        effect ids (membership is the reducer's hot question) and what is not
        sealed yet. Only chunks not in ``state.chunks_stored`` are returned.
        """
        stored = state.chunks_stored
        data = self._dump_common(state)
        settled, texts = state.settled.dump_chunked(stored)
        data["settled"] = settled
        pending = state._conversation
        if pending is not None and state.conversation_pending():
            data["conversation"] = {"chunks": [[digest, count] for digest, count in pending.chunks],
                                    "messages": pending.messages, "message_events": pending.events}
            return data, texts
        messages, events = state.messages, state.message_events
        full = len(messages) // MESSAGES_CHUNK * MESSAGES_CHUNK if len(messages) == len(events) else 0
        chunks = []
        for start in range(0, full, MESSAGES_CHUNK):
            end = start + MESSAGES_CHUNK
            text = _CHUNK_JSON.encode({"message_events": events[start:end], "messages": messages[start:end]})
            digest = chunk_digest(text)
            chunks.append([digest, MESSAGES_CHUNK])
            if digest not in stored:
                texts[digest] = text
        data["conversation"] = {"chunks": chunks, "messages": messages[full:], "message_events": events[full:]}
        return data, texts

    def load(self, data: JSONObject) -> ThreadState:
        """The state back from :meth:`dump`.

        A dump from before ``message_events`` existed (a fork recorded by
        reducer version 2) gets ``""`` for each message's source event.
        """
        messages = list(data["messages"])
        sources = data.get("message_events")
        if not isinstance(sources, list) or len(sources) != len(messages):
            sources = [""] * len(messages)
        state = self._load_common(data, SettledDecisions.from_dump(data["settled"]))
        state.messages = messages
        state.message_events = [str(s) for s in sources]
        return state

    def load_chunked(self, data: JSONObject, chunks: ChunkSource[ThreadState]) -> ThreadState:
        """The state back from :meth:`dump_chunked` (or :meth:`dump`): chunks are read when first needed."""
        conversation = data.get("conversation")
        if not isinstance(conversation, dict):
            return self.load(data)
        state = self._load_common(data, SettledDecisions.from_chunked(data["settled"], chunks))
        refs = [(str(digest), int(count)) for digest, count in conversation["chunks"]]
        tail, events = list(conversation["messages"]), [str(e) for e in conversation["message_events"]]
        if len(tail) != len(events):
            raise ValueError("the checkpoint's conversation tail and its source events differ in length")
        if refs:
            del state.messages, state.message_events
            state._conversation = _Conversation(refs, tail, events, chunks)
        else:
            state.messages, state.message_events = tail, events
        state.chunks_stored = {digest for digest, _count in refs} | set(state.settled.chunk_digests())
        stored = state.chunks_stored
        # A chunk that could not be used may be missing from the store: write every chunk again next time.
        chunks.on_problem.append(lambda _problem: stored.clear())
        return state

    def _load_common(self, data: JSONObject, settled: SettledDecisions) -> ThreadState:
        return ThreadState(
            thread_id=data["thread_id"],
            agent=dict(data["agent"]),
            parent=data["parent"],
            metadata=dict(data["metadata"]),
            turns=[_turn_of(t) for t in data["turns"]],
            open_events={k: [Event(**e) for e in v] for k, v in data["open_events"].items()},
            settled=settled,
            effect_turn=dict(data["effect_turn"]),
            step_calls=dict(data["step_calls"]),
            stray_events=[Event(**e) for e in data["stray_events"]],
            closed_calls=list(data["closed_calls"]),
            inherit_parts=list(data["inherit_parts"]),
            probes={str(k): [dict(p) for p in v] for k, v in (data.get("probes") or {}).items()},  # none in v4 forks
            revisions=[dict(r) for r in data.get("revisions") or ()],  # none in forks recorded before v6
            usage=dict(data["usage"]),
            contradiction=bool(data["contradiction"]),
            seq=int(data["seq"]),
            head_hash=str(data["head_hash"]),
        )


def _probe_asked(state: ThreadState, event: Event) -> None:
    """A probe's intent: the call it asks about is ``args.effect_id`` (at ``args.attempt``)."""
    args = event.data.get("args")
    target = args.get("effect_id") if isinstance(args, dict) else None
    if not isinstance(target, str):
        return  # not a probe this projection can attach to a call; the resolver still judges its events
    attempt = args.get("attempt") if isinstance(args, dict) else None
    state.probes.setdefault(target, []).append({
        "effect_id": event.data.get("effect_id"), "attempt": attempt if type(attempt) is int else None,
        "tool": event.data.get("name"), "requested_seq": event.seq, "answer": None, "answered_seq": None})


def _probe_answered(state: ThreadState, event: Event, phase: str, intent: JSONObject) -> None:
    """A probe's receipt: its answer is attached to the call it asked about.

    A completed probe recorded its answer; a failed one (it raised, or timed out) is a "don't know" naming the
    error.
    """
    args = intent.get("args")
    target = args.get("effect_id") if isinstance(args, dict) else None
    records = state.probes.get(target) if isinstance(target, str) else None
    record = next((r for r in records or () if r.get("effect_id") == event.data.get("effect_id")), None)
    if record is None:
        return
    answer: JSONObject
    if phase == "completed":
        result = event.data.get("result")
        if isinstance(result, dict) and result.get("answer") in ("occurred", "not_occurred", "dont_know"):
            answer = dict(result)
        else:
            answer = {"answer": "dont_know", "reason": "the probe's receipt holds no answer", "evidence": {}}
    else:
        error = event.data.get("error")
        error = error if isinstance(error, dict) else {}
        message = error.get("message")
        if error.get("type") == "exception":
            what = f"the probe raised {error.get('exception')}"
        elif error.get("type") == "timeout":
            what = "the probe timed out"
        else:
            what = f"the probe could not be asked ({error.get('type')})"
        answer = {"answer": "dont_know", "reason": what + (f": {message}" if message else ""), "evidence": {},
                  "error": error}
    record["answer"] = answer
    record["answered_seq"] = event.seq


def _first_revision(state: ThreadState, event: Event) -> None:
    """The agent record of ``thread.created`` / ``thread.forked`` is revision 1."""
    state.revisions = [{"revision": 1, "agent": dict(state.agent), "seq": event.seq, "event_id": event.id,
                        "turn_id": None, "changes": None}]


def _created(state: ThreadState, event: Event) -> None:
    state.thread_id = str(event.data.get("thread_id", ""))
    state.agent = dict(event.data.get("agent") or {})
    state.metadata = dict(event.data.get("metadata") or {})
    _first_revision(state, event)


def _forked(state: ThreadState, event: Event) -> None:
    state.inherit_parts = []
    state.thread_id = str(event.data.get("thread_id", ""))
    state.agent = dict(event.data.get("agent") or {})
    state.parent = dict(event.data.get("parent") or {})
    state.metadata = dict(event.data.get("metadata") or {})
    _first_revision(state, event)


def _agent_revised(state: ThreadState, event: Event) -> None:
    """A new revision of the thread's agent: later turns run under it (and the rest of an active turn)."""
    agent = event.data.get("agent")
    if not isinstance(agent, dict):
        return
    number = event.data.get("revision")
    number = number if type(number) is int else state.revision + 1
    turn = state.active_turn()
    state.agent = dict(agent)
    state.revisions.append({"revision": number, "agent": dict(agent), "seq": event.seq, "event_id": event.id,
                            "turn_id": None if turn is None else turn.turn_id, "changes": event.data.get("changes")})
    if turn is not None:
        turn.revisions.append(number)


def _turn_started(state: ThreadState, event: Event) -> None:
    text = str(event.data.get("input", ""))
    owner = event.data.get("owner")
    run_key = event.data.get("run_key")
    state.turns.append(Turn(turn_id=str(event.data.get("turn_id")), input=text, started_seq=event.seq,
                            message_index=len(state.messages), owner=owner if isinstance(owner, str) else None,
                            epoch=int(event.data.get("epoch") or 0), queued=event.data.get("queued") is True,
                            revisions=[state.revision], steps=event.data.get("steps") is True,
                            run_key=run_key if isinstance(run_key, str) else None))
    _add_message(state, {"role": "user", "content": text}, event.id)


def _turn_claimed(state: ThreadState, event: Event) -> None:
    """A process took ownership of the turn (continuing, reclaiming, or taking over an expired lease)."""
    turn = state.active_turn()
    if turn is None or turn.turn_id != event.data.get("turn_id"):
        return
    turn.status = "running"
    turn.owner = str(event.data.get("owner"))
    turn.epoch = int(event.data.get("epoch") or 0)


def _turn_paused(state: ThreadState, event: Event) -> None:
    """The provider refused or failed: the turn waits, automatically or for an explicit resume."""
    turn = state.active_turn()
    if turn is None or turn.turn_id != event.data.get("turn_id"):
        return
    turn.pause = dict(event.data)
    turn.failure = None


def _turn_resumed(state: ThreadState, event: Event) -> None:
    turn = state.active_turn()
    if turn is None or turn.turn_id != event.data.get("turn_id"):
        return
    turn.pause = None
    if event.data.get("reason") == "automatic":
        turn.auto_retries += 1
    else:
        turn.auto_retries = 0


def _turn_interrupt_requested(state: ThreadState, event: Event) -> None:
    """Another process asked the running turn to stop (the first ask counts; one for an ended turn is moot)."""
    turn = state.active_turn()
    if turn is None or turn.turn_id != event.data.get("turn_id") or turn.interrupt is not None:
        return
    turn.interrupt = dict(event.data)


def _turn_recovered(state: ThreadState, event: Event) -> None:
    """An operator fenced out the turn's owner; the turn waits until its outcome is reconciled."""
    turn = state.active_turn()
    if turn is None or turn.turn_id != event.data.get("turn_id"):
        return
    turn.status = "needs_reconciliation"
    turn.owner = None
    turn.epoch = int(event.data.get("epoch") or 0)
    turn.recoveries.append(dict(event.data))


def _turn_ended(state: ThreadState, event: Event) -> None:
    turn = state.active_turn()
    if turn is None or turn.turn_id != event.data.get("turn_id"):
        return
    outcome = str(event.data.get("outcome"))
    turn.status = outcome if outcome in ("completed", "failed", "interrupted") else "failed"
    turn.ended_seq = event.seq
    if turn.status != "completed":
        _close_unanswered_calls(state, turn.message_index, INTERRUPTED_MESSAGE, "interrupted", event.id)
    if turn.status == "completed":
        turn.reply = event.data.get("reply")
        artifact = event.data.get("reply_artifact")
        turn.reply_artifact = artifact if isinstance(artifact, dict) else None
    elif event.data.get("error") is not None:
        turn.error = event.data.get("error")
    elif turn.status == "interrupted":
        turn.error = {"source": "interrupt", "reason": event.data.get("reason")}


def _inherited(state: ThreadState, event: Event) -> None:
    """A chunk of the state a fork inherits; the last chunk completes it."""
    state.inherit_parts.append(str(event.data.get("text", "")))
    if event.data.get("part") != event.data.get("of", 0) - 1:
        return
    try:
        inherited = ThreadProjection().load(json.loads("".join(state.inherit_parts)))
    except (ValueError, KeyError, TypeError):
        state.contradiction = True  # a fork record that does not decode cannot be trusted
        return
    finally:
        state.inherit_parts = []
    state.messages = inherited.messages
    # Messages whose source the fork record does not name (an old record) cite the record itself.
    state.message_events = [source or event.id for source in inherited.message_events]
    state.turns = inherited.turns
    for turn in state.turns:
        turn.inherited = True
    state.usage = inherited.usage
    if inherited.revisions:
        # The child keeps its parent's revisions (its inherited turns name them); the fork's own agent record is
        # the next one when it differs from the parent's latest.
        mine = state.revisions[-1] if state.revisions else None
        state.revisions = inherited.revisions
        latest = inherited.revisions[-1].get("agent") or {}
        if mine is not None and latest.get("digest") != state.agent.get("digest"):
            state.revisions.append({**mine, "revision": int(inherited.revisions[-1]["revision"]) + 1,
                                    "changes": {"by": "fork"}})


_HANDLERS = {
    "thread.created": _created,
    "thread.forked": _forked,
    "thread.inherited": _inherited,
    "turn.started": _turn_started,
    "turn.ended": _turn_ended,
    "turn.claimed": _turn_claimed,
    "turn.recovered": _turn_recovered,
    "turn.paused": _turn_paused,
    "turn.resumed": _turn_resumed,
    "turn.interrupt_requested": _turn_interrupt_requested,
    "agent.revised": _agent_revised,
}


def _close_unanswered_calls(state: ThreadState, since: int, content: str, status: str, cause: str) -> list[str]:
    """Answer the latest assistant message's unanswered tool calls with a placeholder; return their ids.

    ``cause`` is the id of the event that closes them (the placeholders' source event).
    """
    messages = state.messages
    last = next((i for i in range(len(messages) - 1, since - 1, -1) if messages[i].get("role") == "assistant"),
                None)
    if last is None:
        return []
    answered = {m.get("tool_call_id") for m in messages[last + 1:] if m.get("role") == "tool"}
    closed = []
    for call in messages[last].get("tool_calls") or []:
        call_id = str(call.get("id"))
        if call_id not in answered:
            _add_message(state, _tool_message(call_id, str(call.get("name")), content, status), cause)
            closed.append(call_id)
    state.closed_calls.extend(state.step_calls[c] for c in closed if c in state.step_calls)
    return closed


def fork_state(parent: ThreadState, cause: str = "") -> ThreadState:
    """The state a fork child starts from: the parent's at the fork point, minus open effects.

    Tool calls still open there get a message saying they were not carried
    over (its source event is ``cause``, the child's ``thread.forked``), so
    the child's conversation stays complete; a running turn is closed as
    interrupted.
    """
    child = ThreadProjection().load(ThreadProjection().dump(parent))
    _close_unanswered_calls(child, 0, NOT_INHERITED_MESSAGE, "not_inherited", cause)
    turn = child.active_turn()
    if turn is not None:
        turn.status = "interrupted"
        turn.error = {"source": "fork", "reason": "the thread was forked while this turn was running"}
    child.open_events = {}
    child.settled = SettledDecisions()
    child.effect_turn = {}
    child.step_calls = {}
    child.stray_events = []
    child.closed_calls = []
    child.inherit_parts = []
    child.probes = {}
    child.contradiction = False
    return child


__all__ = ["PROBE_ACTOR_PREFIX", "PROBE_RESOLUTION_MESSAGES", "REDUCER_VERSION", "SettledDecisions", "ThreadProjection", "ThreadState", "Turn", "decode_decision",
           "encode_decision", "fork_state"]

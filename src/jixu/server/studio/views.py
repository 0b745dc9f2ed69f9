"""What each Studio page shows, read through the same services the API uses.

Every effect's state comes from the :class:`~jixu.recovery.RecoveryResolver`
as the threads and runs layers report it (``ThreadLog.snapshot()``,
``RunState``, ``ExecutionRequestView``); this module only arranges it for
display and decides which controls a caller sees: a control appears when the
state allows the operation *and* the caller's role does. The routes check
the role again on every post.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from jixu.errors import InvalidInput, JixuError, NotFound
from jixu.ledger import Event
from jixu.recovery import EffectDecision
from jixu.recovery.corruption import Corruption
from jixu.server import runs as runs_api
from jixu.server import threads as threads_api
from jixu.server.auth import ROLE_RANK, get_token
from jixu.server.context import Context, run_async
from jixu.threads.log import THREAD_PREFIX, ThreadLog, probe_text
from jixu.threads.projection import RESOLUTION_MESSAGES
from jixu.threads.streaming import reasoning_of, reasoning_text

Obj = dict[str, Any]
PAGE_LIMIT = 1000
EXCERPT_CHARS = 160
TIMELINE_PAGE = 100
"""Events on one page of a thread's timeline (the latest page by default; "earlier" links page back)."""
MESSAGES_SHOWN = 40
"""The conversation's last messages a thread page shows (all of them on request)."""
LIST_PAGE = 50
CONTEXT_EVENTS = 200
"""At most this many events are read to show a decision panel's call (its arguments, errors, dispatches)."""
MEMO_LIMIT = 1_000_000
VIEWS = ("compact", "full", "json")
ATTENTION = ("corrupt", "unknown", "parked", "failed", "paused")
"""What needs a person, in the order the threads list shows it (first)."""
LABELS = (*ATTENTION, "waiting", "running", "idle")
AGES = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
"""Age filters of the threads list: created within this many seconds."""
SETTLED_LABELS = {"occurred": "resolved: occurred", "not_occurred": "resolved: did not occur",
                  "abandoned_unknown": "abandoned: unknown"}
RESOLUTION_CHOICES = {
    "occurred": ("It occurred", "Recorded as done; nothing is sent again. The model is told: "
                                f"“{RESOLUTION_MESSAGES['occurred']}”"),
    "not_occurred": ("It did not occur", "Recorded as not done; this call is never sent again. The model is told: "
                                         f"“{RESOLUTION_MESSAGES['not_occurred']}” (a new call would be a new "
                                         "effect, under the tool's own rules)."),
    "abandoned_unknown": ("Abandon: the outcome stays unknown",
                          "Nobody knows whether it happened, and the record says so; nothing is sent again. The "
                          f"model is told: “{RESOLUTION_MESSAGES['abandoned_unknown']}”"),
}
"""Each resolution of an unknown outcome: its label and what choosing it does."""

# Which run operations the run's status allows (the runs service refuses the others anyway).
RESUMABLE = ("paused", "interrupted", "needs_reconciliation")
HANDOFFABLE = ("paused", "interrupted")
RETRYABLE = ("failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")
RECONCILABLE = ("needs_reconciliation",)


def new_hex_id() -> str:
    """32 lowercase hex characters: a fresh reconciliation or resolution id for one form."""
    return secrets.token_hex(16)


def allows(role: str | None, needed: str) -> bool:
    """True when ``role`` includes ``needed``."""
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[needed]


def pretty(value: Any) -> str:
    """Indented JSON for a ``<pre>`` block."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A one-line summary of an event's data."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _event_summary(event: Event) -> str:
    data = event.data
    for key in ("input", "text", "content", "reply"):
        if isinstance(data.get(key), str):
            return excerpt(data[key])
    if "error" in data:
        return excerpt(data["error"])
    if "resolution" in data:
        return excerpt(f"{data.get('resolution')}: {data.get('note') or ''}")
    if "name" in data and "args" in data:
        return excerpt(f"{data['name']}({call_args(data['args'])})")
    return excerpt({k: v for k, v in data.items() if k not in ("effect_id", "thread_id")})


def _marked_seq(corrupt: Corruption | None, seqs: list[int]) -> int | None:
    """The stored event a page marks as the first bad one: at the first bad seq, or (an event is missing
    there) the first stored after it; ``None`` when nothing is corrupt or no such event is stored."""
    if corrupt is None or corrupt.first_bad_seq is None:
        return None
    return min((seq for seq in seqs if seq >= corrupt.first_bad_seq), default=None)


def _message_view(message: dict[str, Any]) -> dict[str, Any]:
    """A conversation message as the page shows it: its text, its tool calls, and an assistant's reasoning as
    such (thinking and summaries readable; signatures, redacted and encrypted content never shown)."""
    record = reasoning_of(message) if message.get("role") == "assistant" else None
    calls = [{"name": str(c.get("name")), "args": call_args(c.get("args"))}
             for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    content = message.get("content")
    other = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls", "reasoning")
             and v is not None}
    return {"role": str(message.get("role")), "text": content if isinstance(content, str) else None,
            "calls": calls, "thinking": reasoning_text(record) if record is not None else None,
            "status": other.get("status"), "other": json.dumps(other, sort_keys=True, default=str)
            if not isinstance(content, str) and not calls and other else None}


# --- threads ------------------------------------------------------------------------------------


def list_label(status: str, waiting_on: Sequence[Obj]) -> str:
    """A thread's label on the list: its status, or for a waiting thread what it waits for. An unknown
    outcome (an operator must find out what happened) and a parked call (an operator must decide) are
    different jobs, so they are different labels."""
    if status == "waiting":
        states = {w.get("state") for w in waiting_on}
        for wanted in ("unknown", "parked"):
            if wanted in states:
                return wanted
    return status


def settled(decision: Obj) -> tuple[str, str]:
    """An effect's badge as ``(css state, text)``: the resolver's state, except that an operator's (or a
    probe's) resolution and a denial say so: a resolved unknown is not ``unknown``, a denied call is not
    ``completed``."""
    resolution = decision.get("resolution")
    if isinstance(resolution, dict):
        kind = str(resolution.get("resolution"))
        return f"resolved_{kind}", SETTLED_LABELS.get(kind, f"resolved: {kind}")
    if decision.get("reason") == "denied":
        return "denied", "denied"
    state = str(decision.get("state"))
    return state, state


class Actors:
    """Actors as people read them: a token's name (``token:<id>`` otherwise), everything else as recorded."""

    def __init__(self, ctx: Context) -> None:
        self._store = ctx.store
        self._names: dict[str, str | None] = {}

    def __call__(self, actor: object) -> str:
        if not isinstance(actor, str) or not actor:
            return "—"
        if not actor.startswith("token:"):
            return actor
        token_id = actor[len("token:"):]
        if token_id not in self._names:
            try:
                self._names[token_id] = get_token(self._store, token_id).name
            except JixuError:
                self._names[token_id] = None
        name = self._names[token_id]
        return name if name else actor


def _created(text: str) -> datetime | None:
    try:
        found = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def thread_rows(ctx: Context) -> list[Obj]:
    """Every thread the caller may see: status, list label, why it waits, tools, its parent and children."""
    rows: list[Obj] = []
    cursor = ""
    while True:
        page = ctx.store.list_streams(THREAD_PREFIX, after=cursor, limit=PAGE_LIMIT)
        for info in page:
            cursor = info.stream
            thread_id = info.stream[len(THREAD_PREFIX):]
            project = threads_api.project_of_stream(ctx.services, info.stream) or ""  # as the API says
            if not ctx.principal.visible(project):
                continue
            log = ThreadLog.load(ctx.store, thread_id, verify=True)  # the status every surface shows
            state = log.snapshot()
            tools = sorted({d.name for d in state.effects.values() if d.kind == "tool" and d.name})
            rows.append({"thread_id": thread_id, "project": project, "status": state.status,
                         "label": list_label(state.status, state.waiting_on),
                         "reason": state.reason, "waiting_on": list(state.waiting_on), "events": info.head_seq,
                         "parent": state.parent, "children": [], "created_at": info.created_at,
                         "created": _created(info.created_at), "tools": tools,
                         "agent": state.agent.get("name"), "last_reply": state.last_reply})
        if len(page) < PAGE_LIMIT:
            break
    by_id = {row["thread_id"]: row for row in rows}
    for row in rows:
        parent = row["parent"] or {}
        if parent.get("thread_id") in by_id:
            by_id[parent["thread_id"]]["children"].append(row["thread_id"])
    return rows


@dataclass(frozen=True)
class ListFilter:
    """What the threads list is narrowed to (each ``None``: any)."""

    status: str | None = None
    project: str | None = None
    tool: str | None = None
    age: str | None = None
    q: str | None = None
    page: int = 1

    def matches(self, row: Obj, now: datetime, *, status: bool = True) -> bool:
        """True when ``row`` passes every filter (``status=False``: every filter but the status)."""
        if status and self.status is not None and row["label"] != self.status:
            return False
        if self.project is not None and row["project"] != self.project:
            return False
        if self.tool is not None and self.tool not in row["tools"]:
            return False
        if self.age is not None:
            created = row["created"]
            if created is None or (now - created).total_seconds() > AGES[self.age]:
                return False
        return self.q is None or self.q.lower() in row["thread_id"].lower()

    def query(self, **changes: object) -> str:
        """This filter's query string with ``changes`` (a ``None`` drops a parameter; the page restarts at 1
        unless it is the change)."""
        values: dict[str, object] = {"status": self.status, "project": self.project, "tool": self.tool,
                                     "age": self.age, "q": self.q, "page": None}
        values.update(changes)
        kept = {k: str(v) for k, v in values.items() if v not in (None, "", 1)}
        return "?" + urlencode(kept) if kept else "?"


def thread_list(ctx: Context, chosen: ListFilter) -> Obj:
    """The threads list: what needs a person first (corrupt, unknown, parked, failed, paused), newest first
    otherwise; counts per label (under every filter but the status one), one page of rows."""
    rows = thread_rows(ctx)
    now = datetime.now(UTC)
    candidates = [row for row in rows if chosen.matches(row, now, status=False)]
    counts = Counter(row["label"] for row in candidates)
    shown = [row for row in candidates if chosen.status is None or row["label"] == chosen.status]
    shown.sort(key=lambda row: row["created_at"], reverse=True)
    shown.sort(key=lambda row: ATTENTION.index(row["label"]) if row["label"] in ATTENTION else len(ATTENTION))
    pages = max(1, -(-len(shown) // LIST_PAGE))
    page = min(max(1, chosen.page), pages)
    return {"threads": shown[(page - 1) * LIST_PAGE: page * LIST_PAGE], "total": len(rows), "matching": len(shown),
            "counts": [(label, counts[label]) for label in LABELS if counts[label]],
            "attention": sum(counts[label] for label in ATTENTION),
            "projects": sorted({row["project"] for row in rows}),
            "tools": sorted({tool for row in rows for tool in row["tools"]}),
            "ages": list(AGES), "filter": chosen, "page": page, "pages": pages, "statuses": LABELS}


def forks_of(ctx: Context, thread_id: str) -> list[Obj]:
    """The threads forked from ``thread_id`` (their first event is ``thread.forked`` naming it), oldest first.

    The first event of a thread never changes, so who each thread's parent is is remembered per server.
    """
    known: dict[str, tuple[str, int] | None] = _app_memo(ctx, "studio_parents")
    children: list[Obj] = []
    cursor = ""
    while True:
        page = ctx.store.list_streams(THREAD_PREFIX, after=cursor, limit=PAGE_LIMIT)
        for info in page:
            cursor = info.stream
            if info.stream not in known:
                first = threads_api.first_event(ctx.store, info.stream, info.genesis_hash)  # only one that holds
                parent = first.data.get("parent") if first is not None and first.type == "thread.forked" else None
                known[info.stream] = ((str(parent.get("thread_id")), int(parent.get("seq") or 0))
                                      if isinstance(parent, dict) else None)
            found = known[info.stream]
            if found is not None and found[0] == thread_id:
                children.append({"thread_id": info.stream[len(THREAD_PREFIX):], "seq": found[1],
                                 "created_at": info.created_at})
        if len(page) < PAGE_LIMIT:
            break
    return children


def _app_memo(ctx: Context, name: str) -> dict[Any, Any]:
    state = ctx.request.app.state
    memo: dict[Any, Any] | None = getattr(state, name, None)
    if memo is None:
        memo = {}
        setattr(state, name, memo)
    if len(memo) > MEMO_LIMIT:
        memo.clear()
    return memo


def window(head: int, before: int | None) -> tuple[int, int]:
    """The seqs ``(first, last)`` of the timeline page ending just before ``before`` (the latest page: None)."""
    last = head if before is None else max(0, min(head, before - 1))
    return max(1, last - TIMELINE_PAGE + 1), last


def _effect_context(ctx: Context, stream: str, decision: EffectDecision) -> Obj:
    """What a decision panel shows about a call: its arguments, errors and dispatches, from its own events."""
    first = decision.requested_seq or decision.last_seq
    events = ctx.store.read(stream, first, min(decision.last_seq, first + CONTEXT_EVENTS))
    if events and events[-1].seq < decision.last_seq:
        events += ctx.store.read(stream, decision.last_seq, decision.last_seq)
    mine = [event for event in events if event.data.get("effect_id") == decision.effect_id]
    requested = next((event for event in mine if event.type.endswith(".requested")), None)
    args = requested.data.get("args") if requested is not None else None
    return {"args": args, "args_text": pretty(args) if args is not None else "",
            "call": f"{decision.name}({call_args(args)})",
            "errors": [{"seq": e.seq, "message": _error_text(e.data.get("error")), "indeterminate":
                        bool(e.data.get("indeterminate"))} for e in mine if e.data.get("error") is not None],
            "dispatches": [{"seq": e.seq, "at": e.recorded_at, "attempt": e.data.get("attempt")}
                           for e in mine if e.type.endswith(".dispatched")],
            "requested_at": requested.recorded_at if requested is not None else None}


LANE_UNITS = 1000
"""The width of an effect lane's drawing, in SVG user units (scaled to the page's width)."""
MARK_UNITS = 4


def _moment(text: object) -> datetime | None:
    return _created(text) if isinstance(text, str) else None


def effect_lanes(timeline: list[Obj], decisions: dict[str, EffectDecision]) -> list[Obj]:
    """The turns of a page's events, each drawn as one lane per effect: time across (from the turn's first event
    on the page to its last), the effect's events as marks on a bar, the bar coloured by the resolver's state
    (``settled`` of its decision: the same badge the effect's card shows; nothing else decides it)."""
    turns: list[Obj] = []
    current: Obj | None = None
    for row in timeline:
        if row["type"] == "turn.started" or current is None:
            started = row["type"] == "turn.started"
            current = {"turn_id": row.get("turn_id") if started else None, "rows": []}
            turns.append(current)
        current["rows"].append(row)
    drawn: list[Obj] = []
    for number, turn in enumerate(turns, start=1):
        moments = [m for m in (_moment(r["recorded_at"]) for r in turn["rows"]) if m is not None]
        if not moments:
            continue
        start, end = min(moments), max(moments)
        span = max((end - start).total_seconds(), 1e-6)

        def x(at: object, start: datetime = start, span: float = span) -> float:
            moment = _moment(at)
            offset = (moment - start).total_seconds() if moment is not None else 0.0
            return round(min(max(offset / span, 0.0), 1.0) * (LANE_UNITS - MARK_UNITS), 1)

        lanes: dict[str, Obj] = {}
        for row in turn["rows"]:
            effect_id = row["effect_id"]
            decision = decisions.get(effect_id) if effect_id else None
            if decision is None or effect_id is None:
                continue
            if effect_id not in lanes:
                css, label = settled(decision.to_dict())
                lanes[effect_id] = {"effect_id": effect_id, "kind": decision.kind, "name": decision.name or "",
                                    "css": css, "label": label, "marks": []}
            step = row["type"].rpartition(".")[2]
            lanes[effect_id]["marks"].append({"seq": row["seq"], "step": step, "at": row["recorded_at"],
                                              "x": x(row["recorded_at"])})
        for lane in lanes.values():
            marks = lane["marks"]
            lane["x"] = marks[0]["x"]
            lane["width"] = round(max(marks[-1]["x"] - marks[0]["x"], 0.0) + MARK_UNITS, 1)
            lane["steps"] = " → ".join(m["step"] for m in marks)
            what = "model call" if lane["kind"] == "model" else f"{lane['kind']} call"
            lane["title"] = (f"{what} {lane['name']}: {lane['label']}; {lane['steps']} "
                             f"(events #{marks[0]['seq']} to #{marks[-1]['seq']}, {marks[0]['at']} to {marks[-1]['at']})")
        drawn.append({"number": number, "turn_id": turn["turn_id"],
                      "start": turn["rows"][0]["recorded_at"], "end": turn["rows"][-1]["recorded_at"],
                      "seconds": round(span, 3) if span > 1e-6 else 0.0, "lanes": list(lanes.values())})
    return [turn for turn in drawn if turn["lanes"]]


def call_args(args: object) -> str:
    """A call's arguments as a reader writes them: ``amount=7, order="1002"``."""
    if not isinstance(args, dict):
        return "" if args is None else json.dumps(args, ensure_ascii=False)
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False, sort_keys=True)}" for k, v in args.items())


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        kind = error.get("exception") or error.get("type") or "error"
        return f"{kind}: {error.get('message')}" if error.get("message") else pretty(error)
    return str(error)


def _recoverable(log: ThreadLog, ownership: Obj | None) -> Obj | None:
    """The recovery form's facts for the active turn when ``ThreadLog.recovery_reason`` says
    ``ThreadLog.recover_turn`` would accept it now; ``None`` otherwise (no form is offered; the service decides
    anyway)."""
    reason = log.recovery_reason(ownership)
    turn = log.state.active_turn()
    if reason is None or ownership is None or turn is None:
        return None
    expires = ownership.get("expires_at")
    return {"turn_id": turn.turn_id, "epoch": int(ownership.get("epoch") or 0), "owner": ownership.get("owner"),
            "expires_at": datetime.fromtimestamp(expires, UTC).isoformat() if isinstance(expires, int | float)
            else None, "legacy": reason == "legacy_confirmed_stopped", "request_id": new_hex_id()}


def thread_page(ctx: Context, thread_id: str, *, before: int | None = None, view: str = "compact",
                all_messages: bool = False) -> Obj:
    """A thread's page: status, decisions with their context, the conversation's end, one page of the
    timeline (``TIMELINE_PAGE`` events ending before ``before``; the latest without), the effects of those
    events and every open one, its forks, the chain badge and the controls."""
    if view not in VIEWS:
        raise InvalidInput(f"view must be one of {', '.join(VIEWS)}", field="view")
    project = threads_api.authorize(ctx, thread_id, "viewer")
    log = ThreadLog.load(ctx.store, thread_id, verify=True)
    state = log.snapshot()
    verified = log.verification()
    corrupt = state.corruption
    # Forks may start only where the verdict vouches for the events (before the first bad one).
    fork_before = corrupt.sound_before if corrupt is not None else None
    # The page's seq is the one its status was decided at (the live updates fetch again when the head moves past
    # it; a later stored head read here would hide those events); a corrupt thread's state stops earlier, so its
    # page shows up to the stored head.
    info = ctx.store.stream_info(log.stream) if corrupt is not None else None
    head = info.head_seq if info is not None else state.seq
    first, last = window(head, before)
    events = ctx.store.read(log.stream, first, last) if last >= first else []
    bad_seq = _marked_seq(corrupt, [event.seq for event in events])
    bad_elsewhere = corrupt is not None and corrupt.first_bad_seq is not None and bad_seq is None
    decisions = state.effects
    role = ctx.principal.role_in(project)
    actors = Actors(ctx)

    def event_href(seq: int) -> str:
        if first <= seq <= last:
            return f"#event-{seq}"
        return f"?before={min(head + 1, seq + TIMELINE_PAGE // 2)}&view={view}#event-{seq}"

    effect_events: dict[str, list[Obj]] = {}
    timeline: list[Obj] = []
    for event in events:
        effect_id = event.data.get("effect_id") if isinstance(event.data.get("effect_id"), str) else None
        decision = decisions.get(effect_id) if effect_id else None
        badge = settled(decision.to_dict()) if decision else None
        row = {"seq": event.seq, "id": event.id, "type": event.type, "recorded_at": event.recorded_at,
               "actor": actors(event.meta.get("actor")), "actor_id": event.meta.get("actor"),
               "effect_id": effect_id, "badge": badge, "summary": _event_summary(event),
               "data": pretty(event.to_dict() if view == "json" else event.data), "hash": event.hash,
               "bad": event.seq == bad_seq, "can_fork": fork_before is None or event.seq < fork_before,
               "turn_id": event.data.get("turn_id") if event.type == "turn.started" else None}
        timeline.append(row)
        if effect_id:
            effect_events.setdefault(effect_id, []).append(row)
    waiting = {item["effect_id"]: item for item in state.waiting_on}
    shown = [d for d in decisions.values() if d.effect_id in effect_events or d.effect_id in waiting]
    effects = []
    for decision in shown:
        item = decision.to_dict()
        css, label = settled(item)
        resolution = item.get("resolution")
        effects.append({**item, "badge": (css, label), "events": effect_events.get(decision.effect_id, []),
                        "requested_href": event_href(decision.requested_seq) if decision.requested_seq else None,
                        "resolved_by": actors(resolution.get("actor")) if isinstance(resolution, dict) else None})
    analysis = state.analysis
    # Decisions are offered on what the thread waits on, nothing else: none on a corrupt thread, and no resolution
    # of a call in flight in the process that holds the turn (the server would refuse it).
    unresolved = [
        {**decisions[e].to_dict(), **_effect_context(ctx, log.stream, decisions[e]), "resolution_id": new_hex_id(),
         "probe": probe_text(waiting[e].get("probe")),
         "probe_record": pretty(waiting[e]["probe"]) if waiting[e].get("probe") else ""}
        for e in analysis.requires_resolution if e in decisions and e in waiting]
    parked = [{**decisions[e].to_dict(), **_effect_context(ctx, log.stream, decisions[e])}
              for e in analysis.waiting_on_parked if e in decisions and e in waiting]
    messages = list(state.messages)
    hidden_messages = 0 if all_messages else max(0, len(messages) - MESSAGES_SHOWN)
    can_edit = allows(role, "editor")
    active = log.state.active_turn()  # a durable run of code is stopped by its code, not from here
    ownership = log.ownership() if corrupt is None else None
    recovery = _recoverable(log, ownership)
    return {
        "thread_id": thread_id, "project": project, "role": role, "agent_name": state.agent.get("name"),
        "last_reply": state.last_reply, "status": state.status, "reason": state.reason, "seq": head,
        "head_hash": state.head_hash, "parent": state.parent, "chain": verified, "timeline": timeline,
        "effects": effects, "effects_total": len(decisions),
        "corruption": None if corrupt is None else corrupt.to_dict(),
        "bad_event_shown": bad_seq is not None, "bad_event_seq": bad_seq,
        "bad_event_href": event_href(corrupt.first_bad_seq) if bad_elsewhere and corrupt is not None
        and corrupt.first_bad_seq is not None else None,
        "unresolved": unresolved, "parked": parked, "resolution_texts": RESOLUTION_CHOICES,
        "messages": [_message_view(m) for m in messages[hidden_messages:]], "hidden_messages": hidden_messages,
        "messages_total": len(messages), "forks": forks_of(ctx, thread_id),
        "window": {"first": first, "last": last, "head": head, "size": TIMELINE_PAGE,
                   "earlier": first if first > 1 else None,
                   "later": min(head + 1, last + TIMELINE_PAGE + 1) if last < head else None},
        "lanes": effect_lanes(timeline, decisions), "lane_units": LANE_UNITS,
        "recovery": recovery if can_edit else None,
        "view": view, "views": VIEWS, "before": before, "event_href": event_href, "actor_name": actors,
        "can_operate": allows(role, "operator"), "can_edit": can_edit,
        "can_send": can_edit and state.status == "idle" and corrupt is None,
        "can_resume": can_edit and state.status == "paused" and corrupt is None,
        "can_interrupt": can_edit and corrupt is None and active is not None and not active.steps,
    }


def state_at(ctx: Context, thread_id: str, seq: int) -> Obj:
    """The thread as it was right after event ``seq`` (replayed from the events alone), and whether it may be
    forked there."""
    project = threads_api.authorize(ctx, thread_id, "viewer")
    log = ThreadLog.load(ctx.store, thread_id, verify=True)
    info = ctx.store.stream_info(log.stream)
    head = info.head_seq if info is not None else 0  # the stored head: a corrupt thread's state may stop earlier
    found = ctx.store.read(log.stream, seq, seq) if 1 <= seq <= head else []
    if not found:
        raise NotFound(f"thread {thread_id} has no event #{seq} (it has {head})", seq=seq)
    event = found[0]
    replayed = log.replay(seq)
    corrupt = log.corruption()
    role = ctx.principal.role_in(project)
    decisions = [{**d.to_dict(), "badge": settled(d.to_dict())} for d in replayed.effects.values()]
    messages = list(replayed.messages)
    return {"thread_id": thread_id, "project": project, "role": role, "seq": seq, "head": head,
            "event": {"id": event.id, "type": event.type, "recorded_at": event.recorded_at,
                      "summary": _event_summary(event), "actor": Actors(ctx)(event.meta.get("actor"))},
            "status": replayed.status, "reason": replayed.reason, "waiting_on": list(replayed.waiting_on),
            "last_reply": replayed.last_reply, "effects": decisions[-MESSAGES_SHOWN:],
            "effects_total": len(decisions), "messages": [_message_view(m) for m in messages[-MESSAGES_SHOWN:]],
            "messages_total": len(messages),
            "timeline_href": f"?before={min(head + 1, seq + TIMELINE_PAGE // 2)}#event-{seq}",
            "can_fork": allows(role, "editor") and (corrupt is None or seq < corrupt.sound_before),
            "corruption": None if corrupt is None else corrupt.to_dict(),
            "previous": _stored_before(ctx, log.stream, seq), "next": _stored_after(ctx, log.stream, seq, head)}


def _stored_before(ctx: Context, stream: str, seq: int) -> int | None:
    """The seq of the stored event before ``seq`` (a deleted event leaves a gap: links skip it, never 404)."""
    if seq <= 1:
        return None
    if ctx.store.read(stream, seq - 1, seq - 1):
        return seq - 1
    earlier = ctx.store.read(stream, 1, seq - 1)
    return earlier[-1].seq if earlier else None


def _stored_after(ctx: Context, stream: str, seq: int, head: int) -> int | None:
    """The seq of the stored event after ``seq`` (see :func:`_stored_before`)."""
    if seq >= head:
        return None
    later = next(ctx.store.iter_events(stream, seq + 1, head), None)
    return later.seq if later is not None else None


def thread_head(ctx: Context, thread_id: str) -> Obj:
    """What the live updates compare: the thread's last seq and status (the whole history verified, as the page)."""
    threads_api.authorize(ctx, thread_id, "viewer")
    log = ThreadLog.load(ctx.store, thread_id, verify=True)
    status = log.status()
    info = ctx.store.stream_info(log.stream) if status == "corrupt" else None  # as thread_page: the seq of the status
    return {"seq": info.head_seq if info is not None else log.state.seq, "status": status}


# --- runs ---------------------------------------------------------------------------------------


RUN_ATTENTION = ("corrupt", "needs_reconciliation", "failed", "paused", "interrupted")
"""Run statuses that need a person, in the order the runs list shows them (first)."""


def run_rows(ctx: Context) -> list[Obj]:
    """Every run the caller may see: what needs a person first, newest first otherwise."""
    states = run_async(ctx.services.runs.list_runs())
    rows = [{"run_id": s.run_id, "project": s.project, "status": s.status, "reason": s.reason,
             "brief": excerpt(s.brief, 120), "provider": s.provider.get("name"), "lineage": s.lineage,
             "plan_revision": s.plan.revision} for s in states if ctx.principal.visible(s.project)]
    rows.reverse()  # the service lists oldest first; run ids are ULIDs, so this is newest first
    rows.sort(key=lambda row: RUN_ATTENTION.index(row["status"]) if row["status"] in RUN_ATTENTION
              else len(RUN_ATTENTION))
    return rows


def _checks(tasks: list[Obj]) -> list[Obj]:
    """Every check of every verify attempt, oldest first, with its task: exit status and output excerpt, from
    the receipts; ``latest`` marks the checks of the last verify attempt that has any (what holds now)."""
    found: list[Obj] = []
    for task in tasks:
        if task.get("kind") != "verify":
            continue
        for attempt in task.get("attempts") or []:
            receipt = attempt.get("receipt") or {}
            for check in (receipt.get("result") or {}).get("checks") or []:
                found.append({"task_id": task["task_id"], "revision": task.get("revision"),
                              "effect_id": attempt.get("effect_id"), "latest": False, **check})
    if found:
        last = found[-1]["effect_id"]
        for check in found:
            check["latest"] = check["effect_id"] == last
    return found


def run_page(ctx: Context, run_id: str) -> Obj:
    """A run: status, plan revisions, task states, journal and its validity, failed checks, execution requests."""
    project = runs_api.authorize(ctx, run_id, "viewer")
    runs = ctx.services.runs
    state, views = run_async(runs.state_and_requests(run_id))
    plan = run_async(runs.plan(run_id)).to_dict()
    entries, valid = run_async(runs.journal(run_id))
    requests = [view.to_dict() for view in views]
    role = ctx.principal.role_in(project)
    actors = Actors(ctx)
    status = state.status
    corrupt = state.corruption
    # A corrupt run takes no operation: none of its controls, nor its requests', is offered.
    can_operate = allows(role, "operator") and corrupt is None
    for request in requests:
        request["can_reconcile"] = can_operate and request["status"] in RECONCILABLE
        request["reconciliation_id"] = new_hex_id()
        request["latest_reconciliation"] = request["reconciliations"][-1] if request["reconciliations"] else None
        # After a reconciliation without proof: ask the provider (read-only), then record what it showed.
        request["can_inspect"] = (can_operate and request["status"] == "needs_reconciliation"
                                  and request["kind"] != "cancellation")
        request["latest_inspection"] = request["inspections"][-1] if request["inspections"] else None
        request["can_resolve"] = request["can_inspect"] and request["latest_inspection"] is not None
        request["resolution_id"] = new_hex_id()
        request["inspection_text"] = (pretty(request["latest_inspection"].get("found"))
                                      if request["latest_inspection"] else "")
    journal = [{"seq": e["seq"], "type": e["type"], "recorded_at": e["recorded_at"],
                "actor": actors((e.get("meta") or {}).get("actor")), "effect_id": (e.get("data") or {}).get("effect_id"),
                "summary": excerpt({k: v for k, v in (e.get("data") or {}).items() if k != "effect_id"}),
                "data": pretty(e.get("data")), "hash": e["hash"]} for e in entries]
    bad_seq = _marked_seq(corrupt, [entry["seq"] for entry in journal])
    for entry in journal:
        entry["bad"] = entry["seq"] == bad_seq
    tasks = plan["tasks"]
    checks = _checks(tasks)
    return {
        "run_id": run_id, "project": project, "role": role, "state": state.to_dict(), "status": status,
        "actor_name": actors,
        "reason": state.reason, "seq": state.seq, "plan": plan, "tasks": tasks, "revisions": plan["revisions"],
        "journal": journal, "journal_valid": valid, "requests": requests,
        "live": requests_digest((r["request_id"], r["status"]) for r in requests),
        "checks": [c for c in checks if c["latest"]], "earlier_checks": [c for c in checks if not c["latest"]],
        "failed_checks": [c for c in checks if c["latest"] and not c.get("passed")],
        "providers": sorted(ctx.services.providers),
        "corruption": None if corrupt is None else corrupt.to_dict(),
        "bad_event_shown": bad_seq is not None, "bad_event_seq": bad_seq,
        # What blocks the run (its project corrupt, a cancellation in doubt) takes every control that would move it
        # on; a run retried once is not retried again (its retry is linked instead).
        "blocked": state.blocked, "retried_as": state.lineage.get("retried_as"),
        "can_resume": allows(role, "editor") and status in RESUMABLE and corrupt is None and state.blocked is None,
        "can_handoff": can_operate and status in HANDOFFABLE and bool(ctx.services.providers)
        and state.blocked is None,
        "can_retry": allows(role, "editor") and status in RETRYABLE and corrupt is None and state.blocked is None
        and not state.lineage.get("retried_as"),
        "can_cancel": can_operate and status not in FINISHED
        and (state.blocked is None or state.blocked.get("by") != "cancellation"),
    }


def run_head(ctx: Context, run_id: str) -> Obj:
    """What the live updates compare: the run's journal head and status."""
    runs_api.authorize(ctx, run_id, "viewer")
    state, requests = run_async(ctx.services.runs.state_and_requests(run_id))
    return {"seq": state.seq, "status": state.status,
            "live": requests_digest((view.request_id, view.status) for view in requests)}


def requests_digest(statuses: Iterable[tuple[str, str]]) -> str:
    """The run page's requests as its live updates compare them: each request's id and status. A request whose
    stream was changed becomes ``corrupt`` without the run's journal moving: the open page reloads then."""
    return ",".join(f"{request_id}:{status}" for request_id, status in sorted(statuses))


__all__ = ["Actors", "ListFilter", "allows", "effect_lanes", "list_label", "new_hex_id", "run_head", "run_page", "run_rows", "settled",
           "state_at", "thread_head", "thread_list", "thread_page", "thread_rows", "window"]

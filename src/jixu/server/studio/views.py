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
from typing import Any

from jixu.ledger import Event
from jixu.recovery import EffectDecision
from jixu.recovery.corruption import Corruption
from jixu.scheduling import project_of
from jixu.server import runs as runs_api
from jixu.server import threads as threads_api
from jixu.server.auth import ROLE_RANK
from jixu.server.context import Context, run_async
from jixu.threads.log import THREAD_PREFIX, ThreadLog, probe_text
from jixu.threads.streaming import reasoning_of, reasoning_text

Obj = dict[str, Any]
PAGE_LIMIT = 1000
EXCERPT_CHARS = 160

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
        return excerpt(f"{data['name']}({json.dumps(data['args'], ensure_ascii=False, sort_keys=True)})")
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
    calls = [{"name": str(c.get("name")), "args": json.dumps(c.get("args"), ensure_ascii=False, sort_keys=True)}
             for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    content = message.get("content")
    other = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls", "reasoning")
             and v is not None}
    return {"role": str(message.get("role")), "text": content if isinstance(content, str) else None,
            "calls": calls, "thinking": reasoning_text(record) if record is not None else None,
            "status": other.get("status"), "other": json.dumps(other, sort_keys=True, default=str)
            if not isinstance(content, str) and not calls and other else None}


def _decision_dict(decision: EffectDecision) -> Obj:
    return decision.to_dict()


# --- threads ------------------------------------------------------------------------------------


def thread_rows(ctx: Context) -> list[Obj]:
    """Every thread the caller may see: status, why it waits, its parent and children."""
    rows: list[Obj] = []
    cursor = ""
    while True:
        page = ctx.store.list_streams(THREAD_PREFIX, after=cursor, limit=PAGE_LIMIT)
        for info in page:
            cursor = info.stream
            thread_id = info.stream[len(THREAD_PREFIX):]
            first = ctx.store.read(info.stream, 1, 1)
            metadata = first[0].data.get("metadata") if first else None
            project = project_of(metadata if isinstance(metadata, dict) else {})
            if not ctx.principal.visible(project):
                continue
            log = ThreadLog.load(ctx.store, thread_id, verify=True)  # the status every surface shows
            state = log.snapshot()
            rows.append({"thread_id": thread_id, "project": project, "status": state.status,
                         "reason": state.reason, "waiting_on": list(state.waiting_on), "events": state.seq,
                         "parent": state.parent, "children": [], "created_at": info.created_at,
                         "agent": state.agent.get("name"), "last_reply": state.last_reply})
        if len(page) < PAGE_LIMIT:
            break
    by_id = {row["thread_id"]: row for row in rows}
    for row in rows:
        parent = row["parent"] or {}
        if parent.get("thread_id") in by_id:
            by_id[parent["thread_id"]]["children"].append(row["thread_id"])
    return rows


def thread_page(ctx: Context, thread_id: str) -> Obj:
    """A thread's timeline, its effects grouped with the resolver's state, the chain badge and the controls."""
    project = threads_api.authorize(ctx, thread_id, "viewer")
    log = ThreadLog.load(ctx.store, thread_id, verify=True)
    state = log.snapshot()
    verified = log.verification()
    corrupt = state.corruption
    # Forks may start only where the verdict vouches for the events (before the first bad one).
    fork_before = corrupt.sound_before if corrupt is not None else None
    events = log.events()
    bad_seq = _marked_seq(corrupt, [event.seq for event in events])
    decisions = state.effects
    role = ctx.principal.role_in(project)
    effect_events: dict[str, list[Obj]] = {}
    timeline: list[Obj] = []
    for event in events:
        effect_id = event.data.get("effect_id") if isinstance(event.data.get("effect_id"), str) else None
        decision = decisions.get(effect_id) if effect_id else None
        row = {"seq": event.seq, "id": event.id, "type": event.type, "recorded_at": event.recorded_at,
               "actor": event.meta.get("actor"), "effect_id": effect_id,
               "state": decision.state if decision else None, "summary": _event_summary(event),
               "data": pretty(event.data), "hash": event.hash,
               "bad": event.seq == bad_seq, "can_fork": fork_before is None or event.seq < fork_before}
        timeline.append(row)
        if effect_id:
            effect_events.setdefault(effect_id, []).append(row)
    effects = [{**_decision_dict(d), "events": effect_events.get(d.effect_id, [])} for d in decisions.values()]
    analysis = state.analysis
    # A corrupt thread takes no decision: no resolution, approval, denial or input is offered on it.
    probes = {item["effect_id"]: item.get("probe") for item in state.waiting_on}
    unresolved = [] if corrupt is not None else [{**_decision_dict(decisions[e]), "resolution_id": new_hex_id(),
                                                  "probe": probe_text(probes.get(e))}
                                                 for e in analysis.requires_resolution if e in decisions]
    parked = [] if corrupt is not None else [_decision_dict(decisions[e]) for e in analysis.waiting_on_parked
                                             if e in decisions]
    return {
        "thread_id": thread_id, "project": project, "role": role, "state": state.to_dict(),
        "status": state.status, "reason": state.reason, "seq": state.seq, "head_hash": state.head_hash,
        "parent": state.parent, "chain": verified, "timeline": timeline, "effects": effects,
        "corruption": None if corrupt is None else corrupt.to_dict(),
        "bad_event_shown": bad_seq is not None, "bad_event_seq": bad_seq,
        "unresolved": unresolved, "parked": parked, "messages": [_message_view(m) for m in state.messages],
        "can_operate": allows(role, "operator"), "can_edit": allows(role, "editor"),
        "can_send": allows(role, "editor") and state.status == "idle" and corrupt is None,
    }


def thread_head(ctx: Context, thread_id: str) -> Obj:
    """What the live updates compare: the thread's last seq and status."""
    threads_api.authorize(ctx, thread_id, "viewer")
    log = ThreadLog.load(ctx.store, thread_id)
    return {"seq": log.state.seq, "status": log.status()}


# --- runs ---------------------------------------------------------------------------------------


def run_rows(ctx: Context) -> list[Obj]:
    """Every run the caller may see, oldest first."""
    states = run_async(ctx.services.runs.list_runs())
    return [{"run_id": s.run_id, "project": s.project, "status": s.status, "reason": s.reason,
             "brief": excerpt(s.brief, 120), "provider": s.provider.get("name"), "lineage": s.lineage,
             "plan_revision": s.plan.revision} for s in states if ctx.principal.visible(s.project)]


def _failed_checks(tasks: list[Obj]) -> list[Obj]:
    """Each failing check with its verify task: exit status and output excerpt, from the receipts."""
    failed: list[Obj] = []
    for task in tasks:
        if task.get("kind") != "verify":
            continue
        for attempt in task.get("attempts") or []:
            receipt = attempt.get("receipt") or {}
            for check in (receipt.get("result") or {}).get("checks") or []:
                if not check.get("passed"):
                    failed.append({"task_id": task["task_id"], "revision": task.get("revision"),
                                   "effect_id": attempt.get("effect_id"), **check})
    return failed


def run_page(ctx: Context, run_id: str) -> Obj:
    """A run: status, plan revisions, task states, journal and its validity, failed checks, execution requests."""
    project = runs_api.authorize(ctx, run_id, "viewer")
    runs = ctx.services.runs
    state = run_async(runs.state(run_id))
    plan = run_async(runs.plan(run_id)).to_dict()
    entries, valid = run_async(runs.journal(run_id))
    requests = [view.to_dict() for view in run_async(runs.execution_requests(run_id))]
    role = ctx.principal.role_in(project)
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
                "actor": (e.get("meta") or {}).get("actor"), "effect_id": (e.get("data") or {}).get("effect_id"),
                "summary": excerpt({k: v for k, v in (e.get("data") or {}).items() if k != "effect_id"}),
                "data": pretty(e.get("data")), "hash": e["hash"]} for e in entries]
    bad_seq = _marked_seq(corrupt, [entry["seq"] for entry in journal])
    for entry in journal:
        entry["bad"] = entry["seq"] == bad_seq
    tasks = plan["tasks"]
    return {
        "run_id": run_id, "project": project, "role": role, "state": state.to_dict(), "status": status,
        "reason": state.reason, "seq": state.seq, "plan": plan, "tasks": tasks, "revisions": plan["revisions"],
        "journal": journal, "journal_valid": valid, "failed_checks": _failed_checks(tasks), "requests": requests,
        "providers": sorted(ctx.services.providers),
        "corruption": None if corrupt is None else corrupt.to_dict(),
        "bad_event_shown": bad_seq is not None, "bad_event_seq": bad_seq,
        "can_resume": allows(role, "editor") and status in RESUMABLE and corrupt is None,
        "can_handoff": can_operate and status in HANDOFFABLE and bool(ctx.services.providers),
        "can_retry": allows(role, "editor") and status in RETRYABLE and corrupt is None,
        "can_cancel": can_operate and status not in FINISHED,
    }


def run_head(ctx: Context, run_id: str) -> Obj:
    """What the live updates compare: the run's journal head and status."""
    runs_api.authorize(ctx, run_id, "viewer")
    state = run_async(ctx.services.runs.state(run_id))
    return {"seq": state.seq, "status": state.status}


__all__ = ["allows", "new_hex_id", "run_head", "run_page", "run_rows", "thread_head", "thread_page", "thread_rows"]

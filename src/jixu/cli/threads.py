"""``jixu threads …``: inspect threads and record operator decisions from the shell.

These commands read a thread's events and record decisions (outcome
resolutions, approvals, denials, forks); they never call a model or a tool.
The application that owns the thread's agent continues the thread when it
opens it again (``Harness.open_thread``).
"""

from __future__ import annotations

import getpass
import json
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from jixu.cli.output import EXIT_CHECK_FAILED, CLIConsole, console, emit_json, handled, json_option, literal
from jixu.errors import InvalidInput, JixuError, NotFound
from jixu.ledger import Event, Store, is_valid_id, open_store
from jixu.recovery import RESOLUTIONS, EffectDecision
from jixu.scheduling import enqueue_thread, thread_work_key
from jixu.threads.log import MAX_INPUT_CHARS, THREAD_PREFIX, State, ThreadLog, probe_text, stream_of
from jixu.threads.streaming import reasoning_of, reasoning_text

CONTINUES = ("The CLI records decisions only; the application that owns the thread's agent continues the "
             "thread when it opens it (Harness.open_thread).")

EFFECT_STYLE = {
    "completed": "green",
    "not_dispatched": "cyan",
    "unknown": "bold yellow",
    "parked": "magenta",
    "corrupt": "bold red",
}
"""Colour of each resolver state."""

STATUS_STYLE = {
    "idle": "green",
    "running": "cyan",
    "waiting": "bold yellow",
    "failed": "red",
    "corrupt": "bold red",
}
"""Colour of each thread status."""


def out() -> Console:
    """The console for tables: the terminal's width, or 160 columns when output goes to a pipe or file.

    Piped output is read later or searched; ids must not be cut to fit 80 columns.
    """
    return console if console.is_terminal else CLIConsole(width=160, soft_wrap=True, emoji=False)


def default_actor() -> str:
    """The recorded actor when ``--actor`` is not given: ``cli:<login name>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name in some containers
        return "cli:operator"


def styled(text: str, styles: dict[str, str]) -> str:
    """``text`` (data: escaped) in Rich markup with its colour from ``styles``."""
    style = styles.get(text)
    return f"[{style}]{literal(text)}[/]" if style else literal(text)


def trim(text: object, limit: int = 90) -> str:
    """One line of at most ``limit`` characters."""
    value = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, sort_keys=True)
    value = " ".join(value.split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


def resolution_text(decision: EffectDecision, *, with_note: bool = True) -> str:
    """The recorded resolution of an effect in a few words (empty when there is none)."""
    if not decision.resolution:
        return ""
    recorded = decision.resolution
    text = f"{recorded.get('resolution')} by {recorded.get('actor')}"
    if with_note and recorded.get("note"):
        text += f": {trim(recorded.get('note'), 60)}"
    return text


def effects_table(effects: dict[str, EffectDecision], title: str, *, compact: bool = False) -> Table:
    """The resolver's decision for every effect, one row each, states coloured (``compact``: fewer columns)."""
    table = Table(title=title)
    table.add_column("effect", no_wrap=True, min_width=26)
    columns = ("name", "state", "reason", "retry safe?", "resolution") if compact else (
        "kind", "name", "state", "reason", "semantics", "retry safe", "attempts", "resolution")
    for column in columns:
        table.add_column(column, overflow="fold")
    for d in effects.values():
        cells = {"kind": literal(d.kind), "name": literal(d.name or ""), "state": styled(d.state, EFFECT_STYLE),
                 "reason": literal(d.reason), "semantics": literal(d.semantics or ""),
                 "retry safe": "yes" if d.retry_safe else "no", "attempts": str(d.attempts),
                 "resolution": literal(resolution_text(d, with_note=not compact)),
                 "retry safe?": f"{'yes' if d.retry_safe else 'no'} ({literal(d.semantics)})"}
        table.add_row(literal(d.effect_id), *(cells[c] for c in columns))
    return table


def message_text(message: dict[str, Any]) -> str:
    """A conversation message in one trimmed line (an assistant's reasoning first, marked as such)."""
    record = reasoning_of(message) if message.get("role") == "assistant" else None
    thought = f"(thinking: {trim(reasoning_text(record), 60)}) " if record is not None else ""
    limit = 150 if thought else 90
    calls = message.get("tool_calls") or []
    if calls:
        shown = ", ".join(f"{c.get('name')}({', '.join(f'{k}={v!r}' for k, v in (c.get('args') or {}).items())})"
                          for c in calls)
        return trim(f"{thought}{message.get('content') or ''} calls {shown}".strip(), limit)
    return trim(f"{thought}{message.get('content') or ''}", limit)


def messages_table(messages: tuple[dict[str, Any], ...] | list[dict[str, Any]], title: str) -> Table:
    """The conversation, one trimmed row per message."""
    table = Table(title=title)
    for column in ("#", "role", "status", "content"):
        table.add_column(column)
    for index, message in enumerate(messages, start=1):
        table.add_row(str(index), literal(message.get("role")), literal(message.get("status") or ""),
                      literal(message_text(message)))  # a message's text is data, never console markup
    return table


def resolve_command_hint(store: str, thread_id: str, item: dict[str, Any]) -> list[str]:
    """The exact commands that settle one entry of ``waiting_on``."""
    head = f"jixu threads {{}} {shlex.quote(store)} {thread_id} {item['effect_id']}"
    if item.get("state") == "parked":
        return [head.format("approve") + ' --note "why it may run"',
                head.format("deny") + ' --note "why it must not run"']
    return [head.format("resolve") + f" --resolution {res} --note \"what you checked\"" for res in RESOLUTIONS]


def status_line(state: State) -> str:
    """``status: reason`` with the status coloured (Rich markup; the reason is data, escaped)."""
    text = f"status {styled(state.status, STATUS_STYLE)}"
    if state.reason:
        text += f": {literal(state.reason)}"
    elif state.status == "running":
        text += " (ready to continue: it has work pending)"
    return text


def thread_summary(state: State) -> dict[str, Any]:
    """The thread's status after an operator's command, as ``--json`` prints it."""
    return {"thread_id": state.thread_id, "status": state.status, "reason": state.reason, "seq": state.seq,
            "head_hash": state.head_hash}


def load_verified(store: Store, thread_id: str, *, actor: str = "jixu") -> ThreadLog:
    """Load a thread established (its whole history verified, ``ThreadLog.load(verify=True)``), so a damaged
    history shows (and refuses) as corrupt, as on every other surface."""
    return ThreadLog.load(store, thread_id, actor=actor, verify=True)


@contextmanager
def opened_thread(store: str, thread_id: str, as_json: bool, *, actor: str = "jixu") -> Iterator[ThreadLog]:
    """Open STORE (never creating it) and load THREAD_ID, chain verified; typed errors become exit codes."""
    with handled(as_json), open_store(store, create=False) as opened:
        yield load_verified(opened, thread_id, actor=actor)


def check_effect_id(log: ThreadLog, effect_id: str) -> None:
    """Refuse a malformed effect id (invalid input) before anything is read or written."""
    if effect_id not in log.analysis().decisions and not is_valid_id(effect_id):
        raise InvalidInput(f"effect id {effect_id!r} is not a valid id", field="effect_id")


def effect_of(log: ThreadLog, effect_id: str) -> EffectDecision:
    """The resolver's current decision on one effect of the thread."""
    decision = log.analysis().decisions.get(effect_id)
    if decision is None:
        raise NotFound(f"thread {log.thread_id} has no effect {effect_id!r}", effect_id=effect_id)
    return decision


def list_rows(opened: Store, limit: int) -> list[dict[str, Any]]:
    """One summary per thread in the store."""
    rows: list[dict[str, Any]] = []
    for info in opened.list_streams(THREAD_PREFIX, limit=limit):
        thread_id = info.stream[len(THREAD_PREFIX):]
        row: dict[str, Any] = {"thread_id": thread_id, "events": info.head_seq, "created_at": info.created_at}
        try:
            state = load_verified(opened, thread_id).snapshot()
        except JixuError as error:
            row.update(status="unreadable", reason=error.message, last_reply=None, waiting_on=[], parent=None)
        else:
            row.update(status=state.status, reason=state.reason, last_reply=state.last_reply,
                       waiting_on=[w["effect_id"] for w in state.waiting_on], parent=state.parent)
        rows.append(row)
    return rows


@click.group("threads", short_help="Inspect threads; resolve, approve, deny and fork them.")
def threads_group() -> None:
    """Inspect threads and record operator decisions (resolve, approve, deny, fork).

    Every command takes STORE first: a SQLite file path, a sqlite:/// URL or a
    postgresql:// URL (only `create` makes a store that does not exist). The CLI records decisions and never calls
    a model or a tool: the application that owns a thread's agent continues the
    thread when it opens it again (Harness.open_thread).
    """


@threads_group.command("list", short_help="List threads: status, events, last reply or what they wait for.")
@click.argument("store")
@click.option("--limit", type=click.IntRange(1, 100_000), default=1000, show_default=True,
              help="Most threads to list.")
@json_option
def list_command(store: str, limit: int, as_json: bool) -> None:
    """List the threads in STORE: status, events, last reply or what they wait for."""
    with handled(as_json), open_store(store, create=False) as opened:
        rows = list_rows(opened, limit)
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"threads in {literal(store)}")
    table.add_column("thread", no_wrap=True, min_width=26)
    for column in ("status", "events", "last reply / waiting on"):
        table.add_column(column)
    for row in rows:
        detail = row["reason"] if row["status"] in ("waiting", "failed", "corrupt", "unreadable") else (
            row["last_reply"] or "")
        table.add_row(literal(row["thread_id"]), styled(row["status"], STATUS_STYLE), str(row["events"]),
                      literal(trim(detail, 70)))
    out().print(table)
    out().print(f"{len(rows)} thread(s)", highlight=False)


@threads_group.command("show", short_help="Show status, turns, messages and every effect's state.")
@click.argument("store")
@click.argument("thread_id")
@json_option
def show_command(store: str, thread_id: str, as_json: bool) -> None:
    """Show a thread: status, turns, messages and the resolver's decision on every effect.

    Lists what the thread waits for with the exact command that settles each.
    Exit 1 when the thread is corrupt.
    """
    with opened_thread(store, thread_id, as_json) as log:
        state = log.snapshot()
        # Declared with a probe but never asked (a durable run's code holds the probe): the next run asks it.
        probe_next = {item["effect_id"] for item in state.waiting_on if not item.get("probe")
                      and (log.state.intent(item["effect_id"]) or {}).get("probe") is True}
    if as_json:
        emit_json(state.to_dict())
    else:
        out().print(f"[bold]thread {literal(state.thread_id)}[/]  {status_line(state)}", highlight=False)
        out().print(f"agent {state.agent.get('name')!r} revision {state.revision} (contract "
                    f"{str(state.agent.get('contract'))[:12]}…, model {state.agent.get('model')}), "
                    f"{state.seq} events, head {state.head_hash[:16]}…", highlight=False, markup=False)
        if state.parent:
            out().print(f"forked from thread {state.parent.get('thread_id')} at event "
                        f"{state.parent.get('event_id')} (seq {state.parent.get('seq')}, hash "
                        f"{str(state.parent.get('hash'))[:16]}…)", highlight=False, markup=False)
        turns = Table(title="turns")
        for column in ("turn", "status", "revision", "input", "reply / error"):
            turns.add_column(column)
        for turn in state.turns:
            outcome = turn.get("reply") if turn.get("reply") is not None else (turn.get("error") or "")
            ran_under = ", ".join(str(r) for r in turn.get("revisions") or ()) or "-"
            shown = str(turn["status"])
            if shown == "running" and state.status != "running":
                # An unended turn is as its thread is: a turn waiting on an operator is not running.
                shown = f"open ({state.status})"
            turns.add_row(literal(turn["turn_id"]), literal(shown), literal(ran_under),
                          literal(("steps: " if turn.get("steps") else "") + trim(turn["input"], 50)),
                          literal(trim(outcome, 60)))
        out().print(turns)
        out().print(messages_table(state.messages, "messages"))
        out().print(effects_table(state.effects, "effects (RecoveryResolver)"))
        if state.waiting_on:
            out().print("[bold yellow]waiting on[/] (an operator must decide; jixu will not guess):")
            for item in state.waiting_on:
                settle = ("its probe is asked when the run's code runs again; or settle it now with one of:"
                          if item["effect_id"] in probe_next else "settle it with one of:")
                out().print(f"  {item['effect_id']} {item['name']} is {item['state']} ({item['reason']}); {settle}",
                            highlight=False, markup=False)
                if item.get("probe"):
                    out().print(f"    {probe_text(item['probe'])}", highlight=False, markup=False)
                for command in resolve_command_hint(store, state.thread_id, item):
                    out().print(f"    {command}", highlight=False, markup=False)
        if state.status == "running" and not state.reason:  # with a reason, another process is running it
            out().print(f"This thread has work pending. {CONTINUES}", highlight=False)
    if state.status == "corrupt":
        sys.exit(EXIT_CHECK_FAILED)


def lifecycle_effect(event: Event) -> str:
    """The effect id an event belongs to, if it is an effect lifecycle event."""
    effect_id = event.data.get("effect_id")
    return effect_id if isinstance(effect_id, str) else ""


@threads_group.command("events", short_help="Show a thread's events in order.")
@click.argument("store")
@click.argument("thread_id")
@click.option("--from-seq", type=click.IntRange(1), default=1, show_default=True, help="First seq to show.")
@json_option
def events_command(store: str, thread_id: str, from_seq: int, as_json: bool) -> None:
    """Show a thread's events in order (seq, type, id, effect, data)."""
    with opened_thread(store, thread_id, as_json) as log:
        events = log.events(from_seq)
    if as_json:
        emit_json([e.to_dict() for e in events])
        return
    table = Table(title=f"events of thread {literal(thread_id)}")
    table.add_column("seq")
    table.add_column("type")
    table.add_column("id", no_wrap=True, min_width=26)
    table.add_column("effect", no_wrap=True, min_width=26)
    table.add_column("data")
    for e in events:
        table.add_row(str(e.seq), literal(e.type), literal(e.id), literal(lifecycle_effect(e)),
                      literal(trim(e.data, 70)))
    out().print(table)


@threads_group.command("verify", short_help="Verify a thread's hash chain and effects (exit 1 if not).")
@click.argument("store")
@click.argument("thread_id")
@json_option
def verify_command(store: str, thread_id: str, as_json: bool) -> None:
    """Recompute a thread's hash chain, check its effects are consistent and re-project its checkpoint (exit 1 if
    the thread is corrupt or its checkpoint was forged)."""
    with opened_thread(store, thread_id, as_json) as log:
        found = log.verification()
    valid = bool(found["valid"])
    if as_json:
        emit_json(found)
    else:
        report, corrupt, checkpoint = found["chain"], found["corruption"], found["checkpoint"]
        chain = "[green]valid[/]" if report["valid"] else (
            f"[bold red]INVALID[/] at seq {report['first_bad_seq']}: {literal(report['reason'])} "
            f"({literal(report['detail'])})")
        out().print(f"thread {literal(thread_id)}: hash chain {chain}, {report['count']} events, head "
                    f"{literal(report['head_hash'])}", highlight=False)
        if corrupt is not None:
            out().print(f"[bold red]corrupt[/]: first bad event #{corrupt['first_bad_seq']} "
                        f"({literal(corrupt['reason'])}: {literal(corrupt['explanation'])}) "
                        f"{literal(corrupt['detail'])}", highlight=False)
        else:
            out().print("effects: [green]consistent[/] (no contradictions)")
        if checkpoint is not None:
            style = "bold red" if checkpoint["failed"] else "green"
            out().print(f"checkpoint at seq {checkpoint['seq']}: [{style}]{literal(checkpoint['status'])}[/] "
                        f"({literal(checkpoint['detail'])})", highlight=False)
    if not valid:
        sys.exit(EXIT_CHECK_FAILED)


def parse_upto(upto: str | None) -> int | str | None:
    """``--upto`` as a seq (digits) or an event id."""
    if upto is None:
        return None
    text = upto.strip()
    return int(text) if text.isdigit() else text


@threads_group.command("replay", short_help="Rebuild the state from events alone (calls no driver).")
@click.argument("store")
@click.argument("thread_id")
@click.option("--upto", default=None, metavar="SEQ_OR_EVENT_ID",
              help="Replay up to this seq or event id (inclusive); default: the whole history.")
@json_option
def replay_command(store: str, thread_id: str, upto: str | None, as_json: bool) -> None:
    """Rebuild a thread's state from its events alone (pure: calls no model, tool or other driver)."""
    with opened_thread(store, thread_id, as_json) as log:
        state = log.replay(parse_upto(upto))
    if as_json:
        emit_json(state.to_dict())
        return
    out().print(f"[bold]replayed thread {literal(thread_id)}[/] up to seq {state.seq} (head "
                f"{literal(state.head_hash[:16])}…): {status_line(state)}", highlight=False)
    out().print(effects_table(state.effects, "effects at that point (RecoveryResolver)"))
    if state.last_reply is not None:
        out().print(f"last reply: {trim(state.last_reply)}", highlight=False, markup=False)
    out().print("No model, tool or other driver was called.")


def effect_summary(log: ThreadLog, effect_id: str, recorded: bool, what: str, as_json: bool) -> None:
    """Print (or emit as JSON) an effect's new decision and the thread's status after a decision."""
    decision = effect_of(log, effect_id)
    state = log.snapshot()
    if as_json:
        emit_json({"recorded": recorded, "effect": decision.to_dict(), "thread": thread_summary(state)})
        return
    if recorded:
        out().print(f"recorded: {what}", highlight=False, markup=False)
    else:
        out().print(f"already recorded with the same resolution id and body: {what}; nothing written",
                    highlight=False, markup=False)
    out().print(effects_table({effect_id: decision}, "the effect now"))
    out().print(f"thread {literal(state.thread_id)}: {status_line(state)}", highlight=False)
    out().print(CONTINUES, highlight=False)


def parse_evidence(text: str | None) -> dict[str, Any] | None:
    """``--evidence`` as a JSON object (None when absent)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"--evidence is not valid JSON: {exc}", field="evidence") from exc
    if not isinstance(value, dict):
        raise InvalidInput("--evidence must be a JSON object", field="evidence")
    return value


def parse_result(text: str | None) -> Any:
    """``--result`` as a JSON value (None when absent; a JSON ``null`` is no result either)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"--result is not valid JSON: {exc} (quote a text: '\"charged\"')",
                           field="result") from exc


@threads_group.command("resolve", short_help="Record what happened to an effect whose outcome is unknown.")
@click.argument("store")
@click.argument("thread_id")
@click.argument("effect_id")
@click.option("--resolution", metavar="|".join(RESOLUTIONS),
              help="What happened: occurred, not_occurred, or abandoned_unknown (accept the uncertainty).")
@click.option("--note", default=None, help="Required: why you decided this (what you checked).")
@click.option("--resolution-id", default=None,
              help="Makes a retried command idempotent: same id and body -> no new event; another body -> exit 4.")
@click.option("--evidence", default=None, metavar="JSON",
              help='Optional evidence as a JSON object, e.g. \'{"bank_ref": "TX-991"}\' (recorded).')
@click.option("--result", "result_text", default=None, metavar="JSON",
              help="With occurred: the result you observed, as JSON (what the model is told the call returned), "
                   "e.g. '\"charged TX-991\"' or '{\"charge\": \"TX-991\"}'.")
@click.option("--actor", default=None, help="Who decides (recorded; default cli:<login name>).")
@json_option
def resolve_command(store: str, thread_id: str, effect_id: str, resolution: str | None, note: str | None,
                    resolution_id: str | None, evidence: str | None, result_text: str | None, actor: str | None,
                    as_json: bool) -> None:
    """Record what happened to an effect whose outcome is unknown (a fact, not a retry).

    Only an unknown effect can be resolved (exit 4 otherwise). The original
    events stay untouched; the decision is a new event. Then the thread can
    continue: the application that owns its agent continues it when it opens it
    (Harness.open_thread).
    """
    who = actor if actor is not None else default_actor()
    with opened_thread(store, thread_id, as_json, actor=who) as log:
        if resolution not in RESOLUTIONS:
            given = "is required" if resolution is None else f"{resolution!r} is not a resolution"
            raise InvalidInput(f"--resolution {given}: use one of {', '.join(RESOLUTIONS)}", field="resolution")
        if note is None or not note.strip():
            raise InvalidInput("--note is required: say why you decided this (what you checked)", field="note")
        check_effect_id(log, effect_id)
        recorded = log.resolve(effect_id, resolution, resolution_id=resolution_id, note=note, actor=who,
                               evidence=parse_evidence(evidence), result=parse_result(result_text))
        wake_worker(log)
        effect_summary(log, effect_id, recorded, f"effect {effect_id} resolved as {resolution} by {who}",
                       as_json)


def wake_worker(log: ThreadLog) -> None:
    """Put a thread that workers run back in their queue, so an operator's decision is not lost."""
    if log.store.get_work(thread_work_key(log.thread_id)) is not None:
        enqueue_thread(log.store, log.thread_id)


def parked_decision(store: str, thread_id: str, effect_id: str, phase: str, note: str | None,
                    actor: str | None, as_json: bool) -> None:
    """Record an approval or denial of a parked call and print the result."""
    who = actor if actor is not None else default_actor()
    with opened_thread(store, thread_id, as_json, actor=who) as log:
        check_effect_id(log, effect_id)
        log.decide_parked(effect_id, phase, actor=who, note=note)
        wake_worker(log)
        effect_summary(log, effect_id, True, f"call {effect_id} {phase} by {who}", as_json)


@threads_group.command("approve", short_help="Approve a parked call.")
@click.argument("store")
@click.argument("thread_id")
@click.argument("effect_id")
@click.option("--note", default=None, help="Why it may run (recorded).")
@click.option("--actor", default=None, help="Who decides (recorded; default cli:<login name>).")
@json_option
def approve_command(store: str, thread_id: str, effect_id: str, note: str | None, actor: str | None,
                    as_json: bool) -> None:
    """Approve a parked call (exit 4 if it is not parked); its application dispatches it when it opens the thread."""
    parked_decision(store, thread_id, effect_id, "approved", note, actor, as_json)


@threads_group.command("deny", short_help="Deny a parked call (the model is told).")
@click.argument("store")
@click.argument("thread_id")
@click.argument("effect_id")
@click.option("--note", default=None, help="Why it must not run (recorded; the model is told).")
@click.option("--actor", default=None, help="Who decides (recorded; default cli:<login name>).")
@json_option
def deny_command(store: str, thread_id: str, effect_id: str, note: str | None, actor: str | None,
                 as_json: bool) -> None:
    """Deny a parked call (exit 4 if it is not parked); the model is told when the thread continues."""
    parked_decision(store, thread_id, effect_id, "denied", note, actor, as_json)


@threads_group.command("resume", short_help="Resume a paused turn (quota, authentication, retries used up).")
@click.argument("store")
@click.argument("thread_id")
@click.option("--note", default=None, help="What was fixed (recorded).")
@click.option("--actor", default=None, help="Who resumes (recorded; default cli:<login name>).")
@json_option
def resume_command(store: str, thread_id: str, note: str | None, actor: str | None, as_json: bool) -> None:
    """Record an explicit resume of THREAD_ID's paused turn (exit 4 if it has none); its application, or a
    worker, continues it (one waiting out an automatic pause sees the resume within a second)."""
    who = actor if actor is not None else default_actor()
    with opened_thread(store, thread_id, as_json, actor=who) as log:
        log.resume_turn(actor=who, note=note)
        wake_worker(log)
        state = log.snapshot()
    if as_json:
        emit_json({"recorded": True, "thread": thread_summary(state)})
        return
    out().print(f"recorded: turn resumed by {literal(who)}; thread {literal(state.thread_id)}: {status_line(state)}",
                highlight=False)
    out().print(CONTINUES, highlight=False)


@threads_group.command("interrupt", short_help="Stop the turn in progress, whichever process runs it.")
@click.argument("store")
@click.argument("thread_id")
@click.option("--reason", default=None, help="Why (recorded).")
@click.option("--actor", default=None, help="Who interrupts (recorded; default cli:<login name>).")
@json_option
def interrupt_command(store: str, thread_id: str, reason: str | None, actor: str | None, as_json: bool) -> None:
    """Stop THREAD_ID's turn in progress (exit 4 if it has none). When no process runs it, it is ended now; when
    one does (a worker, an application), the interrupt is recorded and that process ends the turn at its next
    step: what it has in flight finishes and is recorded, nothing new starts."""
    who = actor if actor is not None else default_actor()
    with opened_thread(store, thread_id, as_json, actor=who) as log:
        outcome = log.interrupt(actor=who, reason=reason)
        state = log.snapshot()
    if as_json:
        emit_json({"outcome": outcome, "thread": thread_summary(state)})
        return
    said = ("turn ended" if outcome == "ended"
            else "interrupt recorded: the process running the turn ends it at its next step")
    out().print(f"{said}; thread {literal(state.thread_id)}: {status_line(state)}", highlight=False)


@threads_group.command("fork", short_help="Make a child thread from an event; the parent is unchanged.")
@click.argument("store")
@click.argument("thread_id")
@click.option("--at", "at", required=True, metavar="EVENT_ID", help="The event of THREAD_ID to fork at.")
@click.option("--input", "text", default=None, help="Start the child's first turn with this user input.")
@click.option("--actor", default=None, help="Who forks (recorded; default cli:<login name>).")
@json_option
def fork_command(store: str, thread_id: str, at: str, text: str | None, actor: str | None, as_json: bool) -> None:
    """Make a child thread with THREAD_ID's state at event --at; the parent does not change.

    Effects still open at that event are not inherited. With --input the child
    gets a pending turn that its application runs when it opens the child
    (Harness.open_thread).
    """
    who = actor if actor is not None else default_actor()
    with opened_thread(store, thread_id, as_json, actor=who) as log:
        if text is not None and (not text.strip() or len(text) > MAX_INPUT_CHARS):
            raise InvalidInput(f"--input must be non-empty text of at most {MAX_INPUT_CHARS} characters",
                               field="input")
        child = log.fork(at)
        turn_id = child.start_turn(text)[0] if text is not None else None
        state = child.snapshot()
    if as_json:
        emit_json({"thread_id": state.thread_id, "parent": state.parent, "turn_id": turn_id,
                   "status": state.status, "seq": state.seq, "head_hash": state.head_hash})
        return
    parent = state.parent or {}
    out().print(f"forked thread [bold]{literal(state.thread_id)}[/]", highlight=False)
    out().print(f"  parent thread {parent.get('thread_id')}\n  at event      {parent.get('event_id')} "
                f"(seq {parent.get('seq')})\n  parent hash   {parent.get('hash')}", highlight=False, markup=False)
    out().print(f"  stream        {stream_of(state.thread_id)}, {state.seq} event(s)", highlight=False,
                markup=False)
    if turn_id is not None:
        out().print(f"  pending turn  {turn_id}: {trim(text)}", highlight=False, markup=False)
        out().print(CONTINUES, highlight=False)


__all__ = ["CONTINUES", "EFFECT_STYLE", "STATUS_STYLE", "effects_table", "messages_table", "threads_group"]

"""``jixu demo``: one minute that shows what jixu is for.

A refund agent (a scripted, offline model and two real side-effecting tools)
runs in a child process that kills itself with SIGKILL right after the refund
reached the "payment system" (an append-only file) and before jixu recorded
the receipt. The parent reopens the thread: the refund's outcome is
``unknown`` and the tool is unsafe, so jixu does not retry it. The refund tool
declares a probe: jixu asks it first, the probe finds the refund by its
idempotency key, and its answer is recorded as the resolution (actor
``probe:issue_refund``) without an operator. The thread goes on to e-mail the
customer with a tool that has no probe; the mail server's connection drops
after it accepted the message, the outcome is unknown, and only an operator
can settle it: the demo checks the outbox and records the decision. The
thread then finishes, is replayed without calling any driver, verified and
forked. Every step checks its own expectation; any surprise exits 1.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
from rich.panel import Panel
from rich.table import Table

import jixu
from jixu.cli.output import CLIConsole, console, err_console, handled, literal
from jixu.cli.threads import STATUS_STYLE, effects_table, messages_table, styled
from jixu.ledger import Event
from jixu.ledger.encoding import JSONObject
from jixu.recovery import EffectDecision
from jixu.threads import (
    Agent,
    Harness,
    NotOccurred,
    Occurred,
    ProbeQuery,
    ScriptedModel,
    Thread,
    ToolCall,
    ToolContext,
    tool,
)
from jixu.threads.model import Step

ORDER = "42"
AMOUNT = 25.0
REQUEST = f"Refund order {ORDER}"
FINAL_REPLY = f"Refund for order {ORDER} issued."
FORK_INPUT = "Actually, refund only half."
TOOL_NAME = "issue_refund"
NOTIFY_NAME = "notify_customer"
NOTICE = f"Your refund for order {ORDER} was issued."
WORKER_OWNER = "refund-worker"
"""The worker's owner name: a restarted worker with the same name reclaims its own turns at once."""


class DemoFailed(Exception):
    """A step of the demo did not turn out as the story says it must."""


def expect(condition: bool, message: str) -> None:
    """Stop the demo with ``message`` unless ``condition`` holds."""
    if not condition:
        raise DemoFailed(message)


@dataclass
class RefundAgent:
    """The demo's agent, its scripted model and the calls its tools made in this process."""

    agent: Agent
    model: ScriptedModel
    issued: list[str] = field(default_factory=list)
    """Effect ids the refund tool ran for in this process."""
    mailed: list[str] = field(default_factory=list)
    """Effect ids the e-mail tool ran for in this process."""


def _last_tool(messages: list[JSONObject]) -> JSONObject | None:
    last = messages[-1] if messages else {}
    return last if last.get("role") == "tool" else None


def refund_script(messages: list[JSONObject]) -> Step:
    """The scripted model: ask for the refund, then tell the customer, then report."""
    last = messages[-1] if messages else {}
    if last.get("role") == "user":
        amount = AMOUNT / 2 if "half" in str(last.get("content")).lower() else AMOUNT
        return ToolCall(TOOL_NAME, {"order": ORDER, "amount": amount})
    answer = _last_tool(messages)
    status = answer.get("status") if answer else None
    if answer is not None and answer.get("name") == TOOL_NAME:
        if status in ("ok", "occurred"):
            return ToolCall(NOTIFY_NAME, {"order": ORDER, "text": NOTICE})
        if status == "not_occurred":
            return ToolCall(TOOL_NAME, {"order": ORDER, "amount": AMOUNT})
    if answer is not None and answer.get("name") == NOTIFY_NAME:
        if status in ("ok", "occurred"):
            return FINAL_REPLY
        if status == "not_occurred":
            return ToolCall(NOTIFY_NAME, {"order": ORDER, "text": NOTICE})
    return f"The refund for order {ORDER} could not be confirmed ({status}); an operator should check it."


def _append_line(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def refund_agent(outside: Path, *, crash_after_write: bool = False, outbox: Path | None = None,
                 drop_mail_connection: bool = False) -> RefundAgent:
    """The one agent definition both processes use, so the thread's recorded contract matches.

    ``issue_refund`` is ``unsafe``: it appends a line to ``outside`` (fsynced),
    standing in for a payment system. With ``crash_after_write`` the process
    SIGKILLs itself right after the line is durable, before jixu can record the
    receipt. Its probe looks the refund up in ``outside`` by the call's
    idempotency key. ``notify_customer`` is ``unsafe`` and has no probe: it
    appends the e-mail to ``outbox`` (the mail server's log); with
    ``drop_mail_connection`` the connection drops after the mail server
    accepted it, so the call's outcome is unknown.
    """
    issued: list[str] = []
    mailed: list[str] = []
    mail_log = outbox if outbox is not None else outbox_of(outside)

    def find_refund(query: ProbeQuery) -> Occurred | NotOccurred:
        """Ask the payment system for the refund made with this call's idempotency key (read-only)."""
        lines = outside.read_text(encoding="utf-8").splitlines() if outside.exists() else []
        for number, text in enumerate(lines, start=1):
            if f" key={query.idempotency_key} " in f" {text} ":
                return Occurred(result=f"refunded {query.args['amount']:.2f} on order {query.args['order']}",
                                evidence={"source": str(outside), "line": number, "text": text})
        return NotOccurred(evidence={"source": str(outside), "key": query.idempotency_key,
                                     "lines_searched": len(lines)})

    @tool(semantics="unsafe", probe=find_refund)
    def issue_refund(order: str, amount: float, ctx: ToolContext) -> str:
        """Refund ``amount`` on ``order`` in the payment system (a retry could refund twice)."""
        _append_line(outside, f"refund order={order} amount={amount:.2f} effect={ctx.effect_id} "
                              f"key={ctx.idempotency_key}\n")
        issued.append(ctx.effect_id)
        if crash_after_write:
            print(f"worker: the payment system recorded the refund (effect {ctx.effect_id}); "
                  "killing myself with SIGKILL before jixu records the receipt", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return f"refunded {amount:.2f} on order {order}"

    @tool(semantics="unsafe")
    def notify_customer(order: str, text: str, ctx: ToolContext) -> str:
        """E-mail the customer about ``order`` (a retry would send the e-mail twice)."""
        _append_line(mail_log, f"mail order={order} effect={ctx.effect_id} text={text!r}\n")
        mailed.append(ctx.effect_id)
        if drop_mail_connection:
            raise ConnectionResetError("the mail server closed the connection before confirming the message")
        return f"e-mailed the customer about order {order}"

    model = ScriptedModel(refund_script)
    agent = Agent("refunds", model, instructions="Issue the refunds customers ask for, exactly once, and tell them.",
                  tools=[issue_refund, notify_customer])
    return RefundAgent(agent, model, issued, mailed)


def outbox_of(outside: Path) -> Path:
    """The mail server's log beside the payment system's: ``outbox.log``."""
    return outside.with_name("outbox.log")


def lines_for(outside: Path, effect_id: str) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line of ``outside`` that records ``effect_id``."""
    if not outside.exists():
        return []
    found = []
    for number, text in enumerate(outside.read_text(encoding="utf-8").splitlines(), start=1):
        if f"effect={effect_id} " in text + " ":
            found.append((number, text))
    return found


def events_table(events: list[Event], title: str) -> Table:
    """Seq, type and effect of ``events``."""
    table = Table(title=title)
    table.add_column("seq")
    table.add_column("type")
    table.add_column("effect", no_wrap=True, min_width=26)
    for e in events:
        effect = e.data.get("effect_id")
        table.add_row(str(e.seq), literal(e.type), literal(effect) if isinstance(effect, str) else "")
    return table


class Demo:
    """The parent's side of the story, step by step."""

    def __init__(self, store: Path, outside: Path, shown_store: str) -> None:
        self.store = store
        self.outside = outside
        self.outbox = outbox_of(outside)
        self.shown_store = shown_store
        # panels wrap; pipes get 120 columns
        self.out = CLIConsole(emoji=False) if console.is_terminal else CLIConsole(width=120, emoji=False)

    def step(self, number: int, title: str, text: str) -> None:
        """Print a step's heading and what it is about to show."""
        self.out.print()
        self.out.print(Panel(text, title=f"[bold]{number}. {title}[/]", title_align="left", border_style="blue"))

    def say(self, text: str) -> None:
        """One plain line."""
        self.out.print(text, highlight=False)

    async def run(self) -> None:
        """All six steps."""
        demo = refund_agent(self.outside)
        harness = Harness(demo.agent, self.store)
        try:
            thread = await harness.create_thread(metadata={"demo": "refund"})
        finally:
            harness.close()
        thread_id = thread.thread_id
        self.step(1, "An agent that issues refunds",
                  f"Agent [bold]refunds[/]: a scripted, offline model and two tools, both declared [bold]unsafe[/] "
                  "(calling one twice would do it twice):\n"
                  f"  [bold]{TOOL_NAME}[/](order, amount) appends a line (order, amount, effect id, idempotency "
                  f"key) to [bold]{literal(self.outside)}[/] and fsyncs it: that file stands in for the payment system. "
                  "It declares a [bold]probe[/]: a read-only function that looks a refund up there by its "
                  "idempotency key.\n"
                  f"  [bold]{NOTIFY_NAME}[/](order, text) appends the e-mail to [bold]{literal(self.outbox)}[/], the mail "
                  "server's log. It has no probe.\n"
                  f"Store:  {literal(self.store)}\nThread: {thread_id}")

        self.step(2, "A worker process sends the request and dies mid-call",
                  f"A child process opens the thread, sends [italic]{REQUEST!r}[/] and runs the agent. Right "
                  "after the tool's line is durable in the payment system, and before jixu can record the "
                  "receipt, the worker kills itself with SIGKILL: no cleanup, no exception handler, nothing.")
        returncode = self.run_worker(thread_id)
        expect(returncode == -signal.SIGKILL,
               f"the worker should have died of SIGKILL (exit -{int(signal.SIGKILL)}); it exited {returncode}")
        self.say(f"The worker died: killed by signal {int(signal.SIGKILL)} (SIGKILL), exit status {returncode}.")

        # The parent plays the restarted worker: the same owner name lets it reclaim the dead worker's turn
        # at once instead of waiting for the lease to expire (see Harness(owner=...)).
        demo = refund_agent(self.outside, drop_mail_connection=True)
        harness = Harness(demo.agent, self.store, owner=WORKER_OWNER)
        try:
            await self.recover(harness, demo, thread_id)
        finally:
            harness.close()

    def run_worker(self, thread_id: str) -> int:
        """Run the worker in a child process; print what it said; return its exit status."""
        env = dict(os.environ)
        src = str(Path(jixu.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "jixu", "demo", "--store", str(self.store), "--outside",
                   str(self.outside), "--worker", thread_id]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
        for line in done.stdout.splitlines():
            self.say(f"  [dim]│[/] {literal(line)}")
        if done.returncode != -signal.SIGKILL and done.stderr.strip():
            err_console.print(done.stderr, markup=False, highlight=False)
        return done.returncode

    async def recover(self, harness: Harness, demo: RefundAgent, thread_id: str) -> None:
        """Steps 3 to 7, with the parent's harness."""
        thread = await harness.open_thread(thread_id, resume=False)
        self.step(3, "The parent reopens the thread: the refund's outcome is unknown",
                  "Harness.open_thread(thread_id) loads the events and asks the RecoveryResolver, the single "
                  "authority on every effect, what is known.")
        tail = [e for e in await thread.events() if e.type.startswith("tool.")]
        self.out.print(events_table(tail, "what the ledger holds about the tool call"))
        state = thread.state()
        self.out.print(effects_table(state.effects, "the resolver's decision on every effect", compact=True))
        refunds = [d for d in state.effects.values() if d.kind == "tool" and d.name == TOOL_NAME]
        expect(len(refunds) == 1, f"expected one {TOOL_NAME} effect, found {len(refunds)}")
        refund = refunds[0]
        effect_id = refund.effect_id
        expect(refund.state == "unknown" and refund.reason == "dispatched_without_receipt",
               f"the refund should be unknown (dispatched, no receipt); it is {refund.state} ({refund.reason})")
        expect(refund.semantics == "unsafe" and not refund.retry_safe, "the refund should be unsafe to retry")
        self.say(f"Effect {effect_id} ({TOOL_NAME}) is [bold yellow]unknown[/]: it was dispatched and no receipt "
                 "was recorded. It is [bold]unsafe[/], so retrying could refund twice.")
        await self.probe(thread, demo, effect_id)
        await self.operator(thread, demo, effect_id)

    async def probe(self, thread: Thread, demo: RefundAgent, effect_id: str) -> None:
        """Step 4: the refund tool's probe settles the unknown refund; nobody is asked."""
        self.step(4, "The tool's probe asks the payment system: settled without an operator",
                  f"{TOOL_NAME} declares a probe, so before anyone is asked jixu runs it (thread.wait()): the "
                  "probe is an effect of its own (intent, dispatch marker, receipt; read-only, so it simply runs "
                  "again after a crash). It looks the refund up by the call's idempotency key. Its definite "
                  "answer is recorded as the call's outcome resolution, by actor "
                  f"[bold]probe:{TOOL_NAME}[/] with its evidence, and the thread continues with what it found.")
        state = await thread.wait()
        events = await thread.events()
        probing = [e for e in events if e.type.startswith("probe.")
                   or (e.type == "tool.outcome_resolved" and e.data.get("effect_id") == effect_id)]
        self.out.print(events_table(probing, "what the probe recorded"))
        resolution = state.effects[effect_id].resolution or {}
        found = (resolution.get("evidence") or {}).get("found") or {}
        expect(resolution.get("resolution") == "occurred" and resolution.get("actor") == f"probe:{TOOL_NAME}",
               f"the probe should have settled the refund as occurred; its resolution is {resolution or None}")
        records = state.probes.get(effect_id, ())
        expect(len(records) == 1, f"the probe should have been asked once; it was asked {len(records)} times")
        self.say(f"The probe (effect {records[0].get('effect_id')}) answered [bold]occurred[/]: "
                 + literal(f"{self.outside.name} line {found.get('line')}: {found.get('text')}"))
        self.say(f"Recorded: {effect_id} → occurred (actor probe:{TOOL_NAME}, the probe's evidence attached). "
                 "No operator was asked.")
        expect(len(lines_for(self.outside, effect_id)) == 1 and not demo.issued,
               "the refund must not be issued again")
        self.say(f"jixu did [bold]not[/] retry the refund: {literal(self.outside.name)} still has exactly 1 line for "
                 "this effect.")
        mails = [d for d in state.effects.values() if d.kind == "tool" and d.name == NOTIFY_NAME]
        expect(len(mails) == 1, f"the thread should have gone on to e-mail the customer; {len(mails)} e-mails")
        expect(state.status == "waiting", f"the thread should wait for the e-mail's outcome; it is {state.status}")

    async def operator(self, thread: Thread, demo: RefundAgent, refund_id: str) -> None:
        """Step 5: a tool without a probe: the operator path."""
        state = thread.state()
        [mail] = [d for d in state.effects.values() if d.kind == "tool" and d.name == NOTIFY_NAME]
        self.step(5, "A tool without a probe: an operator decides",
                  f"The thread went on and called {NOTIFY_NAME}. The mail server accepted the e-mail, then "
                  "dropped the connection before confirming it: the outcome is unknown. That tool has no probe, so "
                  "jixu does not guess and does not retry: the thread waits for an operator. The demo plays the "
                  f"operator: it reads {literal(self.outbox.name)}, finds the e-mail by its effect id and records "
                  "[bold]occurred[/] with the evidence. The original events stay untouched.")
        expect(mail.state == "unknown" and mail.reason == "indeterminate_failure",
               f"the e-mail should be unknown (its connection dropped); it is {mail.state} ({mail.reason})")
        self.say(f"Effect {mail.effect_id} ({NOTIFY_NAME}) is [bold yellow]unknown[/] and the thread is "
                 f"{styled(state.status, STATUS_STYLE)}: {literal(state.reason)}.")
        lines = lines_for(self.outbox, mail.effect_id)
        expect(len(lines) == 1, f"the outbox should hold exactly 1 e-mail for {mail.effect_id}; it holds "
                                f"{len(lines)}")
        number, text = lines[0]
        self.say(literal(f"Evidence, {self.outbox.name} line {number}: {text}"))
        note = f"{self.outbox.name} line {number} shows this e-mail with effect id {mail.effect_id}"
        await thread.resolve_tool_outcome(mail.effect_id, "occurred", note=note, actor="demo-operator",
                                          evidence={"source": str(self.outbox), "line": number, "text": text})
        self.say(f"Recorded: {mail.effect_id} → occurred (actor demo-operator). The thread continues.")
        state = await thread.wait()
        expect(state.status == "idle" and state.last_reply == FINAL_REPLY,
               f"the thread should finish with {FINAL_REPLY!r}; it is {state.status} with {state.last_reply!r}")
        self.out.print(effects_table(state.effects, "the resolver's decisions now", compact=True))
        self.out.print(messages_table(state.messages, "the conversation"))
        self.say(f"Final reply: [bold green]{literal(state.last_reply)}[/]")
        expect(len(lines_for(self.outside, refund_id)) == 1 and not demo.issued,
               "the refund must not have been issued again")
        expect(len(lines_for(self.outbox, mail.effect_id)) == 1 and demo.mailed == [mail.effect_id],
               "the e-mail must have been sent once")
        self.say(f"{literal(self.outside.name)} has exactly 1 line for the refund and {literal(self.outbox.name)} 1 "
                 "for the e-mail: "
                 "each happened once.")

        await self.replay_and_verify(thread, demo, state.effects)
        child_id = await self.fork(thread, refund_id)
        self.finish(thread.thread_id, child_id)

    async def replay_and_verify(self, thread: Thread, demo: RefundAgent, live: dict[str, EffectDecision]) -> None:
        """Step 6: pure replay and hash-chain verification."""
        self.step(6, "Replay and verify",
                  "Replay rebuilds the state from the events alone: it calls no model and no tool. "
                  "Verification recomputes the hash chain over every event.")
        model_calls, tool_calls = len(demo.model.calls), len(demo.issued) + len(demo.mailed)
        replayed = await thread.replay()
        expect(len(demo.model.calls) == model_calls and len(demo.issued) + len(demo.mailed) == tool_calls,
               "replay must not call the model or the tool")
        expect(replayed.status == "idle" and replayed.last_reply == FINAL_REPLY,
               f"the replayed thread should be idle with the final reply; it is {replayed.status}")
        expect({k: d.to_dict() for k, d in replayed.effects.items()} == {k: d.to_dict() for k, d in live.items()},
               "the replayed decisions should equal the live ones")
        self.say(f"replay: status {styled(replayed.status, STATUS_STYLE)}, {len(replayed.effects)} effects, the "
                 f"same decisions as live; model calls {model_calls} → {len(demo.model.calls)}, tool calls "
                 f"{tool_calls} → {len(demo.issued) + len(demo.mailed)}: no driver was called.")
        report = thread.log.store.verify(thread.stream)
        expect(report.valid, f"the hash chain should verify: {report.reason} at seq {report.first_bad_seq}")
        self.say(f"verify: hash chain [green]valid[/], {report.count} events, head hash {report.head_hash}")

    async def fork(self, thread: Thread, effect_id: str) -> str:
        """Step 7: fork where the model asked for the refund; the parent does not change."""
        events = await thread.events()
        asked = [e for e in events if e.type == "model.completed"
                 and any(c.get("name") == TOOL_NAME for c in (e.data.get("result") or {}).get("tool_calls", []))]
        expect(bool(asked), "the model's request for the refund should be in the thread")
        at = asked[0]
        self.step(7, "Fork: try another path without touching the original",
                  f"Fork the thread at event {at.id} (seq {at.seq}, the model's answer asking for the refund, "
                  f"before the tool ran) and give the child the input [italic]{FORK_INPUT!r}[/]. The refund "
                  "call still open at that point is not inherited: the child never claims the parent's effect.")
        before = thread.log.store.verify(thread.stream)
        child = await thread.fork(at.id)
        child.log.start_turn(FORK_INPUT)  # queued: the application that owns the agent claims and runs it
        after = thread.log.store.verify(thread.stream)
        expect((before.count, before.head_hash) == (after.count, after.head_hash),
               "forking must not change the parent")
        parent = child.log.state.parent or {}
        expect(parent.get("thread_id") == thread.thread_id and parent.get("event_id") == at.id
               and parent.get("hash") == at.hash, "the child's lineage should name the fork point")
        child_report = child.log.store.verify(child.stream)
        expect(child_report.valid, "the child's hash chain should verify")
        child_state = child.state()
        expect(effect_id not in child_state.effects, "the child must not inherit the parent's effect")
        lineage = Table(title=f"child thread {literal(child.thread_id)}")
        lineage.add_column("lineage")
        lineage.add_column("value")
        lineage.add_row("parent thread", literal(parent.get("thread_id")))
        lineage.add_row("fork event", literal(f"{parent.get('event_id')} (seq {parent.get('seq')})"))
        lineage.add_row("parent hash there", literal(parent.get("hash")))
        lineage.add_row("child events", f"{child_report.count} (chain valid, linked to the parent hash)")
        self.out.print(lineage)
        self.out.print(messages_table(child_state.messages, "the child's conversation"))
        self.say(f"The child's turn {FORK_INPUT!r} is pending: the application that owns the agent runs it when "
                 "it opens the child (Harness.open_thread).")
        self.say(f"Parent unchanged: {before.count} events before and after, head hash {after.head_hash[:16]}… "
                 "both times.")
        return child.thread_id

    def finish(self, thread_id: str, child_id: str) -> None:
        """The commands to look further."""
        store = shlex.quote(self.shown_store)
        commands = "\n".join([
            f"jixu threads show {store} {thread_id}",
            f"jixu threads events {store} {thread_id}",
            f"jixu threads show {store} {child_id}",
            f"jixu threads list {store}",
            f"jixu verify {store}",
        ])
        self.out.print()
        self.out.print(Panel(f"A crash between the side effect and its receipt left the refund [bold]unknown[/]; "
                             f"jixu did not guess or retry: the tool's probe found the refund and settled it, "
                             f"and for the e-mail, whose tool has no probe, an operator's recorded decision let the "
                             f"thread finish. Each happened exactly once.\n\nLook further:\n{literal(commands)}",
                             title="[bold green]demo complete[/]", title_align="left", border_style="green"))


async def run_worker(store: Path, outside: Path, thread_id: str) -> int:
    """The child process: open the thread, send the request and run until the tool kills us."""
    demo = refund_agent(outside, crash_after_write=True)
    harness = Harness(demo.agent, store, owner=WORKER_OWNER)
    try:
        thread = await harness.open_thread(thread_id)
        print(f"worker (pid {os.getpid()}): opened thread {thread_id}; sending {REQUEST!r}", flush=True)
        await thread.send(REQUEST)
        state = await thread.wait()
    finally:
        harness.close()
    print(f"worker: finished without crashing (status {state.status}); the demo expected a SIGKILL", flush=True)
    return 1


@click.command("demo", short_help="See jixu in one minute: a crash mid-refund, a probe, and no guessing.")
@click.option("--store", default="jixu.db", show_default=True, type=click.Path(dir_okay=False),
              help="SQLite file for the demo's threads (created if missing; re-runs add a new thread).")
@click.option("--outside", default=None, type=click.Path(dir_okay=False),
              help="The file standing in for the payment system [default: outside-system.log beside the store].")
@click.option("--worker", "worker", default=None, hidden=True, help="Internal: run the crashing worker.")
def demo_command(store: str, outside: str | None, worker: str | None) -> None:
    """See jixu in one minute: a crash mid-refund, a probe, an operator's decision, replay and fork.

    Runs offline (a scripted model) in the current directory: a worker process
    is SIGKILLed after its refund reached the outside system but before the
    receipt was recorded; jixu reopens the thread, finds the outcome unknown,
    refuses to retry, and asks the refund tool's probe, which finds the refund
    and settles it. An e-mail whose tool has no probe then loses its answer and
    waits for an operator's resolution. Exit 0 when every step turned out as
    promised, 1 otherwise.
    """
    if "://" in store or store.startswith("sqlite:"):  # the demo's worker is another process: it needs a file
        raise click.UsageError(f"--store {store!r}: give the path of a SQLite file (the demo's crashing worker is a "
                               "second process, which must open the same file)")
    store_path = Path(store)
    outside_path = Path(outside) if outside is not None else store_path.parent / "outside-system.log"
    if outside_path.is_dir():
        raise click.UsageError(f"--outside {outside_path} is a directory; give the path of a file")
    if worker is not None:
        sys.exit(asyncio.run(run_worker(store_path.resolve(), outside_path.resolve(), worker)))
    demo = Demo(store_path.resolve(), outside_path.resolve(), store)
    with handled(False):
        try:
            asyncio.run(demo.run())
        except DemoFailed as failure:
            err_console.print(Panel(literal(failure), title="[bold red]the demo's expectation was violated[/]",
                                    title_align="left", border_style="red"))
            sys.exit(1)


__all__ = ["FINAL_REPLY", "RefundAgent", "demo_command", "outbox_of", "refund_agent", "refund_script"]

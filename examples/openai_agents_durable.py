"""An unchanged OpenAI Agents SDK agent, durable on a jixu thread: SIGKILLed right after its unsafe tool ran.

Run ``python examples/openai_agents_durable.py`` (offline: the model is the SDK's own ``agents.testing.ScriptedModel``).

1. A child process runs the agent with ``DurableRunner``. The model asks for ``send_invoice``; the tool appends
   one line to ``invoices.log`` and the process is SIGKILLed before jixu records the receipt.
2. This process runs the same agent again with the thread id. The first model call returns its recorded answer
   (the rerun's model is scripted with the final answer only: it would raise if asked anything else); the
   tool call is ``unknown`` and unsafe, so it is not sent again: its probe finds the line by the call's
   idempotency key, and the agent finishes.
3. ``invoices.log`` holds exactly one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from jixu import NotOccurred, Occurred, ProbeQuery, RecoveryResolver
from jixu.integrations.openai_agents import DurableRunner, current_effect, durable_tool
from jixu.ledger import open_store
from jixu.threads.log import ThreadLog

set_tracing_disabled(True)  # the SDK would send traces to OpenAI

WORK = Path(os.environ.get("INVOICE_DIR") or tempfile.mkdtemp(prefix="jixu-oai-"))
STORE = f"sqlite:///{WORK / 'agents.db'}"
INVOICES = WORK / "invoices.log"


def invoice_lines() -> list[str]:
    return INVOICES.read_text().splitlines() if INVOICES.exists() else []


def find_invoice(query: ProbeQuery) -> Occurred | NotOccurred:
    """The invoicing system's lookup by idempotency key (read-only): did the call happen?"""
    for number, line in enumerate(invoice_lines(), start=1):
        if query.idempotency_key in line:
            return Occurred(result=f"invoice {number} sent", evidence={"line": number})
    return NotOccurred(evidence={"searched": len(invoice_lines())})


@durable_tool(semantics="unsafe", probe=find_invoice)
@function_tool
def send_invoice(customer: str, amount: int) -> str:
    """Send an invoice to a customer."""
    with INVOICES.open("a") as file:
        file.write(f"{customer} {amount} key={current_effect().idempotency_key}\n")
        file.flush()
        os.fsync(file.fileno())
    if os.environ.get("INVOICE_CRASH") == "1":
        os.kill(os.getpid(), signal.SIGKILL)  # dies between the side effect and its receipt
    return f"invoice {len(invoice_lines())} sent"


def billing_agent(model: ScriptedModel) -> Agent[None]:
    return Agent(name="billing", instructions="Invoice what you are asked to.", model=model, tools=[send_invoice])


def child() -> None:
    model = ScriptedModel([[function_call("send_invoice", {"customer": "ada", "amount": 120}, call_id="call_1")]])
    DurableRunner(STORE).run_sync(billing_agent(model), "Invoice ada 120 EUR",
                                  started=lambda thread_id: print(thread_id, flush=True))


def main() -> None:
    done = subprocess.run([sys.executable, __file__, "child"], env={**os.environ, "INVOICE_DIR": str(WORK),
                                                                    "INVOICE_CRASH": "1"},
                          capture_output=True, text=True, check=False)
    thread_id = done.stdout.split()[0]
    print(f"child killed by signal {-done.returncode}; invoices.log has {len(invoice_lines())} line(s)")
    store = open_store(STORE)
    analysis = RecoveryResolver.analyze(ThreadLog.load(store, thread_id).events())
    print("after the kill:", {d.name: d.state for d in analysis.decisions.values()})

    model = ScriptedModel([[assistant_message("Invoice sent to ada.")]])
    result = DurableRunner(STORE).run_sync(billing_agent(model), "Invoice ada 120 EUR", thread_id=thread_id)

    print("final output:", result.final_output)
    events = ThreadLog.load(store, thread_id).events()
    print("steps:", [e.data["step"] for e in events if e.type == "tool.requested"])
    [resolved] = [e.data for e in events if e.type == "tool.outcome_resolved"]
    print("settled by:", resolved["actor"], resolved["resolution"])
    print(f"invoices.log has {len(invoice_lines())} line(s)")
    store.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        child()
    else:
        main()

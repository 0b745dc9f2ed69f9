"""A pydantic-ai agent made durable by jixu, killed between its payment's side effect and the receipt.

    pip install "jixu[pydantic-ai]"
    python examples/pydantic_ai_durable.py

Runs offline: the model is pydantic-ai's own ``FunctionModel`` (it calls ``charge`` once, then answers), the bank
is a file. The first run happens in a child process that SIGKILLs itself inside ``charge`` right after the bank
wrote its line. This process then runs the same agent again with the thread id: the recorded model response is
returned without asking the model, the charge is ``unknown`` (jixu never runs an unsafe call twice), the probe
finds it in the bank by its idempotency key, and the agent finishes. The bank holds one charge.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from jixu import NotOccurred, Occurred, ProbeQuery, RecoveryResolver
from jixu.integrations.pydantic_ai import JixuAgent, current_effect, effect
from jixu.ledger import open_store
from jixu.threads.log import ThreadLog


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The 'LLM': charge order 7, then say what the bank answered."""
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(f"Charged order 7: {returns[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("charge", {"order": 7}, tool_call_id="call_1")])


def build(bank: Path, *, crash: bool) -> Agent[None, str]:
    """An ordinary pydantic-ai agent; ``@effect`` only tells jixu how to treat ``charge``."""

    def find_charge(query: ProbeQuery) -> Occurred | NotOccurred:
        """Ask the bank whether it holds a charge with the call's idempotency key (read-only)."""
        for number, line in enumerate(bank.read_text().splitlines() if bank.exists() else [], start=1):
            if query.idempotency_key in line:
                return Occurred(result=f"receipt {number}", evidence={"line": number})
        return NotOccurred(evidence={"searched": str(bank)})

    agent = Agent(FunctionModel(model), name="shop")

    @agent.tool_plain
    @effect(semantics="unsafe", probe=find_charge)
    def charge(order: int) -> str:
        """Charge an order (a payment: it must never happen twice)."""
        with bank.open("a") as file:
            file.write(f"order {order} key {current_effect().idempotency_key}\n")
            file.flush()
            os.fsync(file.fileno())
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies before jixu records the receipt
        return f"receipt {len(bank.read_text().splitlines())}"

    return agent


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--crash":  # the child: start the run, die inside charge
        store, bank = sys.argv[2], Path(sys.argv[3])
        durable = JixuAgent(build(bank, crash=True), store)
        thread_id = durable.new_thread_sync()
        print(thread_id, flush=True)
        durable.run_sync("Charge order 7.", thread_id=thread_id)
        return

    work = Path(tempfile.mkdtemp(prefix="jixu-pydantic-ai-"))
    store, bank = f"sqlite:///{work / 'jixu.db'}", work / "bank.txt"
    child = subprocess.run([sys.executable, __file__, "--crash", store, str(bank)], capture_output=True, text=True,
                           check=False)
    thread_id = child.stdout.split()[0]
    print(f"run 1 (pid killed with signal {-child.returncode}): killed inside charge, thread {thread_id}")

    with open_store(store) as opened:
        decisions = RecoveryResolver.analyze(ThreadLog.load(opened, thread_id).events()).decisions.values()
        print("  the record says: " + ", ".join(f"{d.name} {d.state}" for d in decisions))

    with JixuAgent(build(bank, crash=False), store) as durable:
        result = durable.run_sync("Charge order 7.", thread_id=thread_id)
    print(f"run 2 (this process): answer: {result.output}")
    with open_store(store) as opened:
        for event in ThreadLog.load(opened, thread_id).events():
            if event.type == "tool.outcome_resolved":
                print(f"  the unknown charge was settled {event.data['resolution']} by {event.data['actor']}")
    print(f"charges in the bank: {len(bank.read_text().splitlines())}")
    print(f"see it all: jixu threads show {store} {thread_id}")


if __name__ == "__main__":
    main()

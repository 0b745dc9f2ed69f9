"""The child program of ``test_sync_api``: a synchronous script that leaves without closing its harness.

Run as ``JIXU_TEST_OUTBOX=PATH python -m tests.threads.sync_child STORE_URL MODE``:

* ``parked``: a turn whose email needs approval stops ``waiting`` on the parked call; the script prints the
  thread id and ends.
* ``in_flight``: the script sends and ends as soon as the email (0.3 s) is in flight on the harness's loop
  (a daemon thread).

Neither closes the :class:`~jixu.SyncHarness`: the interpreter's exit does (decision 0036), letting the call
in flight finish and giving the lease back. ``PATH`` is the mail server's log: one line per email sent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jixu import Agent, SyncHarness, ToolCall, ToolContext, tool
from jixu.threads import ScriptedModel

STARTED = threading.Event()


OUTBOX = "JIXU_TEST_OUTBOX"
"""The environment variable naming the mail server's log (the parent's tools write to it too)."""


def _outbox() -> Path:
    return Path(os.environ[OUTBOX])


@tool(semantics="unsafe", requires_approval=True)
def send_email_approved(to: str, ctx: ToolContext) -> str:
    """Send an email once an operator approved it."""
    with _outbox().open("a", encoding="utf-8") as outbox:
        outbox.write(f"{to} {ctx.effect_id}\n")
    return f"sent to {to}"


@tool(semantics="unsafe")
def send_email_slowly(to: str, ctx: ToolContext) -> str:
    """Send an email; the mail server takes 0.3 s to accept it (``STARTED`` says the call began)."""
    STARTED.set()
    time.sleep(0.3)
    with _outbox().open("a", encoding="utf-8") as outbox:
        outbox.write(f"{to} {ctx.effect_id}\n")
    return f"sent to {to}"


def script(tool_name: str) -> Any:
    def step(messages: list[dict[str, Any]]) -> Any:
        return "Sent." if messages[-1]["role"] == "tool" else ToolCall(tool_name, {"to": "a@example.com"})
    return step


def agent(mode: str) -> Agent:
    """The agent of ``mode`` (the parent opens the thread with the same definition)."""
    name = "send_email_approved" if mode == "parked" else "send_email_slowly"
    tools = [send_email_approved] if mode == "parked" else [send_email_slowly]
    return Agent(name=f"mailer-{mode}", model=ScriptedModel(script(name)), tools=tools)


def main(store_url: str, mode: str) -> None:
    harness = SyncHarness(agent(mode), store_url, owner=f"child-{mode}")
    thread = harness.create_thread()
    if mode == "parked":
        state = thread.run_sync("Email a@example.com")
        print(thread.thread_id, state.status, flush=True)
    else:
        thread.send("Email a@example.com")
        STARTED.wait(10)  # the email is in flight on the harness's loop when the script ends
        print(thread.thread_id, "in flight", flush=True)
    # No close(): the interpreter's exit closes the harness.


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

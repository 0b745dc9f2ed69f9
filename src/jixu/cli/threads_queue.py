"""``jixu threads create|send``: record a thread and queue its input in a store, for workers to run.

The local counterparts of ``POST /threads`` and ``POST /threads/{id}/inputs``:
nothing runs here; ``jixu worker`` (or ``jixu serve --agent``) executes the
queued turn.
"""

from __future__ import annotations

import json
from typing import Any

import click

from jixu.cli.output import emit_json, handled, json_option
from jixu.cli.threads import default_actor, out, threads_group
from jixu.errors import InvalidInput
from jixu.ledger import open_store
from jixu.scheduling import DEFAULT_PROJECT, create_thread_for, make_agent, submit_turn


@click.command("create", short_help="Record a new thread of an agent in a project (for workers).")
@click.argument("store")
@click.option("--agent", "agent_spec", required=True, metavar="MODULE:FACTORY",
              help="The agent the thread is recorded under (as for `jixu worker --agent`).")
@click.option("--project", default=DEFAULT_PROJECT, show_default=True, help="The project the thread belongs to.")
@click.option("--metadata", default=None, metavar="JSON", help="A JSON object kept with the thread.")
@click.option("--actor", default=None, help="Who creates it (recorded; default cli:<login name>).")
@json_option
def create_command(store: str, agent_spec: str, project: str, metadata: str | None, actor: str | None,
                   as_json: bool) -> None:
    """Record a new idle thread of --agent in --project in STORE (created if missing)."""
    with handled(as_json):
        extra: Any = None
        if metadata is not None:
            try:
                extra = json.loads(metadata)
            except ValueError as error:
                raise InvalidInput(f"--metadata is not valid JSON: {error}", field="metadata") from error
        agent = make_agent(agent_spec)
        with open_store(store) as opened:
            thread_id = create_thread_for(opened, agent, project=project, metadata=extra,
                                          actor=actor or default_actor())
    if as_json:
        emit_json({"thread_id": thread_id, "project": project, "agent": agent.name})
        return
    out().print(f"thread {thread_id} created in project {project} (agent {agent.name!r})", highlight=False,
                markup=False)


@click.command("send", short_help="Queue a turn with user input for workers.")
@click.argument("store")
@click.argument("thread_id")
@click.argument("text")
@click.option("--actor", default=None, help="Who sends it (recorded; default cli:<login name>).")
@json_option
def send_command(store: str, thread_id: str, text: str, actor: str | None, as_json: bool) -> None:
    """Record a turn with TEXT on THREAD_ID and put the thread in the work queue (exit 4 while it is busy)."""
    with handled(as_json), open_store(store, create=False) as opened:
        turn_id = submit_turn(opened, thread_id, text, actor=actor or default_actor())
    if as_json:
        emit_json({"thread_id": thread_id, "turn_id": turn_id, "queued": True})
        return
    out().print(f"turn {turn_id} queued on thread {thread_id}; a worker runs it", highlight=False, markup=False)


threads_group.add_command(create_command)
threads_group.add_command(send_command)

__all__ = ["create_command", "send_command", "threads_group"]

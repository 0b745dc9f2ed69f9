"""``jixu serve``: the HTTP API (and, given an agent or providers, a worker) over a store."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click

from jixu.cli.output import EXIT_OK, console, handled, literal
from jixu.cli.runs import DEFAULT_WORKSPACE_ROOT, PROVIDERS_ENV, WORKSPACE_ENV, load_providers
from jixu.cli.worker import limit_options, open_store_label, parse_project_limits
from jixu.errors import InvalidInput, require_extra
from jixu.ledger import DEFAULT_STORE_URL, open_store
from jixu.runs.operations import PUBLISHERS_ENV, REMOTES_ENV, load_publishers, load_remotes
from jixu.scheduling.workers import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TOOL_THREADS,
    MAX_CONCURRENCY,
    WorkerConfig,
    default_owner,
    end_serving_process,
    make_agent,
    tune_collector,
)


@click.command("serve", short_help="Serve the HTTP API (/api/v1, OpenAPI at /openapi.json) over a store.")
@click.option("--store", "store_url", envvar="JIXU_STORE", default=DEFAULT_STORE_URL, show_default=True,
              metavar="URL", help="The ledger: a SQLite path or sqlite:/// URL, or postgresql://… (default $JIXU_STORE).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8420, show_default=True, help="Port to listen on.")
@click.option("--agent", "agent_spec", default=None, metavar="MODULE:FACTORY",
              help="The agent new threads are recorded under (a zero-argument callable returning a jixu.Agent).")
@click.option("--providers", "providers_spec", envvar=PROVIDERS_ENV, default=None, metavar="MODULE:FACTORY",
              help=f"The run providers (a zero-argument callable returning dict[str, Provider]); ${PROVIDERS_ENV}.")
@click.option("--workspace-root", envvar=WORKSPACE_ENV, default=DEFAULT_WORKSPACE_ROOT, show_default=True,
              metavar="DIR", help="Where new runs' workspaces are made.")
@click.option("--publishers", "publishers_spec", envvar=PUBLISHERS_ENV, default=None, metavar="MODULE:FACTORY",
              help=f"Publishers for publication requests (dict[str, Publisher]); ${PUBLISHERS_ENV}, else only git.")
@click.option("--remotes", "remotes_spec", envvar=REMOTES_ENV, default=None, metavar="MODULE:FACTORY",
              help=f"Deploy / rollback / knowledge-write providers (dict[str, RemoteProvider]); ${REMOTES_ENV}.")
@click.option("--no-worker", is_flag=True,
              help="Only record: leave queued inputs and runs for `jixu worker` even when --agent/--providers "
                   "are given.")
@click.option("--owner", default=None, metavar="NAME", help="The in-process worker's name (default worker@<host>).")
@click.option("--concurrency", type=click.IntRange(1, MAX_CONCURRENCY), default=DEFAULT_CONCURRENCY,
              show_default=True, help="Threads and runs the worker runs at once, per process with --worker-processes "
                                      "(claims stop meanwhile while its event loop runs late).")
@click.option("--worker-processes", type=click.IntRange(0, 256), default=0, show_default=True, metavar="N",
              help="Run the worker as N processes of their own beside the server, named <owner>-1..N (as `jixu "
                   "worker --processes N`: the turns' CPU spread over cores; each ends with the server however it "
                   "ends), instead of in the server's process (0).")
@click.option("--tool-threads", type=click.IntRange(1, 1024), default=DEFAULT_TOOL_THREADS, show_default=True,
              help="Threads for plain `def` tools in the worker (per process with --worker-processes).")
@click.option("--max-body-bytes", type=click.IntRange(1024, 64 * 1024 * 1024), default=1024 * 1024,
              show_default=True, help="Larger request bodies are refused with 413.")
@limit_options
@click.option("--drain-timeout", type=click.IntRange(0, 3600), default=10, show_default=True,
              help="Seconds a stop gives requests and the worker's turns in flight before cutting them off (a call "
                   "cut off is recorded with an unknown outcome) and exiting.")
def serve_command(store_url: str, host: str, port: int, agent_spec: str | None, providers_spec: str | None,
                  workspace_root: str, publishers_spec: str | None, remotes_spec: str | None, no_worker: bool, owner: str | None, max_body_bytes: int,
                  concurrency: int, worker_processes: int, tool_threads: int, global_limit: int | None,
                  project_limits: tuple[str, ...], default_project_limit: int | None, drain_timeout: int) -> None:
    """Serve the HTTP API over STORE: threads, runs, projects and tokens under /api/v1.

    Callers authenticate with bearer tokens: make the first one with
    `jixu tokens create --store URL --admin --name root`. The OpenAPI document
    is at /openapi.json, interactive docs at /docs.

    With --agent (threads) and/or --providers (runs) a worker runs in this
    process (or, with --worker-processes N, in N processes beside it), so
    inputs and runs sent over HTTP are executed; without them (or with
    --no-worker) they are queued for `jixu worker`.

    SIGTERM or SIGINT: stop accepting requests, drain the worker, exit 0.

    Exit codes: 0 stopped cleanly, 2 usage, 5 store problem, 6 invalid input (also: the address cannot be
    listened on).
    """
    with handled(False):
        for module in ("fastapi", "uvicorn", "jinja2"):
            require_extra(module, "server", "jixu serve")
    from jixu.server import create_app
    from jixu.server.background import BackgroundPool, BackgroundWorker
    from jixu.server.serving import listen, serve
    from jixu.server.studio import studio_router

    with handled(False):
        if no_worker and worker_processes:
            raise InvalidInput("--worker-processes starts workers and --no-worker starts none: give one",
                               field="worker_processes")
        agent = make_agent(agent_spec) if agent_spec else None
        if agent is not None:
            agent.prepare()  # this server runs its turns (in-process worker, sends)
        providers = load_providers(providers_spec) if (providers_spec or "").strip() else None
        root = Path(workspace_root).expanduser().resolve()
        publishers_spec = publishers_spec if (publishers_spec or "").strip() else None
        remotes_spec = remotes_spec if (remotes_spec or "").strip() else None
        publishers = load_publishers(publishers_spec)
        remotes = load_remotes(remotes_spec) if remotes_spec else None
        limits = parse_project_limits(project_limits)
        config = None
        if not no_worker and (agent is not None or providers is not None):
            config = WorkerConfig(store_url=store_url, agent=agent_spec, owner=owner or default_owner(),
                                  providers=providers_spec if providers is not None else None,
                                  workspace_root=str(root), publishers=publishers_spec, remotes=remotes_spec,
                                  concurrency=concurrency, tool_threads=tool_threads,
                                  drain_timeout=float(drain_timeout), global_limit=global_limit,
                                  project_limits=limits, default_project_limit=default_project_limit)
        elif global_limit is not None or limits or default_project_limit is not None:
            raise InvalidInput("the claim limits are this server's worker's, and it starts none (--no-worker, or "
                               "no --agent / --providers): give them to the `jixu worker`s instead",
                               field="global_limit")
        store = open_store(store_url)
        listener = listen(host, port)
    lifespan: list[Any] = []
    if config is not None:
        if worker_processes:
            with handled(False):
                lifespan.append(BackgroundPool(config, worker_processes).lifespan)
        else:
            lifespan.append(BackgroundWorker(store, config, agent=agent, providers=providers).lifespan)
    app = create_app(store, agent=agent, providers=providers, workspace_root=root, max_body_bytes=max_body_bytes,
                     publishers=publishers, remotes=remotes,
                     lifespan=lifespan, routers=[studio_router()])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not lifespan:
        worker = "no worker (inputs are queued for `jixu worker`)"
    else:
        worker = f"{worker_processes} worker processes" if worker_processes else "a worker in this process"
    console.print(f"[bold]jixu serve[/]: {literal(open_store_label(store_url))} on http://{literal(host)}:{port}/api/v1 "
                  f"with {worker}; durability {literal(store.durability or 'unknown')}", highlight=False)
    console.print(f"Studio: http://{host}:{port}/studio (log in with a token)", highlight=False, markup=False)
    # uvicorn stops gracefully on SIGTERM/SIGINT, then re-raises the signal to the handler it replaced: make that
    # handler a no-op, so a clean stop exits 0 (as `jixu worker` does) instead of dying by the signal.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, frame: None)
    tune_collector()  # this process serves from now on (its worker's turns, the API's requests)
    try:
        serve(app, host=host, port=port, sock=listener, drain_timeout=drain_timeout)
    finally:
        listener.close()
        store.close()
    end_serving_process(EXIT_OK)
    sys.exit(EXIT_OK)


__all__ = ["serve_command"]

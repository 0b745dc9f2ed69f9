"""``jixu worker``: worker processes that claim queued threads and runs from a store and execute them."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from jixu.cli.output import EXIT_OK, console, handled, literal
from jixu.cli.runs import DEFAULT_WORKSPACE_ROOT, PROVIDERS_ENV, WORKSPACE_ENV, load_providers
from jixu.errors import InvalidInput
from jixu.kernel import DEFAULT_LEASE_TTL
from jixu.ledger import open_store
from jixu.runs.operations import PUBLISHERS_ENV, REMOTES_ENV, load_publishers, load_remotes
from jixu.scheduling.workers import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TOOL_THREADS,
    MAX_CONCURRENCY,
    UNBOUNDED,
    Report,
    WorkerConfig,
    WorkerPool,
    default_owner,
    end_serving_process,
    make_agent,
    serve,
    stop_early_on_signals,
)

KIND_STYLE = {"start": "bold green", "claim": "cyan", "finish": "green", "requeue": "yellow",
              "operator": "bold yellow", "lost": "bold red", "error": "bold red", "stop": "bold"}
"""Colour of each kind of worker report."""


def parse_project_limits(values: tuple[str, ...]) -> dict[str, int]:
    """``--project-limit P=N`` options as a dict (typed error for a malformed one)."""
    limits: dict[str, int] = {}
    for value in values:
        project, sep, number = value.rpartition("=")
        if not sep or not project or not number.strip().isdigit():
            raise InvalidInput(f"--project-limit {value!r} must be PROJECT=N with N >= 0, e.g. billing=2",
                               field="project_limit")
        if project in limits:
            raise InvalidInput(f"--project-limit names project {project!r} twice", field="project_limit")
        limits[project] = int(number)
    return limits


def limit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The claim limits every process claiming from a store takes (``jixu worker``, ``jixu serve``): each claim
    applies the claiming process's own, so they hold across processes given the same ones."""
    for option in reversed([
        click.option("--global-limit", type=click.IntRange(1, UNBOUNDED), default=None,
                     help="Most items claimed at once across all workers and projects (default: unbounded). Give "
                          "every process claiming from the store the same limits: each claim applies its own."),
        click.option("--project-limit", "project_limits", multiple=True, metavar="PROJECT=N",
                     help="Most items of PROJECT claimed at once (repeatable)."),
        click.option("--default-project-limit", type=click.IntRange(0, UNBOUNDED), default=None,
                     help="Most items claimed at once for projects without --project-limit (default: the global "
                          "limit)."),
    ]):
        command = option(command)
    return command


def rich_report(owner: str) -> Report:
    """A reporter printing coloured ``HH:MM:SS owner message`` lines."""

    def report(kind: str, message: str) -> None:
        style = KIND_STYLE.get(kind, "")
        text = literal(message)
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] [bold]{literal(owner)}[/] "
                      + (f"[{style}]{text}[/]" if style else text), highlight=False)

    return report


@click.command("worker", short_help="Run worker processes that claim queued threads and runs and execute them.")
@click.option("--store", "store_url", required=True, metavar="URL",
              help="The shared store: postgresql://… for workers on many machines, or a SQLite path/URL.")
@click.option("--agent", "agent_spec", default=None, metavar="MODULE:FACTORY",
              help="A zero-argument callable returning a jixu.Agent, importable here (e.g. myapp.agents:support): "
                   "the agent whose queued threads these workers run.")
@click.option("--providers", "providers_spec", envvar=PROVIDERS_ENV, default=None, metavar="MODULE:FACTORY",
              help="A zero-argument callable returning dict[str, Provider], importable here (e.g. "
                   f"myapp.providers:providers): these workers execute queued runs with it. Default: ${PROVIDERS_ENV}.")
@click.option("--workspace-root", envvar=WORKSPACE_ENV, default=DEFAULT_WORKSPACE_ROOT, show_default=True,
              metavar="DIR", help=f"Where new runs' workspaces are made (DIR/<run_id>); default ${WORKSPACE_ENV}.")
@click.option("--publishers", "publishers_spec", envvar=PUBLISHERS_ENV, default=None, metavar="MODULE:FACTORY",
              help="Publishers for queued publication requests (dict[str, Publisher]); default "
                   f"${PUBLISHERS_ENV}, else only git.")
@click.option("--remotes", "remotes_spec", envvar=REMOTES_ENV, default=None, metavar="MODULE:FACTORY",
              help="Deploy / rollback / knowledge-write providers (dict[str, RemoteProvider]) for queued remote "
                   f"tasks; default ${REMOTES_ENV}.")
@click.option("--processes", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Worker processes to run.")
@click.option("--concurrency", type=click.IntRange(1, MAX_CONCURRENCY), default=DEFAULT_CONCURRENCY,
              show_default=True,
              help="Threads and runs each worker process runs at once on its event loop (their commits are "
                   "shared); claims stop meanwhile while the loop runs late (--max-loop-lag).")
@click.option("--max-loop-lag", type=click.FloatRange(0.001, 3600), default=None,
              help="Claim nothing new while the event loop runs this many seconds late (default: a tenth of the "
                   "heartbeat interval, lease-ttl / 30, at least 0.02).")
@click.option("--tool-threads", type=click.IntRange(1, 1024), default=DEFAULT_TOOL_THREADS, show_default=True,
              help="Threads for plain `def` tools per process (a blocking tool holds one, never the loop).")
@click.option("--owner", default=None, metavar="NAME",
              help="Worker name (prefix NAME-1…NAME-N with several processes); stable across restarts, unique "
                   "among running workers. Default: worker@<hostname>.")
@limit_options
@click.option("--takeover", type=click.Choice(["never", "safe"]), default="never", show_default=True,
              help="safe: continue another worker's expired turn when the resolver finds every open effect safe; "
                   "never: leave it for `jixu turns recover`.")
@click.option("--lease-ttl", type=click.FloatRange(0.05, 3600), default=DEFAULT_LEASE_TTL, show_default=True,
              help="Seconds a claim lives without a heartbeat (renewed every third of it, by the store's clock).")
@click.option("--drain-timeout", type=click.FloatRange(0, 3600), default=10.0, show_default=True,
              help="On SIGTERM/SIGINT, seconds to finish the step in flight before cutting it off and exiting.")
@click.option("--poll-interval", type=click.FloatRange(0.001, 60), default=0.5, show_default=True,
              help="Seconds between claims while the queue has nothing ready.")
@click.option("--exit-when-idle", is_flag=True, help="Exit 0 once nothing is pending or claimed (batch runs).")
@click.option("--quiet", is_flag=True, help="Report start, stop and problems only, not every item.")
def worker_command(store_url: str, agent_spec: str | None, providers_spec: str | None, workspace_root: str,
                   publishers_spec: str | None, remotes_spec: str | None, processes: int, owner: str | None, global_limit: int | None,
                   project_limits: tuple[str, ...], default_project_limit: int | None, takeover: str,
                   lease_ttl: float, drain_timeout: float, poll_interval: float, exit_when_idle: bool,
                   quiet: bool, concurrency: int, max_loop_lag: float | None, tool_threads: int) -> None:
    """Claim queued threads and runs from STORE and execute them, fairly across projects, within the limits.

    Threads get into the queue with jixu.scheduling.submit_turn(store, thread_id,
    text) (or enqueue_thread). Each worker claims up to --concurrency threads
    and runs at a time, opens each with a Harness owned by the worker's name,
    runs the turn until it stops, and heartbeats both claims against the
    store's clock.

    The agent: MODULE:FACTORY names a zero-argument function returning the
    jixu.Agent whose threads these workers run, e.g. `--agent
    myapp.agents:support_agent` for `def support_agent() -> Agent`. The
    current directory is importable.

    Runs get into the queue with `jixu runs create … --queue` (or
    jixu.scheduling.submit_run). With --providers (as for `jixu runs`) a worker
    executes them under its own name: an automatic pause (rate limit) puts the
    run back in the queue until its recorded resume time; a run that needs an
    operator is finished with the `jixu runs …` command to use; admitted execution
    requests (publications with --publishers, deploys and other remote tasks with
    --remotes, cancellations) are carried out too. Give --agent,
    --providers or both; a worker leaves work it cannot do in the queue.

    SIGTERM or SIGINT: stop claiming, drain every turn in flight (within
    --drain-timeout), put unfinished items back in the queue, exit 0. A worker
    killed abruptly leaves claims that expire; see `jixu turns list --expired`.

    Exit codes: 0 stopped cleanly, 1 a worker process failed, 2 usage,
    5 store problem, 6 invalid input (limits, agent or providers factory).
    """
    with handled(False):
        if processes == 1:
            stop_early_on_signals()  # a SIGTERM while the agent loads still ends in a clean exit 0
        limits = parse_project_limits(project_limits)
        name = owner if owner is not None else default_owner()
        if agent_spec is None and not (providers_spec or "").strip():
            raise InvalidInput("give --agent MODULE:FACTORY (to run threads), --providers MODULE:FACTORY or "
                               f"${PROVIDERS_ENV} (to execute runs), or both", field="agent")
        providers = providers_spec if (providers_spec or "").strip() else None
        if agent_spec is not None:
            make_agent(agent_spec)  # fail here, once, on a bad factory
        publishers = publishers_spec if (publishers_spec or "").strip() else None
        remotes = remotes_spec if (remotes_spec or "").strip() else None
        if providers is not None:
            load_providers(providers)
            load_publishers(publishers)
            if remotes is not None:
                load_remotes(remotes)
        root = str(Path(workspace_root).expanduser().resolve())
        config = WorkerConfig(store_url=store_url, agent=agent_spec, owner=name, lease_ttl=lease_ttl,
                              global_limit=global_limit, project_limits=limits,
                              default_project_limit=default_project_limit,
                              takeover="safe" if takeover == "safe" else "never", poll_interval=poll_interval,
                              drain_timeout=drain_timeout, exit_when_idle=exit_when_idle, quiet=quiet,
                              providers=providers, workspace_root=root, publishers=publishers, remotes=remotes,
                              concurrency=concurrency, max_loop_lag=max_loop_lag, tool_threads=tool_threads)
        open_store(store_url).close()  # migrate once before the workers start, and fail early
        if processes == 1:
            stats = asyncio.run(serve(config, report=rich_report(name)))
            if not quiet:
                console.print(f"done: {stats.claimed} claimed, {stats.finished} finished, {stats.requeued} requeued, "
                              f"{stats.lost} lost, {stats.errors} errors", highlight=False)
            end_serving_process(EXIT_OK)
            sys.exit(EXIT_OK)
        pool = WorkerPool(agent_spec, store_url, processes=processes, owner_prefix=name, lease_ttl=lease_ttl,
                          global_limit=global_limit, project_limits=limits,
                          default_project_limit=default_project_limit, takeover=config.takeover,
                          poll_interval=poll_interval, drain_timeout=drain_timeout, exit_when_idle=exit_when_idle,
                          quiet=quiet, providers=providers, workspace_root=root, publishers=publishers,
                          remotes=remotes, concurrency=concurrency, max_loop_lag=max_loop_lag,
                          tool_threads=tool_threads)
    console.print(f"[bold]jixu worker[/]: starting {processes} processes ({literal(', '.join(pool.owners))}) on "
                  f"{literal(open_store_label(store_url))}", highlight=False)
    code = pool.run()
    console.print(f"[bold]jixu worker[/]: all {processes} processes stopped"
                  + ("" if code == EXIT_OK else " [bold red](some failed)[/]"), highlight=False)
    sys.exit(code)


def open_store_label(url: str) -> str:
    """The store URL to print (a PostgreSQL password masked)."""
    if url.lower().startswith(("postgresql://", "postgres://")):
        from jixu.ledger.postgres import mask_dsn

        return mask_dsn(url)
    return url


__all__ = ["worker_command"]

"""The ``jixu`` entry point."""

from __future__ import annotations

import click

import jixu.cli.requests  # noqa: F401  (adds the execution-request commands to the `runs` group)
from jixu import __version__
from jixu.cli.demo import demo_command
from jixu.cli.ledger import effects_command, keys_group, ledger_group, verify_command
from jixu.cli.projects import projects_group
from jixu.cli.remote import remote_group
from jixu.cli.runs import runs_group
from jixu.cli.serve import serve_command
from jixu.cli.studio import studio_fixture_command
from jixu.cli.threads import threads_group
from jixu.cli.threads_queue import create_command as thread_create_command
from jixu.cli.threads_queue import send_command as thread_send_command
from jixu.cli.tokens import tokens_group
from jixu.cli.turns import turns_group
from jixu.cli.worker import worker_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jixu")
def cli() -> None:
    """jixu: durable agent work that never guesses whether a side effect happened.

    Exit codes: 0 ok, 1 check failed (invalid chain, corrupt or unresolved effects; a run that stopped
    without succeeding or needs an operator), 2 usage, 3 not found, 4 conflict, 5 store problem,
    6 invalid input, 7 not authorized (remote commands).
    """


cli.add_command(verify_command)
cli.add_command(effects_command)
cli.add_command(ledger_group)
cli.add_command(keys_group)
cli.add_command(threads_group)
cli.add_command(turns_group)
cli.add_command(worker_command)
cli.add_command(projects_group)
cli.add_command(runs_group)
cli.add_command(demo_command)
cli.add_command(serve_command)
cli.add_command(studio_fixture_command)
cli.add_command(tokens_group)
cli.add_command(remote_group)
threads_group.add_command(thread_create_command)
threads_group.add_command(thread_send_command)


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()

"""The ``jixu`` entry point.

The command groups are imported when they are run (or listed by ``--help``), not at start: a command pays
only for the modules it uses, so ``jixu threads show`` does not import the server, the runs engine or the
demo.
"""

from __future__ import annotations

from importlib import import_module

import click

from jixu import __version__

COMMANDS: dict[str, str] = {
    "verify": "jixu.cli.ledger:verify_command",
    "effects": "jixu.cli.ledger:effects_command",
    "ledger": "jixu.cli.ledger:ledger_group",
    "keys": "jixu.cli.ledger:keys_group",
    "threads": "jixu.cli.threads_queue:threads_group",
    "turns": "jixu.cli.turns:turns_group",
    "worker": "jixu.cli.worker:worker_command",
    "projects": "jixu.cli.projects:projects_group",
    "runs": "jixu.cli.requests:runs_group",
    "demo": "jixu.cli.demo:demo_command",
    "serve": "jixu.cli.serve:serve_command",
    "studio-fixture": "jixu.cli.studio:studio_fixture_command",
    "tokens": "jixu.cli.tokens:tokens_group",
    "remote": "jixu.cli.remote:remote_group",
}
"""Each top-level command and where it is defined (``module:attribute``)."""


class LazyGroup(click.Group):
    """A group whose commands are imported from :data:`COMMANDS` on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name].split(":")
            command = getattr(import_module(module), attribute)
            if not isinstance(command, click.Command) or command.name != cmd_name:
                raise RuntimeError(f"{COMMANDS[cmd_name]} is not the {cmd_name!r} command")
            self.add_command(command)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jixu")
def cli() -> None:
    """jixu: durable agent work that never guesses whether a side effect happened.

    Exit codes: 0 ok, 1 check failed (invalid chain, corrupt or unresolved effects; a run that stopped
    without succeeding or needs an operator), 2 usage, 3 not found, 4 conflict, 5 store problem,
    6 invalid input, 7 not authorized (remote commands).
    """


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()

"""``python -m jixu`` runs the CLI."""

from jixu.cli.main import main

main()

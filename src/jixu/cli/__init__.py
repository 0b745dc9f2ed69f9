"""The ``jixu`` command line: one module per command group."""

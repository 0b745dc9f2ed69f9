"""Package exports imported on first use (PEP 562), so importing one module does not import the whole library.

``import jixu`` (or any ``jixu.x.y``, which runs the ``__init__`` of each package on its path) costs only what
the names used need: a CLI command, a worker or a test's child process starts without importing the runs
engine, the server or the provider drivers it never touches. Each package's ``__init__`` lists its names and
where they live, and imports them for type checkers only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names live in the modules ``where`` says.

    A name is imported when first asked for, then kept in the package's namespace (asked again, it costs a
    dict lookup, as an eager import would). An unknown name raises ``AttributeError``, so ``from package
    import submodule`` still finds a submodule.
    """

    def load(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def names() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return load, names


__all__ = ["lazy_exports"]

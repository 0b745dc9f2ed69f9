"""Package exports imported on first use (PEP 562), so importing one module does not import the whole library.

``import jixu`` (or any ``jixu.x.y``, which runs the ``__init__`` of each package on its path) costs only what
the names used need: a CLI command, a worker or a test's child process starts without importing the runs
engine, the server or the provider drivers it never touches. Each package's ``__init__`` lists its names and
where they live, and imports them for type checkers only.
"""

from __future__ import annotations

import os
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


def load_object(spec: str, option: str, example: str) -> Any:
    """The object ``MODULE:ATTRIBUTE`` names (``ATTRIBUTE`` may be dotted), for a ``--option`` naming user code.

    The current directory is importable, as with ``python -m``. Every failure is an
    :class:`~jixu.errors.InvalidInput` on ``option``: a malformed name, a module that cannot be imported or raises
    while it is imported, a missing attribute (``example`` shows the expected form)."""
    from jixu.errors import InvalidInput

    if not isinstance(spec, str) or spec.count(":") != 1 or not all(part.strip() for part in spec.split(":")):
        raise InvalidInput(f"--{option} {spec!r} must be MODULE:FACTORY, e.g. {example}", field=option)
    module_name, attribute = (part.strip() for part in spec.split(":"))
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        target: Any = import_module(module_name)
    except Exception as error:  # a syntax error or an exception raised at import is the user's code failing
        raise InvalidInput(f"--{option} {spec!r}: cannot import {module_name!r} ({type(error).__name__}: {error})",
                           field=option) from error
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise InvalidInput(f"--{option} {spec!r}: {module_name!r} has no attribute {attribute!r}", field=option)
        target = getattr(target, part)
    return target


__all__ = ["lazy_exports", "load_object"]

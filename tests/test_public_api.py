"""The deliberate public surface: what users import from ``jixu``."""

from __future__ import annotations

import jixu


def test_the_names_the_readme_promises_are_importable_from_the_top_level() -> None:
    from jixu import Event, RecoveryResolver, SQLiteStore, verify

    assert callable(verify) and Event and RecoveryResolver and SQLiteStore


def test_every_name_in_all_exists_and_errors_share_one_base() -> None:
    for name in jixu.__all__:
        assert hasattr(jixu, name), name
    # ToolError is raised by users' tools to report a determinate failure; it is not jixu's own error.
    error_names = [n for n in jixu.__all__ if isinstance(getattr(jixu, n), type)
                   and issubclass(getattr(jixu, n), Exception) and n != "ToolError"]
    assert error_names and all(issubclass(getattr(jixu, n), jixu.JixuError) for n in error_names)
    codes = [getattr(jixu, n).code for n in error_names]
    assert len(codes) == len(set(codes)), "every error kind has its own stable code"


def test_lazy_exports_resolve_and_never_shadow_a_submodule() -> None:
    """Each package that imports its names on first use (jixu.exports) lists only names that exist where it says,
    and no name equals one of its submodules (importing the submodule would replace the name, or the reverse)."""
    import importlib
    import pkgutil

    for package in ("jixu", "jixu.threads", "jixu.runs"):
        module = importlib.import_module(package)
        exports: dict[str, str] = module._EXPORTS
        assert sorted(exports) == sorted(name for name in module.__all__ if name != "__version__"), package
        submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
        assert not set(exports) & submodules, (package, sorted(set(exports) & submodules))
        for name, where in exports.items():
            assert getattr(importlib.import_module(where), name) is getattr(module, name), (package, name)
        assert set(exports) <= set(dir(module))

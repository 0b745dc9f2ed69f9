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

"""Opening a store from a URL or path.

``sqlite:///rel.db``, ``sqlite:////abs.db``, a bare path, ``memory://``, or a
PostgreSQL URL (``postgresql://user:password@host:5432/db?sslmode=require``,
also spelled ``postgres://``), which is handed to libpq unchanged but for
jixu's own options (``allow_unsafe_durability``), taken out of its query.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from jixu.errors import InvalidInput, StoreNotFound, UnsupportedStoreUrl
from jixu.ledger.store import Store

DEFAULT_STORE_URL = "sqlite:///jixu.db"
"""The embedded default: ``jixu.db`` in the current directory."""

_SQLITE_OPTIONS = {"synchronous", "busy_timeout", "read_only", "create"}
_POSTGRES_OPTIONS = {"allow_unsafe_durability"}
"""Query parameters of a PostgreSQL URL that are jixu's, not libpq's (which refuses names it does not know)."""


def _flag(name: str, value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise InvalidInput(f"store URL option {name}={value!r} must be true or false", field=name)


def sqlite_path_and_options(url: str) -> tuple[str, dict[str, Any]]:
    """Split a ``sqlite:///`` URL or a bare path into a file path and store options."""
    if not url.startswith("sqlite:"):
        return url, {}
    parts = urlsplit(url)
    if parts.netloc:
        raise InvalidInput(f"store URL {url!r}: use sqlite:///relative.db or sqlite:////absolute.db",
                           field="store")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise InvalidInput(f"store URL {url!r} names no file", field="store")
    options: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _SQLITE_OPTIONS:
            raise InvalidInput(f"store URL option {name!r} is unknown; known: {sorted(_SQLITE_OPTIONS)}",
                               field=name)
        if name == "synchronous":
            options[name] = value.upper()
        elif name == "busy_timeout":
            try:
                options[name] = float(value)
            except ValueError as exc:
                raise InvalidInput(f"busy_timeout={value!r} must be seconds", field=name) from exc
        else:
            options[name] = _flag(name, value)
    return path, options


def postgres_dsn_and_options(dsn: str) -> tuple[str, dict[str, Any]]:
    """Take jixu's own options out of a ``postgresql://`` URL's query: the DSN for libpq and the options.

    Every other part of the URL is kept byte for byte. A ``key=value`` DSN is
    returned as it is (give such options as keywords instead).
    """
    if not dsn.lower().startswith(("postgresql://", "postgres://")):
        return dsn, {}
    base, mark, rest = dsn.partition("?")
    query, hash_mark, fragment = rest.partition("#")
    kept: list[str] = []
    options: dict[str, Any] = {}
    for piece in query.split("&") if mark else []:
        name, _, value = piece.partition("=")
        if unquote_plus(name) in _POSTGRES_OPTIONS:
            options[unquote_plus(name)] = _flag(unquote_plus(name), unquote_plus(value))
        else:
            kept.append(piece)
    if not options:
        return dsn, {}
    return f"{base}{'?' if kept else ''}{'&'.join(kept)}{hash_mark}{fragment}", options


def is_memory_url(url: str) -> bool:
    """True for the URLs of a store that lives in one process's memory (another process opening it gets a new,
    empty one)."""
    return url in _MEMORY_URLS


_MEMORY_URLS = frozenset(("memory://", ":memory:"))


def open_store(target: str | os.PathLike[str] | Store | None = None, **options: Any) -> Store:
    """Return a store for ``target``: a Store (returned as is), a URL or a file path.

    ``None`` means :data:`DEFAULT_STORE_URL`. Keyword ``options`` go to the
    store's constructor (e.g. ``synchronous="NORMAL"``, ``create=False``,
    ``max_size=20`` for PostgreSQL).
    """
    if isinstance(target, Store):
        return target
    if target is None:
        target = DEFAULT_STORE_URL
    if not isinstance(target, str | os.PathLike):
        raise InvalidInput(f"store must be a Store, a URL or a path, not {type(target).__name__}",
                           field="store")
    text = os.fspath(target)
    if is_memory_url(text):
        from jixu.ledger.memory import MemoryStore

        if options.pop("create", True) is False:  # opening an existing store: a memory one exists in its process only
            raise StoreNotFound(f"{text} is a store in one process's memory: there is none to open here (give a "
                                "SQLite path or a PostgreSQL URL)", url=text)
        return MemoryStore(**options)
    scheme = urlsplit(text).scheme if "://" in text else ""
    if scheme == "memory":
        raise InvalidInput(f"store URL {text!r}: memory:// takes no path or options", field="store")
    if scheme in ("", "sqlite", "file") or text.startswith("sqlite:"):
        from jixu.ledger.sqlite import SQLiteStore

        if scheme == "file":
            text = urlsplit(text).path
        path, url_options = sqlite_path_and_options(text)
        return SQLiteStore(path, **{**url_options, **options})
    if scheme in ("postgresql", "postgres"):
        from jixu.ledger.postgres import PostgresStore

        return PostgresStore(text, **options)
    raise UnsupportedStoreUrl(
        f"store URL scheme {scheme!r} is not supported; use sqlite:///PATH, a file path, "
        "postgresql://USER@HOST/DB or memory://",
        url=text,
    )


__all__ = ["DEFAULT_STORE_URL", "open_store", "postgres_dsn_and_options", "sqlite_path_and_options"]

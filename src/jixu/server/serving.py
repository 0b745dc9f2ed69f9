"""Serving the app with uvicorn so that a stop is graceful: ``serve(app, host=..., port=...)``.

On SIGTERM or SIGINT uvicorn stops accepting connections and waits for the
open ones before it runs the app's lifespan shutdown (the in-process worker's
drain). An event stream stays open for up to an hour, so the signal first
tells the app (:func:`jixu.server.app.begin_shutdown`): open streams end at
their next poll, the connections finish, the worker drains, the process exits.
Whatever still runs after ``drain_timeout`` seconds is cancelled.
"""

from __future__ import annotations

import socket
from types import FrameType
from typing import Any

import uvicorn

from jixu.errors import InvalidInput
from jixu.server.app import begin_shutdown

KEEP_ALIVE_SECONDS = 75
"""How long an idle keep-alive connection is kept open (nginx's default; uvicorn's own is 5 s).

A server must keep idle connections longer than its clients do: httpx, the client of ``jixu remote`` and of
most Python callers, reuses one for up to 5 s, so with uvicorn's 5 s the server closed connections at the
moment clients sent their next request on them, and that POST failed with a read error, unanswered and not
safely retried."""


class GracefulServer(uvicorn.Server):
    """A uvicorn server that ends the app's event streams as soon as it is asked to stop."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's signal handler: tell the app first, then stop as uvicorn does."""
        begin_shutdown(self.config.app)
        super().handle_exit(sig, frame)


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, or :class:`~jixu.errors.InvalidInput` saying why not (the address is
    in use, not this machine's, or not an address): bound before the server says it serves, so a failure is one
    line and a usage exit, not a started server that then stops."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, protocol, _, address = found[0]
        sock = socket.socket(family, kind, protocol)
    except (OSError, OverflowError, UnicodeError) as error:
        raise InvalidInput(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}",
                           field="host") from error
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise InvalidInput(f"cannot listen on {host}:{port}: {error.strerror or error}", field="port") from error
    return sock


def serve(app: Any, *, host: str, port: int, drain_timeout: int = 10, log_level: str = "info",
          sock: socket.socket | None = None) -> None:
    """Serve ``app`` until SIGTERM/SIGINT; then stop within about ``drain_timeout`` seconds (plus the lifespan's
    own drain). ``sock``: the socket :func:`listen` bound (else uvicorn binds ``host:port`` itself)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout,
                            timeout_keep_alive=KEEP_ALIVE_SECONDS)
    GracefulServer(config).run(sockets=[sock] if sock is not None else None)


__all__ = ["KEEP_ALIVE_SECONDS", "GracefulServer", "listen", "serve"]

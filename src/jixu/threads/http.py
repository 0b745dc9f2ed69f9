"""The HTTP client jixu's model drivers send their calls with: ``httpx``, its idle connections kept on a stack.

httpx's transport hands every request to httpcore's connection pool, which
looks at every connection it holds each time a request arrives or a response
is closed, and asks the socket of each idle one whether it is still readable.
A worker running hundreds of turns holds hundreds of connections: that scan
was a large part of each call's CPU, and with the SDKs' limit of 100 idle
connections most answers closed their connection (measured at 500 calls in
flight against ``bench/fake_openai.py``: one new connection per call; against
a real provider, a TLS handshake per call).

:class:`StackTransport` is httpx's own transport over a :class:`ConnectionStack`
instead: each origin's idle connections on a stack, the request takes the one
used last (as urllib3's pools do), so a request costs the same whatever the
number of connections, a quiet thread keeps reusing one warm connection, and a
busy worker keeps as many as it has calls in flight. The connections themselves
are httpcore's (``httpcore.AsyncHTTPConnection``: connecting, TLS, HTTP/1.1,
keep-alive expiry) over :class:`AsyncioBackend`, httpcore's network interface on
asyncio's own transports (its default goes through anyio, whose cancel scope
around every read and write cost a third of a call's CPU); httpx maps their
errors, so timeouts and failures read exactly as with httpx's default transport
(``tests/threads/test_http.py`` compares them). When the environment names a proxy
(``HTTPS_PROXY`` and friends), which httpx applies only to a client of its own
transport, the client is httpx's plain one.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import Any, Literal

import httpcore
import httpx

from jixu.errors import InvalidInput

MAX_CONNECTIONS = 1000
"""Open connections of one client at most (the official SDKs' limit)."""
MAX_IDLE = 1000
"""Idle connections one client keeps at most: one per call in flight (an idle connection costs no request
anything here; each closes after :data:`KEEPALIVE_EXPIRY` unused)."""
KEEPALIVE_EXPIRY = 5.0
"""Seconds an idle connection is kept (httpx's default)."""

_Key = tuple[asyncio.AbstractEventLoop, bytes, bytes, int]
"""An idle stack's key: the event loop its connections were made on (asyncio transports belong to one loop),
and the origin."""


class ConnectionStack:
    """httpcore's connection pool's job with each origin's idle connections on a stack (last used, first taken).

    Speaks httpcore's request interface (``handle_async_request``, ``aclose``) for :class:`StackTransport`.
    At ``max_connections`` a request waits (at most the request's pool timeout: then ``httpcore.PoolTimeout``)
    for a connection to be given back, after closing an idle connection of another origin if there is one.

    A connection serves only the event loop it was made on: a client used by one ``asyncio.run`` after
    another (a script sending a turn per run) gets new connections in each loop, and those of loops that
    have closed are dropped (their sockets close with their transports) the next time one is made.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, max_connections: int = MAX_CONNECTIONS,
                 max_idle: int = MAX_IDLE, keepalive_expiry: float = KEEPALIVE_EXPIRY) -> None:
        for field, value, least in (("max_connections", max_connections, 1), ("max_idle", max_idle, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidInput(f"{field} must be an integer >= {least}, got {value!r}", field=field)
        if isinstance(keepalive_expiry, bool) or not isinstance(keepalive_expiry, int | float) \
                or not keepalive_expiry > 0:
            raise InvalidInput(f"keepalive_expiry must be a number of seconds > 0, got {keepalive_expiry!r}",
                               field="keepalive_expiry")
        self._ssl_context = ssl_context
        self._max_connections = max_connections
        self._max_idle = max_idle
        self._keepalive_expiry = keepalive_expiry
        self._idle: dict[_Key, list[httpcore.AsyncHTTPConnection]] = {}
        self._idle_count = 0
        self._connections: dict[httpcore.AsyncHTTPConnection, asyncio.AbstractEventLoop] = {}
        self._loops: set[asyncio.AbstractEventLoop] = set()
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def connections(self) -> int:
        """Connections open or being opened now (idle or carrying a request)."""
        return len(self._connections)

    @property
    def idle(self) -> int:
        """Idle connections kept now."""
        return self._idle_count

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        """Send ``request`` over an idle connection of its origin (the last used), else a new one."""
        scheme = request.url.scheme
        if scheme not in (b"http", b"https"):
            raise httpcore.UnsupportedProtocol(f"Request URL has an unsupported protocol '{scheme.decode()}://'.")
        origin = request.url.origin
        key = (asyncio.get_running_loop(), origin.scheme, origin.host, origin.port)
        timeout = request.extensions.get("timeout", {}).get("pool")
        while True:
            connection = await self._connection(origin, key, timeout)
            try:
                response = await connection.handle_async_request(request)
            except httpcore.ConnectionNotAvailable:
                await self._give_back(connection, key)  # it closed meanwhile: the next one
                continue
            except BaseException:
                await self._give_back(connection, key)
                raise
            assert isinstance(response.stream, AsyncIterable)
            return httpcore.Response(status=response.status, headers=response.headers,
                                     content=_GivenBackOnClose(response.stream, self, connection, key),
                                     extensions=response.extensions)

    async def _connection(self, origin: httpcore.Origin, key: _Key,
                          timeout: float | None) -> httpcore.AsyncHTTPConnection:
        while True:
            stack = self._idle.get(key)
            while stack:
                connection = stack.pop()
                self._idle_count -= 1
                if connection.is_available() and not connection.has_expired():
                    return connection
                await self._close(connection)  # the server closed it, or it expired
            loop = key[0]
            if loop not in self._loops or len(self._loops) > 1:
                self._forget_closed_loops(loop)
            if len(self._connections) < self._max_connections:
                connection = httpcore.AsyncHTTPConnection(origin=origin, ssl_context=self._ssl_context,
                                                          keepalive_expiry=self._keepalive_expiry,
                                                          network_backend=_BACKEND)
                self._connections[connection] = loop
                return connection
            victim = self._oldest_idle(loop)
            if victim is not None:
                await self._close(victim)  # at the limit: make room for this origin
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)  # woken by a connection given back or closed (see _wake)
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                raise httpcore.PoolTimeout("no connection became free within the pool timeout") from None
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, but leaving: the turn goes to the next in line
                raise

    def _forget_closed_loops(self, current: asyncio.AbstractEventLoop) -> None:
        """Drop the connections of event loops that have closed (nothing can use or close them any more)."""
        self._loops.add(current)
        closed = {loop for loop in self._loops if loop.is_closed()}
        if not closed:
            return
        self._loops -= closed
        for key in [key for key in self._idle if key[0] in closed]:
            self._idle_count -= len(self._idle.pop(key))
        for connection in [c for c, loop in self._connections.items() if loop in closed]:
            del self._connections[connection]

    def _oldest_idle(self, loop: asyncio.AbstractEventLoop) -> httpcore.AsyncHTTPConnection | None:
        """The longest-idle connection of the longest stack of ``loop`` (None: it has no idle connection)."""
        stacks = [stack for key, stack in self._idle.items() if stack and key[0] is loop]
        if not stacks:
            return None
        self._idle_count -= 1
        return max(stacks, key=len).pop(0)

    async def _give_back(self, connection: httpcore.AsyncHTTPConnection, key: _Key) -> None:
        """Keep ``connection`` for the next request if it is idle and there is room, else close it."""
        if not (connection.is_idle() and not connection.is_closed() and self._idle_count < self._max_idle
                and self._connections.get(connection) is key[0]):
            await self._close(connection)
            return
        stack = self._idle.setdefault(key, [])
        stack.append(connection)
        self._idle_count += 1
        self._wake()
        # The bottom of a stack waited longest: close it once it expired (one look per give-back keeps the
        # stacks free of dead sockets without scanning them).
        if len(stack) > 1 and stack[0].has_expired():
            self._idle_count -= 1
            await self._close(stack.pop(0))

    async def _close(self, connection: httpcore.AsyncHTTPConnection) -> None:
        owner = self._connections.pop(connection, None)  # counted out first: a cancelled close still frees it
        self._wake()
        if owner is None or owner is asyncio.get_running_loop():  # another loop's transport is not ours to close
            await connection.aclose()

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def __aenter__(self) -> ConnectionStack:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection of this event loop, idle or carrying a request (and forget the others')."""
        loop = asyncio.get_running_loop()
        connections = [connection for connection, owner in self._connections.items() if owner is loop]
        self._connections.clear()
        self._idle.clear()
        self._idle_count = 0
        self._loops.clear()
        for connection in connections:
            await connection.aclose()


class _Receiving(asyncio.Protocol):
    """A connection's asyncio protocol: received bytes buffered for :class:`_AsyncioStream`, flow control both ways."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False
        self.lost: BaseException | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.readable: asyncio.Future[None] | None = None
        self.writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _READ_HIGH and self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        _set(self.readable)

    def eof_received(self) -> None:
        self.ended = True
        _set(self.readable)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.lost = exc
        _set(self.readable)
        _set(self.writable)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        _set(self.writable)


def _set(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


_READ_HIGH = 1 << 20
"""Buffered bytes at which a connection stops reading from its socket until they are read."""


class _AsyncioStream(httpcore.AsyncNetworkStream):
    """httpcore's network stream over an asyncio transport: what its anyio stream does, with the same errors
    (``ReadError``/``ReadTimeout``, ``WriteError``/``WriteTimeout``, ``ConnectError``/``ConnectTimeout`` for
    TLS), without anyio's cancel scope around every read and write."""

    def __init__(self, transport: asyncio.Transport, protocol: _Receiving) -> None:
        self._transport, self._protocol = transport, protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Up to ``max_bytes`` received bytes, waiting for them at most ``timeout``; ``b""`` at the end."""
        protocol = self._protocol
        if not protocol.buffer and not protocol.ended:
            await self._until("readable", timeout, httpcore.ReadTimeout("timed out reading the response"))
        buffer = protocol.buffer
        if buffer:
            data = bytes(buffer[:max_bytes])
            del buffer[:max_bytes]
            if protocol.reading_paused and len(buffer) <= _READ_HIGH // 2:
                protocol.reading_paused = False
                self._transport.resume_reading()
            return data
        if protocol.lost is not None:
            raise httpcore.ReadError(str(protocol.lost) or type(protocol.lost).__name__) from protocol.lost
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Send ``buffer``; wait at most ``timeout`` while the socket's buffer is full."""
        if not buffer:
            return
        protocol = self._protocol
        if protocol.lost is not None or self._transport.is_closing():
            raise httpcore.WriteError(str(protocol.lost or "the connection is closed"))
        self._transport.write(buffer)
        if protocol.writing_paused:
            await self._until("writable", timeout, httpcore.WriteTimeout("timed out writing the request"))
            if protocol.lost is not None:
                raise httpcore.WriteError(str(protocol.lost))

    async def _until(self, event: Literal["readable", "writable"], timeout: float | None,
                     expired: Exception) -> None:
        """Wait until the protocol sets ``event`` (bytes or the end arrived; the socket takes bytes again), at
        most ``timeout``: then raise ``expired``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        setattr(self._protocol, event, waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            raise expired from None
        finally:
            setattr(self._protocol, event, None)

    async def aclose(self) -> None:
        """Close the connection (its transport sends what it still holds, then closes)."""
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        """The same connection with TLS on top (the handshake at most ``timeout``)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(self._transport, self._protocol, ssl_context,
                                                 server_hostname=server_hostname)
        except TimeoutError:
            self._transport.close()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, EOFError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            self._transport.close()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        if transport is None:  # the connection closed during the handshake
            raise httpcore.ConnectError("the connection closed during the TLS handshake")
        return _AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        """What httpcore asks of a stream: ``ssl_object``, ``client_addr``, ``server_addr``, ``socket``, and
        ``is_readable`` (received bytes or the end wait unread: on an idle connection, the server left)."""
        if info == "is_readable":
            return bool(self._protocol.buffer) or self._protocol.ended
        name = _EXTRA.get(info)
        return self._transport.get_extra_info(name) if name is not None else None


_EXTRA = {"ssl_object": "ssl_object", "client_addr": "sockname", "server_addr": "peername", "socket": "socket"}


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on asyncio's own transports (TCP_NODELAY, happy eyeballs as anyio's).

    httpcore's default backend goes through anyio, whose cancel scope around each read and write was a third
    of a streamed call's CPU (0.90 -> 0.62 ms per call at 500 in flight against ``bench/fake_openai.py``).
    """

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        """A TCP connection to ``host:port`` (at most ``timeout`` to connect), ``socket_options`` set on it."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Receiving, host, port, local_addr=(local_address, 0) if local_address else None,
                    happy_eyeballs_delay=0.25)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        if socket_options:
            sock = transport.get_extra_info("socket")
            for option in socket_options:
                sock.setsockopt(*option)
        return _AsyncioStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep`` (httpcore's pause between connection retries)."""
        await asyncio.sleep(seconds)


_BACKEND = AsyncioBackend()


class _GivenBackOnClose:
    """A response body that gives its connection back to the stack when it is closed."""

    def __init__(self, stream: AsyncIterable[bytes], stack: ConnectionStack,
                 connection: httpcore.AsyncHTTPConnection, key: _Key) -> None:
        self._stream, self._stack, self._connection, self._key = stream, stack, connection, key
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        close = getattr(self._stream, "aclose", None)
        try:
            if close is not None:
                await close()
        finally:
            await self._stack._give_back(self._connection, self._key)


class StackTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with its requests sent over a :class:`ConnectionStack` (no proxy)."""

    def __init__(self, *, max_connections: int = MAX_CONNECTIONS, max_idle: int = MAX_IDLE,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY, verify: ssl.SSLContext | str | bool = True) -> None:
        # httpx's transport sends through ``_pool`` (handle_async_request, aclose, the context manager) and maps
        # httpcore's errors around it; its __init__ is not called: it would make a pool and an SSL context
        # (~35 ms: the certificate bundle read and parsed) only for them to be replaced.
        self._pool = ConnectionStack(ssl_context=httpx.create_ssl_context(verify=verify),  # type: ignore[assignment]
                                     max_connections=max_connections, max_idle=max_idle,
                                     keepalive_expiry=keepalive_expiry)

    @property
    def stack(self) -> ConnectionStack:
        """The connections this transport sends over."""
        pool = self._pool
        assert isinstance(pool, ConnectionStack)
        return pool


def model_client(timeout: float, headers: Mapping[str, str]) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for a model provider: ``timeout`` for connecting and each read,
    ``headers`` on every request, over a :class:`StackTransport` (httpx's plain client with the
    environment's proxies applied, when it names any)."""
    if urllib.request.getproxies():
        return httpx.AsyncClient(timeout=httpx.Timeout(timeout), headers=dict(headers),
                                 limits=httpx.Limits(max_connections=MAX_CONNECTIONS,
                                                     max_keepalive_connections=MAX_IDLE))
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), headers=dict(headers), transport=StackTransport())


class EventStream:
    """The WHATWG EventSource format read as its bytes arrive: :meth:`feed` gives each event a chunk completes
    as ``(type, data)`` (its ``event`` field, ``message`` when it has none; its ``data:`` lines joined by
    newlines; comments, ``id`` and ``retry`` skipped), :meth:`end` the one the body ended in without a blank
    line after.

    Lines end in CR, LF or CRLF only (a CRLF cut between two chunks is one end), cut as bytes: U+2028 or
    U+0085 inside a JSON text end nothing (``str.splitlines``, and so httpx's ``iter_lines``, end a line
    there). UTF-8, bad bytes replaced; a byte order mark at the start dropped. An event without data is not
    given (as the format dispatches none).
    """

    def __init__(self) -> None:
        self._pending = b""
        self._after_cr = False  # the last chunk ended in CR: a LF starting the next one belongs to it
        self._head = True
        self._data: list[str] = []
        self._type = ""

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events ``chunk`` completes, in order."""
        buffer = self._pending + chunk
        if self._after_cr:
            self._after_cr = False
            buffer = buffer.removeprefix(b"\n")
        if self._head:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._pending = buffer  # perhaps a byte order mark, not whole yet
                return []
            self._head = False
            buffer = buffer.removeprefix(_BOM)
        if not buffer:
            self._pending = b""
            return []
        lines = buffer.splitlines()  # bytes: CR, LF and CRLF only
        self._after_cr = buffer.endswith(b"\r")
        self._pending = b"" if self._after_cr or buffer.endswith(b"\n") else lines.pop()
        events: list[tuple[str, str]] = []
        data = self._data
        for line in lines:
            if line:
                field, _, value = line.decode("utf-8", "replace").partition(":")
                if field == "data":
                    data.append(value[1:] if value.startswith(" ") else value)
                elif field == "event":
                    self._type = value[1:] if value.startswith(" ") else value
            else:
                if data:
                    events.append((self._type or "message", "\n".join(data)))
                    data.clear()
                self._type = ""
        return events

    def end(self) -> list[tuple[str, str]]:
        """The event the body ended in (its last line or blank line missing), if any."""
        events = self.feed(b"\n") if self._pending else []  # ends the last line (never after a CR: see feed)
        if self._data:
            events.append((self._type or "message", "\n".join(self._data)))
            self._data.clear()
        self._type = ""
        return events


_BOM = b"\xef\xbb\xbf"


async def server_sent_data(chunks: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    """The data of each event of a server-sent event stream read from its body's byte ``chunks``
    (:class:`EventStream`); closes ``chunks`` when done."""
    stream = EventStream()
    try:
        async for chunk in chunks:
            for _type, data in stream.feed(chunk):
                yield data
        for _type, data in stream.end():
            yield data
    finally:
        close = getattr(chunks, "aclose", None)  # the source's own generators too, not left to the GC's hook
        if close is not None:
            await close()


__all__ = ["KEEPALIVE_EXPIRY", "MAX_CONNECTIONS", "MAX_IDLE", "AsyncioBackend", "ConnectionStack", "EventStream",
           "StackTransport", "model_client", "server_sent_data"]

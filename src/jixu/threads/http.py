"""The HTTP client jixu's model drivers send their calls with: httpx's interface, jixu's own HTTP/1.1 beneath.

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
busy worker keeps as many as it has calls in flight. Each connection is an
:class:`Http11Connection`: HTTP/1.1 written and read directly over an asyncio
transport (connecting, TLS, keep-alive expiry, the framing rules h11 applies),
without h11's event machinery and httpcore's stream layers, which were ~40 % of
a streamed call's CPU (decision 0047). It raises httpcore's exceptions and httpx
maps them, so answers, timeouts and failures read exactly as with httpx's
default transport (``tests/threads/test_http.py`` compares them, malformed
answers included). When the environment names a proxy (``HTTPS_PROXY`` and
friends), which httpx applies only to a client of its own transport, the client
is httpx's plain one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import socket
import ssl
import time
import urllib.request
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Mapping
from typing import Literal

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
        self._idle: dict[_Key, list[Http11Connection]] = {}
        self._idle_count = 0
        self._connections: dict[Http11Connection, asyncio.AbstractEventLoop] = {}
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
                          timeout: float | None) -> Http11Connection:
        while True:
            stack = self._idle.get(key)
            while stack:
                connection = stack.pop()
                self._idle_count -= 1
                if connection.is_idle() and not connection.has_expired():
                    return connection
                await self._close(connection)  # the server closed it, or it expired
            loop = key[0]
            if loop not in self._loops or len(self._loops) > 1:
                self._forget_closed_loops(loop)
            if len(self._connections) < self._max_connections:
                connection = Http11Connection(origin, ssl_context=self._ssl_context,
                                              keepalive_expiry=self._keepalive_expiry)
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

    def _oldest_idle(self, loop: asyncio.AbstractEventLoop) -> Http11Connection | None:
        """The longest-idle connection of the longest stack of ``loop`` (None: it has no idle connection)."""
        stacks = [stack for key, stack in self._idle.items() if stack and key[0] is loop]
        if not stacks:
            return None
        self._idle_count -= 1
        return max(stacks, key=len).pop(0)

    async def _give_back(self, connection: Http11Connection, key: _Key) -> None:
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

    async def _close(self, connection: Http11Connection) -> None:
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
    """A connection's asyncio protocol: received bytes buffered for :class:`Http11Connection`, flow control both
    ways."""

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


class Http11Connection:
    """One HTTP/1.1 connection to an origin, over an asyncio transport: what httpcore's ``AsyncHTTPConnection``
    does for :class:`ConnectionStack` (connect, TLS, one request at a time, keep-alive expiry), with its errors.

    The request is written and the response read here, without h11's event machinery and httpcore's stream
    layers between (they were ~40 % of a streamed model call's CPU at 500 calls in flight). The rules are
    RFC 9112's as h11 applies them: a response's body is framed by ``Transfer-Encoding: chunked``, else
    ``Content-Length``, else the connection's end (none for ``HEAD``, 204 and 304); interim 1xx answers are
    skipped, a 101 or a status below 100 refused; a head's lines may end in LF alone (a chunked body's may
    not). A connection is reused only after an HTTP/1.1 response read whole
    that did not say ``Connection: close`` (nor did the request). Failures raise httpcore's exceptions, which
    httpx maps as it maps its own transport's: ``ConnectError`` / ``ConnectTimeout`` (TLS included),
    ``WriteTimeout``, ``ReadError`` / ``ReadTimeout``, ``RemoteProtocolError`` (the server ended the
    connection before its answer was whole, or broke the protocol), ``LocalProtocolError`` (a header that
    cannot be sent). As in httpcore, a failed write is not raised: the server may have answered and closed,
    so the answer is read (a server that closed without one reads as ``RemoteProtocolError``).
    """

    def __init__(self, origin: httpcore.Origin, *, ssl_context: ssl.SSLContext | None,
                 keepalive_expiry: float) -> None:
        self._origin = origin
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._transport: asyncio.Transport | None = None
        self._protocol: _Receiving | None = None
        self._state: Literal["new", "active", "idle", "closed"] = "new"
        self._expire_at = 0.0

    def is_idle(self) -> bool:
        """Connected and carrying no request (a new connection is its first request's, never idle before)."""
        return self._state == "idle"

    def is_closed(self) -> bool:
        """Closed (after a failure, a response not read whole, or ``Connection: close``)."""
        return self._state == "closed"

    def has_expired(self) -> bool:
        """Idle longer than the keep-alive expiry, or the server sent something or left while it was idle."""
        if self._state != "idle":
            return self._state == "closed"
        protocol, transport = self._protocol, self._transport
        assert protocol is not None and transport is not None
        # The socket is asked too: an end the server sent just now is not yet read by the event loop (a request
        # sent on it would meet the close, as httpcore's check of the socket avoids).
        return bool(protocol.buffer) or protocol.ended or time.monotonic() > self._expire_at \
            or _socket_readable(transport.get_extra_info("socket"))

    async def aclose(self) -> None:
        """Close it (its transport sends what it still holds, then closes)."""
        self._close()

    def get_extra_info(self, info: str) -> object:
        """What httpcore's network streams tell (a response's ``network_stream`` extension is this connection):
        ``ssl_object``, ``client_addr``, ``server_addr``, ``socket``, and ``is_readable``."""
        protocol = self._protocol
        if info == "is_readable":
            return protocol is not None and (bool(protocol.buffer) or protocol.ended)
        name = _EXTRA.get(info)
        return self._transport.get_extra_info(name) if name is not None and self._transport is not None else None

    def _close(self) -> None:
        self._state = "closed"
        if self._transport is not None:
            self._transport.close()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        """Send ``request`` and read its answer's head; the body is read through the response's stream."""
        if self._state not in ("new", "idle"):
            raise httpcore.ConnectionNotAvailable()
        new = self._state == "new"
        self._state = "active"
        timeouts = request.extensions.get("timeout", {})
        read_timeout = timeouts.get("read")
        try:
            if new:
                await self._connect(timeouts.get("connect"), request.extensions.get("sni_hostname"))
            chunked = False
            try:
                head, chunked = _request_head(request)
                async for part in request.stream:  # type: ignore[union-attr]
                    if not part:
                        continue
                    framed = b"%x\r\n%b\r\n" % (len(part), part) if chunked else part
                    await self._write(head + framed, timeouts.get("write"))  # the head with the first part
                    head = b""
                await self._write(head + (b"0\r\n\r\n" if chunked else b""), timeouts.get("write"))
            except httpcore.WriteError:
                pass  # the server may have answered and closed: read what it said (as httpcore does)
            while True:
                status, reason, version, received = await self._read_head(read_timeout)
                if status < 100 or status == 101:
                    # h11's answers too: a status below 100 is none, and this client never asks to switch
                    # protocols (no Upgrade header is sent by a model call).
                    raise httpcore.RemoteProtocolError(f"the server answered with status {status}")
                if status >= 200:
                    break  # 1xx are interim: the answer follows
            headers, framing, keep_alive = _response_rules(
                received, version, no_body=request.method == b"HEAD" or status in (204, 304))
            body = _Body(self, framing, read_timeout,
                         reusable=keep_alive
                         and not any(n.lower() == b"connection" and _says_close(v) for n, v in request.headers))
        except BaseException:
            self._close()
            raise
        return httpcore.Response(status, headers=headers, content=body,
                                 extensions={"http_version": b"HTTP/" + version, "reason_phrase": reason,
                                             "network_stream": self})

    async def _connect(self, timeout: float | None, sni_hostname: str | None) -> None:
        loop = asyncio.get_running_loop()
        host, port = self._origin.host.decode("ascii"), self._origin.port
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(_Receiving, host, port,
                                                                   happy_eyeballs_delay=0.25)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        self._transport, self._protocol = transport, protocol
        if self._origin.scheme != b"https":
            return
        context = self._ssl_context if self._ssl_context is not None else httpx.create_ssl_context()
        context.set_alpn_protocols(["http/1.1"])
        try:
            async with asyncio.timeout(timeout):
                secured = await loop.start_tls(transport, protocol, context, server_hostname=sni_hostname or host)
        except TimeoutError:
            transport.close()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, EOFError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            transport.close()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        if secured is None:  # the connection closed during the handshake
            raise httpcore.ConnectError("the connection closed during the TLS handshake")
        self._transport = secured

    async def _write(self, data: bytes, timeout: float | None) -> None:
        """Send ``data``; wait at most ``timeout`` while the socket's buffer is full."""
        if not data:
            return
        transport, protocol = self._transport, self._protocol
        assert transport is not None and protocol is not None
        if protocol.lost is not None or transport.is_closing():
            raise httpcore.WriteError(str(protocol.lost or "the connection is closed"))
        transport.write(data)
        if protocol.writing_paused:
            await self._until("writable", timeout, httpcore.WriteTimeout("timed out writing the request"))
            if protocol.lost is not None:
                raise httpcore.WriteError(str(protocol.lost))

    async def _received(self, timeout: float | None) -> bytearray:
        """The received bytes not yet taken (at least one, waiting at most ``timeout``), empty at the end."""
        protocol = self._protocol
        assert protocol is not None
        if not protocol.buffer and not protocol.ended:
            await self._until("readable", timeout, httpcore.ReadTimeout("timed out reading the response"))
        if not protocol.buffer and protocol.lost is not None:
            raise self._cut("message") from protocol.lost
        return protocol.buffer

    def _taken(self, count: int) -> bytes:
        """The first ``count`` received bytes, removed from the buffer (reading resumes once it has room)."""
        protocol = self._protocol
        assert protocol is not None and self._transport is not None
        buffer = protocol.buffer
        data = bytes(buffer[:count])
        del buffer[:count]
        if protocol.reading_paused and len(buffer) <= _READ_HIGH // 2:
            protocol.reading_paused = False
            self._transport.resume_reading()
        return data

    async def _counted(self, count: int, timeout: float | None, what: str) -> AsyncIterator[bytes]:
        """The next ``count`` received bytes, as they arrive."""
        while count:
            buffer = await self._received(timeout)
            if not buffer:
                raise self._cut(f"{what}: {count} bytes missing")
            part = self._taken(min(count, len(buffer)))
            count -= len(part)
            yield part

    async def _line(self, timeout: float | None, limit: int, what: str) -> bytes:
        """The next received line of a chunked body (without its CRLF), at most ``limit`` bytes.

        Chunked framing ends its lines with CRLF only: a bare LF is refused at once (h11 waits for a CRLF
        until the read times out; a lone LF where CRLF belongs is how a body's framing is made to disagree
        between two readers).
        """
        start = 0
        while True:
            buffer = await self._received(timeout)
            end = buffer.find(b"\n", start)
            if end >= 0:
                line = self._taken(end + 1)[:-1]
                if not line.endswith(b"\r"):
                    raise httpcore.RemoteProtocolError(f"the server's {what} does not end with CRLF")
                return line[:-1]
            if not buffer or self._ended():
                raise self._cut(what)
            if len(buffer) > limit:
                raise httpcore.RemoteProtocolError(f"the server's {what} is longer than {limit} bytes")
            start = len(buffer)
            await self._received_more(timeout)

    async def _read_head(self, timeout: float | None) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        """A response's status, reason, version (``b"1.1"``) and header fields as received (obsolete line
        foldings joined, names and values checked as h11 checks them)."""
        protocol = self._protocol
        assert protocol is not None
        buffer = await self._received(timeout)
        if not buffer:
            raise httpcore.RemoteProtocolError("Server disconnected without sending a response.")
        lines = await self._section(timeout, "message head")
        status_line = lines[0].rstrip(b"\r")
        parsed = _STATUS_LINE.fullmatch(status_line)
        if parsed is None:
            raise httpcore.RemoteProtocolError(f"not an HTTP status line: {status_line[:100]!r}")
        return int(parsed.group(2)), parsed.group(3) or b"", parsed.group(1), _fields(lines[1:])

    async def _section(self, timeout: float | None, what: str) -> list[bytes]:
        """The lines of a head or a trailer section up to the blank line (CRLF or LF) that ends it, each
        without its LF (a CR before it is kept)."""
        protocol = self._protocol
        assert protocol is not None
        buffer = protocol.buffer
        start = 0
        while True:
            found = _BLANK_LINE.search(buffer, max(0, start - 3))
            if found is not None:
                break
            if len(buffer) > _MAX_HEAD:
                raise httpcore.RemoteProtocolError(f"the response's {what} is longer than {_MAX_HEAD} bytes")
            start = len(buffer)
            if protocol.ended:
                raise self._cut(what)
            await self._received_more(timeout)
            buffer = protocol.buffer
        return self._taken(found.end()).split(b"\n")[:-2]

    async def _trailers(self, timeout: float | None) -> None:
        """Read a chunked body's trailer section (its fields checked as a head's, then dropped: nothing here
        uses trailers)."""
        buffer = await self._received(timeout)
        while len(buffer) < 2 and buffer[:1] == b"\r" and not self._ended():  # a CRLF cut after its CR
            await self._received_more(timeout)
        if buffer[:1] == b"\n" or buffer[:2] == b"\r\n":  # no trailers: the blank line at once
            self._taken(1 if buffer[:1] == b"\n" else 2)
            return
        _fields(await self._section(timeout, "trailer section"))

    def _ended(self) -> bool:
        protocol = self._protocol
        assert protocol is not None
        return protocol.ended

    def _cut(self, what: str) -> httpcore.NetworkError | httpcore.RemoteProtocolError:
        """The error of a connection that ended inside ``what``: broken (``ReadError``) or closed early."""
        protocol = self._protocol
        assert protocol is not None
        if protocol.lost is not None:  # broken, not closed: a socket error ended it
            return httpcore.ReadError(str(protocol.lost) or type(protocol.lost).__name__)
        return httpcore.RemoteProtocolError(f"peer closed connection without sending complete {what}")

    async def _received_more(self, timeout: float | None) -> None:
        """Wait for bytes beyond those received (or the end)."""
        protocol = self._protocol
        assert protocol is not None
        if not protocol.ended:
            await self._until("readable", timeout, httpcore.ReadTimeout("timed out reading the response"))

    async def _until(self, event: Literal["readable", "writable"], timeout: float | None,
                     expired: Exception) -> None:
        """Wait until the protocol sets ``event`` (bytes or the end arrived; the socket takes bytes again), at
        most ``timeout``: then raise ``expired``."""
        protocol = self._protocol
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        setattr(protocol, event, waiter)
        try:
            if timeout is None:
                await waiter
            else:
                async with asyncio.timeout(timeout):
                    await waiter
        except TimeoutError:
            raise expired from None
        finally:
            setattr(protocol, event, None)

    def _done(self, reusable: bool) -> None:
        """The response was read whole: keep the connection for the next request, or close it."""
        if reusable and self._state == "active":
            self._state = "idle"
            self._expire_at = time.monotonic() + self._keepalive_expiry
        else:
            self._close()


def _socket_readable(sock: socket.socket | None) -> bool:
    """Whether ``sock`` has bytes (or its end) waiting to be read, without reading (a closed one: True)."""
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return True
    if not hasattr(select, "poll"):  # Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


_Framing = tuple[Literal["length", "chunked", "close"], int]
"""How a response's body ends: after a length, after its last chunk, or with the connection."""


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """A head's or a trailer section's header fields from its lines (obsolete line foldings joined, names
    and values checked as h11 checks them)."""
    headers: list[tuple[bytes, bytes]] = []
    for raw in lines:
        line = raw.rstrip(b"\r")
        if line[:1] in (b" ", b"\t"):  # an obsolete line folding: the previous value goes on
            if not headers:
                raise httpcore.RemoteProtocolError("a header section begins with a continuation line")
            name, value = headers[-1]
            headers[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" \t"))
            continue
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise httpcore.RemoteProtocolError(f"not a header line: {line[:100]!r}")
        headers.append((name, value.strip(b" \t")))
    for name, value in headers:
        if _BAD_VALUE.search(value):
            raise httpcore.RemoteProtocolError(f"an illegal value of the {name.decode()} header")
    return headers


def _response_rules(received: list[tuple[bytes, bytes]], version: bytes, *,
                    no_body: bool) -> tuple[list[tuple[bytes, bytes]], _Framing, bool]:
    """A response's headers as h11 gives them (one ``Content-Length``, ``Transfer-Encoding`` in lower case),
    its body's framing (RFC 9112 section 6.3 for a client) and whether the connection may be kept.

    As h11: only ``chunked`` is understood as a transfer coding (it wins over a ``Content-Length``);
    ``Content-Length`` values must agree; without either the body ends with the connection.
    """
    headers: list[tuple[bytes, bytes]] = []
    length: bytes | None = None
    chunked = close = False
    for name, value in received:
        lower = name.lower()
        if lower == b"content-length":
            lengths = {part.strip() for part in value.split(b",")}
            found = lengths.pop() if len(lengths) == 1 else b""
            if not _DIGITS.fullmatch(found) or (length is not None and found != length):
                raise httpcore.RemoteProtocolError(f"a bad or conflicting Content-Length: {value[:100]!r}")
            if length is None:
                length = found
                headers.append((name, found))
            continue
        if lower == b"transfer-encoding":
            if chunked or value.lower() != b"chunked":
                raise httpcore.RemoteProtocolError("only one Transfer-Encoding, chunked, is supported")
            chunked = True
            headers.append((name, b"chunked"))
            continue
        if lower == b"connection" and _says_close(value):
            close = True
        headers.append((name, value))
    keep_alive = not close and version >= b"1.1"
    if no_body:
        return headers, ("length", 0), keep_alive
    if chunked:
        return headers, ("chunked", 0), keep_alive
    if length is not None:
        return headers, ("length", int(length)), keep_alive
    return headers, ("close", 0), False


class _Body:
    """A response body read from its connection as it arrives (httpcore's response stream interface); read
    whole and closed, its connection is kept for the next request, closed early, the connection closes."""

    def __init__(self, connection: Http11Connection, framing: _Framing, timeout: float | None, *,
                 reusable: bool) -> None:
        self._connection, self._framing, self._timeout, self._reusable = connection, framing, timeout, reusable
        self._whole = framing == ("length", 0)
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._whole or self._closed:
            return
        connection, timeout = self._connection, self._timeout
        kind, length = self._framing
        try:
            if kind == "length":
                async for part in connection._counted(length, timeout, "message body"):
                    yield part
            elif kind == "chunked":
                while True:
                    size_line = await connection._line(timeout, _MAX_CHUNK_LINE, "chunk size line")
                    sized = _CHUNK_SIZE_LINE.fullmatch(size_line)
                    if sized is None:
                        raise httpcore.RemoteProtocolError(f"not a chunk size: {size_line[:100]!r}")
                    size = int(sized.group(1), 16)
                    if not size:
                        break
                    async for part in connection._counted(size, timeout, "message body: a chunk"):
                        yield part
                    if await connection._line(timeout, 2, "chunk") != b"":
                        raise httpcore.RemoteProtocolError("a chunk is longer than its size")
                await connection._trailers(timeout)
            else:
                while True:
                    buffer = await connection._received(timeout)
                    if not buffer:
                        break
                    yield connection._taken(len(buffer))
                self._reusable = False
        except BaseException:
            self._closed = True
            connection._close()
            raise
        self._whole = True

    async def aclose(self) -> None:
        """Done with the body: the connection is kept when the body was read whole, else closed."""
        if self._closed:
            return
        self._closed = True
        self._connection._done(self._whole and self._reusable)


def _request_head(request: httpcore.Request) -> tuple[bytes, bool]:
    """The request line and headers as sent, and whether the body goes chunked (no ``Content-Length``)."""
    lines = [request.method, b" ", request.url.target, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in request.headers:
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise httpcore.LocalProtocolError(f"a header that cannot be sent: {name[:100]!r}")
        if name.lower() == b"transfer-encoding" and value.strip().lower() == b"chunked":
            chunked = True
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), chunked


def _says_close(connection: bytes) -> bool:
    """Whether a ``Connection`` header's value names ``close`` among its tokens."""
    return b"close" in (token.strip().lower() for token in connection.split(b","))


_EXTRA = {"ssl_object": "ssl_object", "client_addr": "sockname", "server_addr": "peername", "socket": "socket"}
_BLANK_LINE = re.compile(b"\n\r?\n")
_STATUS_LINE = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ((?:[ \t]|[^\x00\s])*))?")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00\r\n\x0b\x0c]")
"""What a header value may not hold (h11's rule: no NUL, no whitespace but spaces and tabs)."""
_DIGITS = re.compile(rb"[0-9]{1,20}")
_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")
"""A chunk's size line without its CRLF, as h11 reads it: the size at once, then extensions (not read)."""
_MAX_HEAD = 100 * 1024
"""Bytes a response's head (and its trailers) may have (h11's limit)."""
_MAX_CHUNK_LINE = 4 * 1024


class _GivenBackOnClose:
    """A response body that gives its connection back to the stack when it is closed."""

    def __init__(self, stream: AsyncIterable[bytes], stack: ConnectionStack,
                 connection: Http11Connection, key: _Key) -> None:
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


class ModelClient:
    """POSTs to a model provider: httpx's requests and responses, each request sent straight to the transport.

    What ``httpx.AsyncClient.send`` adds around the transport is nothing a model API uses: cookies (a
    provider's are its load balancer's), redirects (httpx follows none by default), auth flows, event hooks;
    building each request through the client merged its URL, headers and cookies again. Those layers were
    ~10 % of a worker's event loop at 500 calls in flight. Here the headers are merged once and each request
    is ``httpx.Request`` given to :class:`StackTransport` (whose errors httpx maps as ever). When the
    environment names a proxy, requests go through an ``httpx.AsyncClient``, which applies it.

    The headers sent are the ones httpx's client sends (``Accept``, ``Accept-Encoding``, ``Connection``,
    ``Host``, ``Content-Length``) and ``headers``; ``tests/threads/test_http.py`` compares them.
    """

    def __init__(self, timeout: float, headers: Mapping[str, str]) -> None:
        self.transport: StackTransport | None = None
        """The transport requests go to (None when a proxy is named: then :attr:`client`)."""
        self.client: httpx.AsyncClient | None = None
        """httpx's client with the environment's proxies applied (None without a proxy)."""
        self._timeout = httpx.Timeout(timeout).as_dict()
        self._raw_headers = httpx.Headers({"Accept": "*/*", "Accept-Encoding": "gzip, deflate",
                                           "Connection": "keep-alive", **headers}).raw
        self._urls: dict[str, tuple[httpx.URL, bytes]] = {}
        """Each URL posted to, parsed once, and its ``Host`` header (parsing a URL was half a request's making)."""
        if urllib.request.getproxies():
            # Only its proxies and limits count: send() takes each request with its headers and timeout.
            self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=MAX_CONNECTIONS,
                                                                max_keepalive_connections=MAX_IDLE))
        else:
            self.transport = StackTransport()

    async def send(self, url: str, body: bytes) -> httpx.Response:
        """POST ``body`` to ``url``: the response once its head arrived (read its body, then close it)."""
        known = self._urls.get(url)
        if known is None:
            if len(self._urls) >= 64:
                self._urls.clear()
            parsed = httpx.URL(url)
            known = self._urls[url] = (parsed, parsed.netloc)
        # The headers httpx's request would get, in its order (Host first, Content-Length last), given whole so
        # that it neither merges nor derives them again.
        request = httpx.Request("POST", known[0], headers=[(b"Host", known[1]), *self._raw_headers,
                                                          (b"Content-Length", b"%d" % len(body))],
                                stream=httpx.ByteStream(body), extensions={"timeout": self._timeout})
        if self.transport is None:
            assert self.client is not None
            return await self.client.send(request, stream=True)
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes) -> AsyncIterator[httpx.Response]:
        """:meth:`send`, the response closed when the block ends."""
        response = await self.send(url, body)
        try:
            yield response
        finally:
            await response.aclose()

    async def post(self, url: str, body: bytes) -> httpx.Response:
        """:meth:`send` with the whole body read."""
        async with self.stream(url, body) as response:
            await response.aread()
        return response

    async def aclose(self) -> None:
        """Close its connections."""
        if self.transport is not None:
            await self.transport.aclose()
        if self.client is not None:
            await self.client.aclose()


def model_client(timeout: float, headers: Mapping[str, str]) -> ModelClient:
    """A :class:`ModelClient` for a model provider: ``timeout`` for connecting and each read, ``headers`` on
    every request."""
    return ModelClient(timeout, headers)


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
        self._unended: list[bytes] = []
        """Chunks of the line after ``_pending`` that end no line, joined when one arrives that does (a long
        line in many chunks is copied once, not once per chunk)."""
        self._after_cr = False  # the last chunk ended in CR: a LF starting the next one belongs to it
        self._head = True
        self._data: list[str] = []
        self._type = ""

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events ``chunk`` completes, in order."""
        if not self._head and not self._after_cr and b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                self._unended.append(chunk)
            return []
        if self._unended:
            self._pending += b"".join(self._unended)
            self._unended.clear()
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
        # ends the last line (never after a CR: see feed)
        events = self.feed(b"\n") if self._pending or self._unended else []
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


__all__ = ["KEEPALIVE_EXPIRY", "MAX_CONNECTIONS", "MAX_IDLE", "ConnectionStack", "EventStream", "Http11Connection",
           "ModelClient", "StackTransport", "model_client", "server_sent_data"]

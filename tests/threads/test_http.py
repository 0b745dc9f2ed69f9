"""jixu's model HTTP client: idle connections on a stack (reused, expired, limited), errors as httpx's own.

Against a real HTTP/1.1 server on loopback (asyncio streams, in the test's loop) that counts its connections
and can delay, hold, cut or never send its answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import ssl
import string
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jixu.errors import InvalidInput
from jixu.threads.http import ConnectionStack, EventStream, StackTransport, model_client, server_sent_data
from tests.helpers import examples


class Server:
    """An HTTP/1.1 server on 127.0.0.1: ``200 ok`` after ``delay`` seconds, keep-alive, unless told otherwise."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.connections = 0
        self.requests = 0
        self.delay = 0.0
        self.close_after_answer: float | None = None
        """Close the connection this many seconds after each answer (a server's own idle timeout)."""
        self.mode = "answer"
        """``answer``; ``silent``: read the request, never answer; ``cut``: send half a body, then close;
        ``unread``: read the request's head, never its body."""
        self.answer = b"ok"
        self.bodies: list[int] = []
        """The length of each request body read."""
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if self.mode == "unread":
                    await asyncio.sleep(60)
                self.bodies.append(len(await reader.readexactly(length)))
                self.requests += 1
                if self.mode == "silent":
                    await asyncio.sleep(60)
                await asyncio.sleep(self.delay)
                if self.mode == "cut":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhalf")
                    await writer.drain()
                    writer.close()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(self.answer) + self.answer)
                await writer.drain()
                if self.close_after_answer is not None:
                    await asyncio.sleep(self.close_after_answer)
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError,
                asyncio.CancelledError):
            writer.close()


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(scenario())


def client(transport: httpx.AsyncBaseTransport | None = None, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=transport or StackTransport(), timeout=options.pop("timeout", 5.0), **options)


def test_sequential_requests_reuse_one_connection() -> None:
    async def scenario() -> None:
        async with Server() as server, client() as http:
            for _ in range(10):
                assert (await http.get(server.url)).text == "ok"
            stack = stack_of(http)
            assert (server.connections, server.requests) == (1, 10)
            assert (stack.connections, stack.idle) == (1, 1)

    run(scenario)


def test_a_quiet_caller_keeps_its_warm_connection() -> None:
    # Requests a little apart (as a thread's model calls are): the one used last is taken, so one
    # connection serves them all and none expires in between (round robin over pools made one per call).
    async def scenario() -> None:
        async with Server() as server, client(StackTransport(keepalive_expiry=2.0)) as http:
            for _ in range(6):
                assert (await http.get(server.url)).text == "ok"
                await asyncio.sleep(0.1)
            assert server.connections == 1

    run(scenario)


def test_concurrent_callers_get_a_connection_each_and_keep_it() -> None:
    # 150 callers making calls one after another with a moment between (as turns do: model call, tool,
    # model call): more connections than the 100 an SDK's client keeps idle. None is closed and opened again
    # (httpx's transport with 8 pools of the SDK's limits opened 406 connections for these 600 calls).
    async def scenario() -> None:
        async with Server() as server, client() as http:
            server.delay = 0.05

            async def caller() -> list[str]:
                texts = []
                for _ in range(4):
                    texts.append((await http.get(server.url)).text)
                    await asyncio.sleep(0.01)
                return texts

            answers = await asyncio.gather(*(caller() for _ in range(150)))
            assert answers == [["ok"] * 4] * 150
            assert (server.connections, server.requests) == (150, 600)
            assert (stack_of(http).connections, stack_of(http).idle) == (150, 150)

    run(scenario)


def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async def scenario() -> None:
        async with Server() as server, client() as http:
            server.close_after_answer = 0.05
            assert (await http.get(server.url)).text == "ok"
            await asyncio.sleep(0.2)  # the server closed it meanwhile
            assert (await http.get(server.url)).text == "ok"
            assert server.connections == 2
            assert stack_of(http).connections == 1, "the dead one was dropped"

    run(scenario)


def test_an_expired_idle_connection_is_closed_and_not_used() -> None:
    async def scenario() -> None:
        async with Server() as server, client(StackTransport(keepalive_expiry=0.1)) as http:
            assert (await http.get(server.url)).text == "ok"
            await asyncio.sleep(0.3)
            assert (await http.get(server.url)).text == "ok"
            assert server.connections == 2 and stack_of(http).connections == 1

    run(scenario)


def test_the_oldest_idle_connection_is_closed_once_expired() -> None:
    # Two connections kept; the one at the bottom expires while the other is in use: giving that one back
    # closes the expired one (no idle connection outlives its expiry by more than one give-back).
    async def scenario() -> None:
        async with Server() as server, client(StackTransport(keepalive_expiry=0.5)) as http:
            server.delay = 0.05
            await asyncio.gather(http.get(server.url), http.get(server.url))
            assert stack_of(http).idle == 2
            await asyncio.sleep(0.3)
            for _ in range(5):  # the top one is refreshed each time; the bottom one expires meanwhile
                await http.get(server.url)
                await asyncio.sleep(0.1)
            assert (stack_of(http).connections, stack_of(http).idle) == (1, 1)
            assert server.connections == 2

    run(scenario)


def test_at_the_limit_a_request_waits_for_a_connection_or_times_out_as_httpx_does() -> None:
    async def scenario() -> None:
        async with Server() as server, client(StackTransport(max_connections=1)) as http:
            async with http.stream("GET", server.url) as held:
                with pytest.raises(httpx.PoolTimeout):
                    await http.get(server.url, timeout=httpx.Timeout(5.0, pool=0.2))
                waiting = asyncio.create_task(http.get(server.url))
                await asyncio.sleep(0.1)
                assert not waiting.done(), "waits while the only connection is busy"
                await held.aread()
            assert (await waiting).text == "ok"
            assert server.connections == 1

    run(scenario)


def test_at_the_limit_an_idle_connection_of_another_origin_makes_room() -> None:
    async def scenario() -> None:
        async with Server() as first, Server() as second, client(StackTransport(max_connections=1)) as http:
            assert (await http.get(first.url)).text == "ok"
            assert (await asyncio.wait_for(http.get(second.url), 2)).text == "ok"
            assert (stack_of(http).connections, first.connections, second.connections) == (1, 1, 1)

    run(scenario)


def test_large_bodies_arrive_whole_both_ways() -> None:
    # More than the socket buffers and the read buffer's limit hold: writing waits for the socket, reading
    # stops taking bytes from the socket until they are read.
    async def scenario() -> None:
        async with Server() as server, client() as http:
            server.answer = bytes(range(256)) * 24_000  # ~6 MB
            sent = b"z" * 12_000_000
            response = await http.post(server.url, content=sent)
            assert response.content == server.answer and server.bodies == [len(sent)]
            slowly = b""
            async with http.stream("GET", server.url) as streamed:
                async for part in streamed.aiter_raw():
                    slowly += part
                    await asyncio.sleep(0)  # a slow reader: the buffer fills past its limit
            assert slowly == server.answer
            assert stack_of(http).connections == 1

    run(scenario)


@pytest.mark.parametrize("failure", ["refused", "silent", "cut", "unread"])
def test_failures_read_as_with_httpxs_own_transport(failure: str) -> None:
    async def outcome(transport: httpx.AsyncBaseTransport) -> tuple[type[BaseException], int | None]:
        async with Server() as server, client(transport, timeout=0.3) as http:
            url = server.url
            if failure == "refused":
                await server.__aexit__()
            else:
                server.mode = failure
            with pytest.raises(httpx.HTTPError) as raised:
                # Only the unread case needs a body larger than the socket buffers (the write must wait);
                # for the others a small one keeps their outcome from hanging on the machine's speed.
                body = b"b" * (50_000_000 if failure == "unread" else 1000)
                async with http.stream("POST", url, content=body) as response:
                    await response.aread()
            left = stack_of(http).connections if isinstance(transport, StackTransport) else None
            return type(raised.value), left

    async def scenario() -> None:
        ours, left = await outcome(StackTransport())
        theirs, _ = await outcome(httpx.AsyncHTTPTransport())
        assert ours is theirs, f"{failure}: {ours.__name__} here, {theirs.__name__} with httpx's transport"
        assert left == 0, "the failed connection was closed and counted out"

    run(scenario)


_CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"

ANSWERS = {
    # name: (the bytes a server answers each request with, whether it then closes the connection)
    "length": (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "chunked": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\n"
                b"x-trailer: 1\r\n\r\n", False),
    "chunked in capitals": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n", False),
    "until the end": (b"HTTP/1.1 200 OK\r\n\r\nuntil the end", True),
    "interim answers": (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n"
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "lf line ends": (b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok", False),
    "folded header": (b"HTTP/1.1 200 OK\r\nx-a: one\r\n two\r\ncontent-length: 2\r\n\r\nok", False),
    "connection close": (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", True),
    "http 1.0": (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "no content": (b"HTTP/1.1 204 No Content\r\n\r\n", False),
    "not modified": (b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n", False),
    "no reason": (b"HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok", False),
    "empty reason": (b"HTTP/1.1 200 \r\ncontent-length: 2\r\n\r\nok", False),
    "bad status": (b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "bad length": (b"HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\nok", False),
    "conflicting lengths": (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok", False),
    "repeated length": (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok", False),
    "listed length": (b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok", False),
    "bad chunk size": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", False),
    "chunk longer than said": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokay\r\n0\r\n\r\n", False),
    "chunk cut": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nshort", True),
    "body cut": (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", True),
    "head cut": (b"HTTP/1.1 200 OK\r\ncontent-len", True),
    "http 2.0 text": (b"HTTP/2.0 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "line without colon": (b"HTTP/1.1 200 OK\r\nbroken header\r\ncontent-length: 2\r\n\r\nok", False),
    "space before colon": (b"HTTP/1.1 200 OK\r\nx-a : 1\r\ncontent-length: 2\r\n\r\nok", False),
    "chunked and length": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n"
                           b"2\r\nok\r\n0\r\n\r\n", False),
    "gzip then chunked": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", False),
    "identity coding": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\n\r\nok", True),
    "nothing": (b"", True),
    "not http": (b"SSH-2.0-OpenSSH_9.2\r\n", True),
    "control character": (b"HTTP/1.1 200 OK\r\nx-a: a\x01b\r\ncontent-length: 2\r\n\r\nok", False),
    "nul in a value": (b"HTTP/1.1 200 OK\r\nx-a: a\x00b\r\ncontent-length: 2\r\n\r\nok", False),
    "utf-8 value": ("HTTP/1.1 200 OK\r\nx-a: caf\u00e9\r\ncontent-length: 2\r\n\r\nok".encode(), False),
    "tabs around a value": (b"HTTP/1.1 200 OK\r\nx-a:\tv\t\r\ncontent-length: 2\r\n\r\nok", False),
    "blank line first": (b"\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "space before a chunk size": (_CHUNKED + b" 2\r\nok\r\n0\r\n\r\n", False),
    "space after a chunk size": (_CHUNKED + b"2 \r\nok\r\n0\r\n\r\n", False),
    "space before a chunk extension": (_CHUNKED + b"2 ;x=1\r\nok\r\n0\r\n\r\n", False),
    "tab before a chunk extension": (_CHUNKED + b"2\t;x\r\nok\r\n0\r\n\r\n", False),
    "empty chunk extension": (_CHUNKED + b"2;\r\nok\r\n0;x=1\r\n\r\n", False),
    "quoted chunk extension": (_CHUNKED + b'2;a="b;c"\r\nok\r\n0\r\n\r\n', False),
    "chunk size of 20 digits": (_CHUNKED + b"00000000000000000002\r\nok\r\n0\r\n\r\n", False),
    "chunk size of 21 digits": (_CHUNKED + b"000000000000000000002\r\nok\r\n0\r\n\r\n", False),
    "chunk size 0x": (_CHUNKED + b"0x2\r\nok\r\n0\r\n\r\n", False),
    "empty chunk size": (_CHUNKED + b"\r\nok\r\n0\r\n\r\n", False),
    "lf after chunk data": (_CHUNKED + b"2\r\nok\n0\r\n\r\n", False),
    "cr only after a chunk size": (_CHUNKED + b"2\rok\r\n0\r\n\r\n", False),
    "trailers": (_CHUNKED + b"2\r\nok\r\n0\r\nx-a: 1\r\nx-b:2\r\n\r\n", False),
    "trailer ending with lf": (_CHUNKED + b"2\r\nok\r\n0\r\nx-a: 1\n\r\n", False),
    "folded trailer": (_CHUNKED + b"2\r\nok\r\n0\r\nx-a: 1\r\n 2\r\n\r\n", False),
    "malformed trailer": (_CHUNKED + b"2\r\nok\r\n0\r\nnot a field\r\n\r\n", False),
    "trailer with a control character": (_CHUNKED + b"2\r\nok\r\n0\r\nx-a: \x01\r\n\r\n", False),
    "switching protocols": (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n", False),
    "status below 100": (b"HTTP/1.1 099 X\r\ncontent-length: 2\r\n\r\nok", False),
    "status 999": (b"HTTP/1.1 999 X\r\ncontent-length: 2\r\n\r\nok", False),
    "many interim answers": (b"HTTP/1.1 100 Continue\r\n\r\n" * 50 + b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                             False),
    "interim answer with a length": (b"HTTP/1.1 100 Continue\r\ncontent-length: 5\r\n\r\n"
                                     b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
    "connection keep-alive, close": (b"HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 2\r\n\r\nok",
                                     True),
    "http 1.0 keep-alive": (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", False),
    "no blank line after the last chunk": (_CHUNKED + b"2\r\nok\r\n0\r\n", True),
}


async def answered(transport: httpx.AsyncBaseTransport, answer: bytes, close: bool,
                   requests: int = 2, cuts: Sequence[int] = ()) -> tuple[list[Any], int]:
    """What a client reads of ``requests`` GETs a server answers with ``answer``: each response's status,
    reason, version, headers and body, or the name of its error; and how many connections it opened.

    The server sends ``answer`` in pieces cut at ``cuts`` (offsets), pausing after each piece so that the
    client reads it on its own."""
    connections = 0
    bounds = [0, *cuts, len(answer)]
    pieces = [answer[start:end] for start, end in itertools.pairwise(bounds)]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(Exception):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                for number, piece in enumerate(pieces):
                    if number:
                        await asyncio.sleep(0.002)
                    writer.write(piece)
                    await writer.drain()
                if close:
                    break
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    seen: list[Any] = []
    async with client(transport, timeout=2.0) as http:
        for _ in range(requests):
            try:
                response = await http.get(url)
            except httpx.HTTPError as error:
                seen.append(type(error).__name__)
            else:
                seen.append((response.status_code, response.reason_phrase, response.http_version,
                             [(name.lower(), value) for name, value in response.headers.raw], response.content))
    server.close()
    return seen, connections


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_answers_read_as_with_httpxs_own_transport(name: str) -> None:
    # Framing, interim answers, keep-alive and every malformed answer: the same responses or the same errors,
    # over as many connections, as httpx's transport (httpcore and h11) reads them.
    answer, close = ANSWERS[name]

    async def scenario() -> None:
        ours = await answered(StackTransport(), answer, close)
        theirs = await answered(httpx.AsyncHTTPTransport(), answer, close)
        assert ours == theirs

    run(scenario)


_TOKEN = st.text(alphabet=string.ascii_letters + string.digits + "-", min_size=1, max_size=10)
_VALUE = st.text(alphabet=string.ascii_letters + string.digits + " -_.,;=/\t", max_size=16)
_FRAMING_HEADERS = {"content-length", "transfer-encoding", "connection"}


@st.composite
def framed_answers(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A well-formed HTTP/1.x answer (interim answers, any header case, length, chunked or until the end,
    chunk extensions and trailers, CRLF or LF line ends) and whether the server closes after it."""
    end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 400, 404, 429, 500, 503]))
    reason = draw(st.sampled_from([b"", b" ", b" OK", b" Too Many Requests"]))
    framing = draw(st.sampled_from(["length", "chunked", "until the end"]))
    body = b"" if status in (204, 304) else draw(st.binary(max_size=200))
    headers = [(name, value) for name, value in draw(st.lists(st.tuples(_TOKEN, _VALUE), max_size=4))
               if name.lower() not in _FRAMING_HEADERS]
    def cased(name: str) -> bytes:
        return draw(st.sampled_from([name, name.upper(), name.title()])).encode()
    if framing == "length":
        headers.append((cased("content-length").decode(), str(len(body))))
        payload = body
    elif framing == "chunked":
        headers.append((cased("transfer-encoding").decode(), draw(st.sampled_from(["chunked", "Chunked"]))))
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=4)))) if body else []
        parts = [body[start:stop] for start, stop in itertools.pairwise([0, *cuts, len(body)]) if stop > start]
        payload = b""  # its lines end with CRLF whatever the head's do (a bare LF is refused, tested apart)
        for part in parts:
            size = b"%x" % len(part)
            payload += (size.upper() if draw(st.booleans()) else size) + draw(st.sampled_from([b"", b";x=1"])) \
                + b"\r\n" + part + b"\r\n"
        trailers = draw(st.lists(st.tuples(_TOKEN, _VALUE), max_size=2))
        payload += b"0\r\n" + b"".join(f"{name}: {value}".encode() + end for name, value in trailers) + end
    else:
        payload = body
    if status in (204, 304):
        payload = b""  # no body whatever the head says: bytes after one are never an answer (tested apart)
    interim = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue" + end + end]))
    head = interim + version + b" %d" % status + reason + end
    head += b"".join(cased(name.lower()) + b":" + draw(st.sampled_from([b" ", b"", b"\t"])) + value.encode() + end
                     for name, value in headers)
    return head + end + payload, framing == "until the end" and status not in (204, 304)


@given(answer=framed_answers(), data=st.data())
@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.too_slow])
def test_answers_in_any_pieces_read_as_with_httpxs_own_transport(answer: tuple[bytes, bool],
                                                                 data: st.DataObject) -> None:
    # However an answer is framed and however the network cuts it into reads (a cut inside a line ending,
    # a chunk size, a header), the same responses over as many connections as httpx's transport reads.
    text, close = answer
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(text) - 1), max_size=6))))

    async def scenario() -> None:
        ours = await answered(StackTransport(), text, close, cuts=cuts)
        theirs = await answered(httpx.AsyncHTTPTransport(), text, close, cuts=cuts)
        assert ours == theirs

    run(scenario)


def test_a_chunked_body_with_bare_lf_line_ends_is_refused_at_once() -> None:
    # Chunked framing's lines end with CRLF. httpx's transport waits for one until its read times out
    # (a ReadTimeout); here the answer is a protocol error as soon as the LF arrives.
    async def scenario() -> None:
        seen, _connections = await answered(StackTransport(), _CHUNKED.replace(b"\r\n\r\n", b"\n\n")
                                            + b"2\nok\n0\n\n", False)
        assert seen == ["RemoteProtocolError", "RemoteProtocolError"]

    run(scenario)


def test_bytes_after_an_answer_are_never_read_as_the_next_answer() -> None:
    # h11 would read them as the next request's answer; here the connection is dropped and a new one is made.
    async def scenario() -> None:
        seen, connections = await answered(StackTransport(), b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                                           b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\nsent", False)
        assert [answer[0] for answer in seen] == [200, 200] and connections == 2

    run(scenario)


def test_a_request_body_without_a_length_goes_chunked() -> None:
    async def scenario() -> None:
        received = bytearray()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.extend(await reader.readuntil(b"0\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()

        async def parts() -> AsyncIterator[bytes]:
            yield b"hello "
            yield b""
            yield b"world"

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with client() as http:
            response = await http.post(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/up", content=parts())
        server.close()
        assert response.content == b"ok"
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        assert head.startswith(b"POST /up HTTP/1.1\r\n") and b"\r\nTransfer-Encoding: chunked" in head
        assert body == b"6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"

    run(scenario)


@pytest.mark.parametrize(("connection", "reused"), [("close", False), ("keep-alive, Close", False),
                                                   ("keep-alive", True), ("x-closeish", True)])
def test_a_request_saying_connection_close_is_not_reused_as_with_httpxs_transport(connection: str,
                                                                                    reused: bool) -> None:
    async def connections(transport: httpx.AsyncBaseTransport) -> int:
        async with Server() as server, client(transport) as http:
            for _ in range(2):
                assert (await http.get(server.url, headers={"Connection": connection})).content == b"ok"
            return server.connections

    async def scenario() -> None:
        ours = await connections(StackTransport())
        assert ours == await connections(httpx.AsyncHTTPTransport()) == (1 if reused else 2)

    run(scenario)


def test_a_header_that_cannot_be_sent_is_refused_before_anything_is_sent() -> None:
    async def scenario() -> None:
        async with Server() as server, client() as http:
            with pytest.raises(httpx.LocalProtocolError):
                await http.get(server.url, headers={"x-key": "one\r\nx-injected: two"})
            assert server.requests == 0

    run(scenario)


def test_a_cancelled_request_leaves_no_connection_behind() -> None:
    async def scenario() -> None:
        async with Server() as server, client() as http:
            server.delay = 5.0
            request = asyncio.create_task(http.get(server.url))
            await asyncio.sleep(0.1)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            assert stack_of(http).connections == 0
            server.delay = 0.0
            assert (await http.get(server.url)).text == "ok"

    run(scenario)


def test_closing_the_client_closes_idle_and_busy_connections() -> None:
    async def scenario() -> None:
        async with Server() as server:
            http = client()
            response = await http.send(http.build_request("GET", server.url), stream=True)  # busy
            await http.get(server.url)  # over a second connection, idle after
            stack = stack_of(http)
            assert (stack.connections, stack.idle) == (2, 1)
            await http.aclose()
            assert (stack.connections, stack.idle) == (0, 0)
            await response.aclose()  # a body closed after its client: nothing is given back
            assert stack.connections == 0

    run(scenario)


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def tls_pair(authority: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context with a certificate for 127.0.0.1, a client context trusting it)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    return server, trusting


def test_tls_connections_are_verified_and_reused(authority: trustme.CA) -> None:
    server_tls, trusting = tls_pair(authority)

    async def scenario() -> None:
        async with Server(server_tls) as server, client(StackTransport(verify=trusting)) as http:
            for _ in range(5):
                async with http.stream("GET", server.url) as response:
                    assert (await response.aread()) == b"ok"
                    stream = response.extensions["network_stream"]
                    assert stream.get_extra_info("ssl_object").version().startswith("TLS")
            assert (server.connections, server.requests) == (1, 5)

    run(scenario)


@pytest.mark.parametrize("failure", ["untrusted", "no handshake"])
def test_tls_failures_read_as_with_httpxs_own_transport(authority: trustme.CA, failure: str) -> None:
    server_tls, _trusting = tls_pair(authority)

    async def outcome(transport: httpx.AsyncBaseTransport) -> type[BaseException]:
        # Untrusted: the default trust store does not know the test authority. No handshake: a plain
        # server that never answers the TLS hello.
        # The untrusted certificate fails the handshake whatever the time allowed, so it gets a long timeout (a
        # loaded machine's handshake took over 0.3 s once, with httpx's transport); the silent server, a short one.
        async with Server(server_tls if failure == "untrusted" else None) as server, \
                client(transport, timeout=10.0 if failure == "untrusted" else 0.3) as http:
            url = server.url.replace("http://", "https://")
            with pytest.raises(httpx.HTTPError) as raised:
                await http.get(url)
            if isinstance(transport, StackTransport):
                assert transport.stack.connections == 0
            return type(raised.value)

    async def scenario() -> None:
        ours = await outcome(StackTransport())
        theirs = await outcome(httpx.AsyncHTTPTransport())
        assert ours is theirs, f"{failure}: {ours.__name__} here, {theirs.__name__} with httpx's transport"
        assert ours is (httpx.ConnectError if failure == "untrusted" else httpx.ConnectTimeout)

    run(scenario)


@pytest.mark.parametrize(("option", "value"), [("max_connections", 0), ("max_connections", True),
                                             ("max_connections", 2.5), ("max_idle", -1), ("max_idle", "8"),
                                             ("keepalive_expiry", 0), ("keepalive_expiry", float("nan")),
                                             ("keepalive_expiry", None)])
def test_bad_limits_are_refused_with_a_typed_error(option: str, value: Any) -> None:
    with pytest.raises(InvalidInput, match=option) as raised:
        ConnectionStack(**{option: value})
    assert raised.value.details.get("field") == option
    with pytest.raises(InvalidInput, match=option):
        StackTransport(**{option: value})


def test_with_a_proxy_in_the_environment_the_client_is_httpxs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    proxied = model_client(5.0, {})
    assert proxied.transport is None and proxied.client is not None
    assert [mount for mount in proxied.client._mounts.values() if mount is not None], "httpx mounted the proxy"
    monkeypatch.delenv("HTTPS_PROXY")
    direct = model_client(5.0, {})
    assert isinstance(direct.transport, StackTransport) and direct.client is None


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """A request's head (with its blank line) and its body (of the length it says)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


def test_a_model_client_decodes_gzipped_answers_whole_and_streamed() -> None:
    # Providers compress what the client accepts (it sends Accept-Encoding: gzip, deflate): a JSON answer
    # with a length, and an event stream compressed as one gzip stream sent in chunks as it is made.
    whole = gzip.compress(b'{"ok": true}')
    events = b"".join(b'data: {"n": %d}\n\n' % n for n in range(50)) + b"data: [DONE]\n\n"
    packed = gzip.compress(events)
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(packed[at:at + 40]), packed[at:at + 40])
                       for at in range(0, len(packed), 40)) + b"0\r\n\r\n"

    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while True:
                    head, _body = await read_request(reader)
                    if b"/stream" in head.split(b"\r\n")[0]:
                        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                     b"content-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n" + chunked)
                    else:
                        writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n"
                                     % len(whole) + whole)
                    await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        http = model_client(5.0, {})
        try:
            answered = await http.post(url + "/whole", b"{}")
            assert answered.json() == {"ok": True}
            async with http.stream(url + "/stream", b"{}") as response:
                data = [text async for text in server_sent_data(response.aiter_bytes())]
            assert data == [f'{{"n": {n}}}' for n in range(50)] + ["[DONE]"]
        finally:
            await http.aclose()
            server.close()

    run(scenario)


@pytest.mark.parametrize("proxied", [False, True])
def test_a_model_client_sends_what_httpxs_client_sends(monkeypatch: pytest.MonkeyPatch, proxied: bool) -> None:
    # The same request line, headers (names, values, order) and body as httpx.AsyncClient with the same
    # headers; with a proxy named (and bypassed for this host), through httpx's client itself.
    if proxied:
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    async def scenario() -> None:
        heads: list[bytes] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while True:
                    head, body = await read_request(reader)
                    heads.append(head + body)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nset-cookie: lb=1\r\n\r\nok")
                    await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        headers = {"Authorization": "Bearer k", "Content-Type": "application/json", "User-Agent": "jixu/test"}
        ours = model_client(5.0, headers)
        assert (ours.client is not None) is proxied
        answer = await ours.post(url, b'{"a":1}')
        assert (answer.status_code, answer.content, answer.request.url) == (200, b"ok", httpx.URL(url))
        async with httpx.AsyncClient(headers=headers) as theirs:
            await theirs.post(url, content=b'{"a":1}')
        await ours.aclose()
        server.close()
        assert heads[0] == heads[1]

    run(scenario)


def stack_of(http: httpx.AsyncClient) -> ConnectionStack:
    transport = http._transport
    assert isinstance(transport, StackTransport)
    return transport.stack


# --- the event stream format -------------------------------------------------------------------------------


def events_of(*chunks: bytes) -> list[tuple[str, str]]:
    stream = EventStream()
    found = [event for chunk in chunks for event in stream.feed(chunk)]
    return found + stream.end()


FORMAT_SAMPLE = ('\ufeff: a comment\nevent: message\nid: 7\ndata: {"a":\ndata: 1}\n\nretry: 10\n\n'
                 "event: problem\ndata:no-space\n\nevent: nothing\n\ndata\n\ndata: [DONE]").encode()
FORMAT_EVENTS = [("message", '{"a":\n1}'), ("problem", "no-space"), ("message", ""), ("message", "[DONE]")]


def test_server_sent_events_are_read_as_the_format_defines_them() -> None:
    assert events_of(FORMAT_SAMPLE) == FORMAT_EVENTS
    # Cut anywhere, with CR or CRLF line ends (a CRLF cut between its two bytes too):
    for ending in (b"\n", b"\r", b"\r\n"):
        text = FORMAT_SAMPLE.replace(b"\n", ending)
        assert events_of(text) == FORMAT_EVENTS
        for size in (1, 2, 7):
            assert events_of(*(text[i:i + size] for i in range(0, len(text), size))) == FORMAT_EVENTS, (ending, size)


_FIELD_LINES = st.sampled_from(["data: x", "data:yy", "data", "event: e", ": comment", "id: 1", "", "",
                                 'data: {"a": "\u00e9\u4f60"}', "data: " + "z" * 300])


@given(lines=st.lists(st.tuples(_FIELD_LINES, st.sampled_from(["\n", "\r", "\r\n"])), max_size=12),
       data=st.data())
@settings(max_examples=examples(200))
def test_server_sent_events_cut_anywhere_read_as_the_whole_body(lines: list[tuple[str, str]],
                                                                 data: st.DataObject) -> None:
    # However the body is cut into reads (inside a line, a CRLF, a character), the same events as read whole.
    body = "".join(line + end for line, end in lines).encode()
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=8)))) if body else []
    chunks = [body[start:end] for start, end in itertools.pairwise([0, *cuts, len(body)])]
    assert events_of(*chunks) == events_of(body)


def test_a_long_line_in_many_chunks_is_one_event() -> None:
    # Chunks that end no line are kept apart and joined once a line ends (not copied again for each chunk).
    line = b"data: " + b"x" * 1_000_000 + b"\n\n"
    assert events_of(*(line[i:i + 4096] for i in range(0, len(line), 4096))) == [("message", "x" * 1_000_000)]
    assert events_of(*(line[i:i + 4096] for i in range(0, len(line) - 2, 4096))) == [("message", "x" * 1_000_000)]


def test_only_cr_and_lf_end_an_event_line() -> None:
    # U+2028, U+2029 and U+0085 may stand unescaped in a JSON text; str.splitlines (and so httpx's
    # iter_lines) would break the data line there. A character cut between chunks is put together.
    data = '{"content":"a\u2028b\u2029c\u0085d \u4f60\u597d \x0b\x0c\x1c"}'
    body = f"data: {data}\n\n".encode()
    assert events_of(body) == [("message", data)]
    assert events_of(*(body[i:i + 1] for i in range(len(body)))) == [("message", data)]
    assert events_of(b"data: \xff bad\n\n") == [("message", "\ufffd bad")], "bad UTF-8 is replaced"


def test_a_body_ending_inside_an_event_gives_it_once() -> None:
    for body in (b"data: last", b"data: last\n", b"data: last\r", b"data: last\r\n"):
        assert events_of(body) == [("message", "last")], body
    assert events_of(b"") == [] and events_of(b"event: x\n") == []


def test_server_sent_data_gives_the_data_and_closes_its_source() -> None:
    closed: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield FORMAT_SAMPLE[:20]
            yield FORMAT_SAMPLE[20:]
        finally:
            closed.append(True)

    async def collect() -> list[str]:
        return [data async for data in server_sent_data(body())]

    assert asyncio.run(collect()) == [data for _type, data in FORMAT_EVENTS]
    assert closed == [True]

"""The HTTP client jixu's model drivers send their calls with: ``httpx``, its connections spread over pools.

httpcore's connection pool looks at every connection it holds each time a
request arrives or a response is closed (and asks the socket of each idle one
whether it is still readable). With hundreds of calls in flight, as a worker
running hundreds of turns has, that scan is a large part of each call's CPU.
Spreading the requests round robin over :data:`POOLS` pools, each with its
share of the limits, divides the scan by as many: measured with 500 streamed
calls in flight against ``bench/fake_openai.py``, 1.67 -> 1.30 ms of CPU per
call. Each request still goes over one ordinary pool, so keep-alive, timeouts
and certificates behave as httpx's own. When the environment names a proxy
(``HTTPS_PROXY`` and friends), which httpx applies only to a client of its own
transport, the client is httpx's plain one with the same limits.
"""

from __future__ import annotations

import itertools
import urllib.request
from collections.abc import Mapping

import httpx

MAX_CONNECTIONS = 1000
MAX_KEEPALIVE = 100
"""Over all pools: the limits the official SDKs set on their clients."""
POOLS = 8


class SpreadTransport(httpx.AsyncBaseTransport):
    """Requests round robin over ``pools`` ordinary transports, each with its share of the limits."""

    def __init__(self, pools: int = POOLS, *, max_connections: int = MAX_CONNECTIONS,
                 max_keepalive: int = MAX_KEEPALIVE) -> None:
        limits = httpx.Limits(max_connections=max(1, max_connections // pools),
                              max_keepalive_connections=max(1, max_keepalive // pools))
        self._pools = [httpx.AsyncHTTPTransport(limits=limits) for _ in range(pools)]
        self._next = itertools.cycle(self._pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` over the next pool."""
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        """Close every pool's connections."""
        for pool in self._pools:
            await pool.aclose()


def model_client(timeout: float, headers: Mapping[str, str]) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for a model provider: ``timeout`` for connecting and each read,
    ``headers`` on every request, the connections spread over :data:`POOLS` pools (one plain pool, the
    environment's proxies applied, when it names any)."""
    if urllib.request.getproxies():
        return httpx.AsyncClient(timeout=httpx.Timeout(timeout), headers=dict(headers),
                                 limits=httpx.Limits(max_connections=MAX_CONNECTIONS,
                                                     max_keepalive_connections=MAX_KEEPALIVE))
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), headers=dict(headers), transport=SpreadTransport())


__all__ = ["MAX_CONNECTIONS", "MAX_KEEPALIVE", "POOLS", "SpreadTransport", "model_client"]

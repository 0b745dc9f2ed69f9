"""What a loop's shutdown may cut: nothing between a call's dispatch marker and its receipt (decision 0036).

``asyncio.run`` (and every runner like it) ends by cancelling each task still
on its loop, from outside the loop: the cancellations are made while the loop
is not running, then the loop runs until the tasks have ended. A program
that sends in one ``asyncio.run`` and waits in another (two web handlers)
would so cut the call in flight: an email sent without its receipt, or cut
half-way, ``unknown`` for good.

The tasks of the effect kernel tell such a cancellation apart (the loop is
not running when it is made) from every deliberate one (an interruption, a
drain's timeout, a lost claim, an ``asyncio.timeout``: all made from the
running loop), and hold it back while a call is in flight:

* a :class:`CallerTask` (an agent loop, a parallel call of one) does not stop
  while one of its calls is between its dispatch marker and its recorded
  receipt; :func:`~jixu.kernel.perform` raises the cancellation once the
  receipt is recorded;
* a :class:`ServingTask` (a stream's writer, the loop's shared commits, a
  claim's heartbeat) keeps serving while any call of its loop is in flight:
  the receipt needs its commit, and its claim.

Nothing else changes: a task with no call in flight stops at once, and the
loop's shutdown still ends once every call in flight has its receipt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class CallerTask(asyncio.Task[Any]):
    """A task that carries effects out: a loop's shutdown waits until its call in flight has its receipt.

    :meth:`cancel` made while the loop is not running and a call is in
    flight (:attr:`in_flight`) only records that the loop is going away
    (:attr:`stop_requested`).
    """

    def __init__(self, coroutine: Coroutine[Any, Any, Any], *, loop: asyncio.AbstractEventLoop | None = None,
                 name: str | None = None) -> None:
        super().__init__(coroutine, loop=loop, name=name)
        self.in_flight = 0
        """Calls of this task between their dispatch marker and their recorded receipt."""
        self.stop_requested = False
        """A loop's shutdown asked this task to stop while a call was in flight."""

    def cancel(self, msg: Any = None) -> bool:
        """Cancel, unless the loop is shutting down while a call is in flight: then stop after its receipt."""
        if self.in_flight and not self.get_loop().is_running():
            self.stop_requested = True
            return False
        return super().cancel(msg)


def calls_in_flight(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether some :class:`CallerTask` of ``loop`` has a call in flight."""
    return any(isinstance(task, CallerTask) and task.in_flight for task in asyncio.all_tasks(loop))


class ServingTask(asyncio.Task[Any]):
    """A task callers depend on to record a receipt (a writer's pump, shared commits, a heartbeat): a loop's
    shutdown leaves it running while a call of the loop is in flight."""

    def cancel(self, msg: Any = None) -> bool:
        """Cancel, unless the loop is shutting down while a call of it is in flight."""
        loop = self.get_loop()
        if not loop.is_running() and calls_in_flight(loop):
            return False
        return super().cancel(msg)


__all__ = ["CallerTask", "ServingTask", "calls_in_flight"]

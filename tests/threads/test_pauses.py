"""Provider pauses: rate limits and transient failures retry after a recorded delay, at most 3 times;
quota and authentication failures wait for an explicit resume."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jixu import Agent, ScriptedModel
from jixu.errors import ModelError, ThreadBusy
from jixu.threads.model import ModelRequest, ModelResponse
from tests.threads.conftest import Ledger, assert_same_answer, of_type, run


class FlakyModel:
    """Answers each call with the next scripted outcome: an exception to raise, or a reply."""

    name = "flaky"

    def __init__(self, outcomes: list[ModelError | str]) -> None:
        self.outcomes = outcomes
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        outcome = self.outcomes.pop(0) if self.outcomes else "done"
        if isinstance(outcome, ModelError):
            raise outcome
        return ModelResponse(text=outcome, model="flaky", stop_reason="end_turn")


def rate_limited(after: float = 0.05) -> ModelError:
    return ModelError("429 Too Many Requests", kind="rate_limit", indeterminate=False, retry_after=after)


def test_three_rate_limits_then_success_are_three_recorded_automatic_retries(ledger: Ledger) -> None:
    model = FlakyModel([rate_limited(), rate_limited(0.06), rate_limited(0.07), "finally"])
    harness = ledger.harness(Agent("a", model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("hi")
        state = await thread.wait()
        events = await thread.events()
        pauses = of_type(events, "turn.paused")
        assert [(p.data["reason"], p.data["automatic"], p.data["delay"]) for p in pauses] == [
            ("rate_limit", True, 0.05), ("rate_limit", True, 0.06), ("rate_limit", True, 0.07)]
        assert all(p.data["resume_at"] is not None for p in pauses)
        resumes = of_type(events, "turn.resumed")
        assert [r.data["reason"] for r in resumes] == ["automatic"] * 3
        # A refused call is a determinate failure: each retry is a new model effect.
        assert len({r.effect_id for r in model.requests}) == 4
        assert state.status == "idle" and state.last_reply == "finally"
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_fourth_rate_limit_pauses_instead_of_retrying(ledger: Ledger) -> None:
    model = FlakyModel([rate_limited(0.01) for _ in range(4)] + ["later"])
    harness = ledger.harness(Agent("a", model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("hi")
        state = await thread.wait()
        pauses = of_type(await thread.events(), "turn.paused")
        assert [p.data["automatic"] for p in pauses] == [True, True, True, False]
        assert len(model.requests) == 4
        assert state.status == "paused" and "rate_limit" in state.reason
        assert state.turns[-1]["pause"]["reason"] == "rate_limit"
        await assert_same_answer(harness, thread)
        state = await thread.resume(actor="ops", note="limit raised")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "later" and len(model.requests) == 5

    run(scenario())


@pytest.mark.parametrize("kind", ["quota", "authentication"])
def test_quota_and_authentication_failures_wait_for_an_explicit_resume(ledger: Ledger, kind: str) -> None:
    model = FlakyModel([ModelError(f"{kind} problem", kind=kind, indeterminate=False), "ok now"])
    harness = ledger.harness(Agent("a", model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("hi")
        state = await thread.wait()
        [pause] = of_type(await thread.events(), "turn.paused")
        assert (pause.data["reason"], pause.data["automatic"], pause.data["delay"]) == (kind, False, None)
        assert state.status == "paused" and len(model.requests) == 1
        await assert_same_answer(harness, thread)
        # Nothing bypasses the pause silently: waiting again calls nothing, sending is refused.
        state = await thread.wait()
        assert state.status == "paused" and len(model.requests) == 1
        with pytest.raises(ThreadBusy):
            await thread.send("again")
        await thread.resume(actor="ops", note="credits added")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "ok now"
        [resumed] = of_type(await thread.events(), "turn.resumed")
        assert resumed.data["reason"] == "explicit" and resumed.data["actor"] == "ops"

    run(scenario())


def test_resume_without_a_paused_turn_is_refused_and_writes_nothing(ledger: Ledger) -> None:
    harness = ledger.harness(Agent("a", ScriptedModel(["hi"])))

    async def scenario() -> None:
        thread = await harness.create_thread()
        before = len(await thread.events())
        with pytest.raises(ThreadBusy):
            await thread.resume()
        assert len(await thread.events()) == before

    run(scenario())


def test_an_automatic_pause_survives_a_reopen(ledger: Ledger) -> None:
    model = FlakyModel([rate_limited(0.3), "after the pause"])
    first = ledger.harness(Agent("a", model), owner="worker")

    async def scenario() -> None:
        thread = await first.create_thread()
        await thread.send("hi")
        # Stop the first process while it waits out the pause (its loop is cancelled, the pause is durable).
        for _ in range(100):
            if of_type(await thread.events(), "turn.paused"):
                break
            await asyncio.sleep(0.01)
        thread._task.cancel()  # type: ignore[union-attr]
        second = ledger.harness(Agent("a", model), owner="worker")
        reopened = await second.open_thread(thread.thread_id)
        state = await reopened.wait()
        assert state.status == "idle" and state.last_reply == "after the pause"
        assert [r.data["reason"] for r in of_type(await reopened.events(), "turn.resumed")] == ["automatic"]

    run(scenario())


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_an_automatic_pause_waited_out_here_shows_paused_and_a_resume_ends_it_at_once(ledger: Ledger,
                                                                                     where: str) -> None:
    """While this process waited out a rate limit's delay, every surface said the thread was ``running``; and an
    operator's resume, by this process's ``Thread.resume`` or recorded elsewhere (the HTTP API, the CLI, another
    process), left the loop asleep until the provider's time (here it then recorded a second resume)."""
    from jixu.threads.log import ThreadLog

    model = FlakyModel([rate_limited(30), "after the resume"])
    harness = ledger.harness(Agent("a", model))

    async def scenario() -> None:
        thread = await _paused_thread(harness)
        state = thread.state()
        assert thread.running and state.status == "paused", state.status
        assert "retrying automatically" in state.reason
        if where == "here":
            await thread.resume(actor="ops", note="the limit was raised")
        else:  # another connection, as the API's
            ThreadLog.load(ledger.store(), thread.thread_id).resume_turn(actor="ops", note="the limit was raised")
        state = await asyncio.wait_for(thread.wait(), 10)
        assert state.status == "idle" and state.last_reply == "after the resume"
        resumed = of_type(await thread.events(), "turn.resumed")
        assert [(r.data["reason"], r.data.get("actor")) for r in resumed] == [("explicit", "ops")]

    run(scenario())


def test_a_drain_stops_a_loop_waiting_out_an_automatic_pause_at_once(ledger: Ledger) -> None:
    """Nothing is in flight while a pause is waited out, yet a drain waited its whole timeout (9 s for `jixu serve`
    after SIGTERM). The loop now stops at once, a caller's ``wait()`` gets the paused state (not a
    CancelledError), and the next process that opens the thread waits out the rest of the pause and continues
    (``open_thread`` continued only running threads)."""
    model = FlakyModel([rate_limited(1.5), "after the pause"])
    harness = ledger.harness(Agent("a", model))

    async def scenario() -> str:
        thread = await _paused_thread(harness)
        waiting = asyncio.create_task(thread.wait())
        await asyncio.sleep(0.05)
        await asyncio.wait_for(harness.shutdown(drain_timeout=20), 5)  # not the 20 s of the drain timeout
        state = await waiting
        assert state.status == "paused", state.status
        return thread.thread_id

    thread_id = run(scenario())
    reopened = ledger.harness(Agent("a", model))

    async def after() -> None:
        thread = await reopened.open_thread(thread_id)
        state = await asyncio.wait_for(thread.wait(), 10)
        assert state.status == "idle" and state.last_reply == "after the pause"
        assert [r.data["reason"] for r in of_type(await thread.events(), "turn.resumed")] == ["automatic"]

    run(after())


async def _paused_thread(harness: Any) -> Any:
    """A new thread whose first turn was sent and has recorded its pause (its loop now waits it out)."""
    thread = await harness.create_thread()
    await thread.send("hi")
    for _ in range(200):
        if of_type(await thread.events(), "turn.paused"):
            break
        await asyncio.sleep(0.01)
    return thread

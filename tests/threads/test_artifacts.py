"""Large tool results are stored once, as content-addressed artifacts referenced from their receipts.

Before artifacts, a tool returning more than the ledger's 1 MiB payload limit
killed its turn (PayloadTooLarge on the receipt). Now the result is appended
to ``artifact/<sha256>`` first, the receipt carries ``result_artifact``, the
thread's state keeps only the reference, and every model call sees the full
text again.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from jixu.errors import ArtifactCorrupt, ArtifactNotFound, InvalidInput
from jixu.ledger import MemoryStore
from jixu.ledger.artifacts import ArtifactRef, get_text, put_text, stream_of_artifact
from jixu.threads import Agent, ScriptedModel, ToolCall, tool
from jixu.threads.thread import INLINE_RESULT_BYTES
from tests.threads.conftest import Ledger, assert_same_answer, run

BIG = {"rows": [{"id": n, "text": "ünïcode ✓ \"quoted\" \\ line\n" * 3} for n in range(30_000)]}
"""About 2.7 MB of canonical JSON: over the 1 MiB event limit, with characters JSON must escape."""


def _agent(model: ScriptedModel, calls: int = 1) -> Agent:
    @tool(semantics="read_only")
    def export() -> dict[str, Any]:
        """Export every row (a large result)."""
        return BIG

    return Agent("artifacts", model, tools=[export], max_steps=calls + 2)


def test_a_result_over_the_event_limit_is_stored_once_and_the_model_sees_all_of_it(ledger: Ledger) -> None:
    model = ScriptedModel([ToolCall("export"), ToolCall("export"), "done", "second turn"])

    async def scenario() -> None:
        harness = ledger.harness(_agent(model, calls=2))
        thread = await harness.create_thread()
        await thread.send("export twice")
        state = await assert_same_answer(harness, thread)
        assert state.status == "idle" and state.last_reply == "done"
        receipts = [e for e in await thread.events() if e.type == "tool.completed"]
        assert len(receipts) == 2 and all("result" not in e.data for e in receipts)
        refs = [ArtifactRef.from_dict(e.data["result_artifact"]) for e in receipts]
        assert refs[0] == refs[1], "the same content is one artifact"
        store = harness.store
        assert json.loads(get_text(store, refs[0])) == BIG
        assert refs[0].size > 1024 * 1024 and store.verify(stream_of_artifact(refs[0].sha256)).valid
        assert len(store.read(stream_of_artifact(refs[0].sha256))) > 1, "stored in chunks, once"
        # The state keeps the reference, not the text.
        tool_messages = [m for m in state.messages if m["role"] == "tool"]
        assert [m["artifact"] for m in tool_messages] == [refs[0].to_dict()] * 2
        assert all(len(m["content"]) < 200 for m in tool_messages)
        # The model's requests held the whole result, as an inline result's message would.
        expected = json.dumps(BIG, ensure_ascii=False, sort_keys=True)
        last = model.calls[-1]
        seen = [m for m in last.messages if m["role"] == "tool"]
        assert [m["content"] for m in seen] == [expected, expected] and all("artifact" not in m for m in seen)

        # Another process continues the thread: it reads the artifact from the store.
        other = ledger.harness(_agent(model, calls=2))
        again = await other.open_thread(thread.thread_id)
        await again.send("and now?")
        state = await again.wait()
        assert state.last_reply == "second turn"
        assert [m["content"] for m in model.calls[-1].messages if m["role"] == "tool"] == [expected, expected]

    run(scenario())


def test_a_small_result_stays_inline(ledger: Ledger) -> None:
    @tool(semantics="read_only")
    def small() -> str:
        """A result just under the inline limit."""
        return "x" * (INLINE_RESULT_BYTES - 100)

    async def scenario() -> None:
        harness = ledger.harness(Agent("inline", ScriptedModel([ToolCall("small"), "done"]), tools=[small]))
        thread = await harness.create_thread()
        await thread.send("go")
        assert (await thread.wait()).status == "idle"
        [receipt] = [e for e in await thread.events() if e.type == "tool.completed"]
        assert receipt.data["result"] == "x" * (INLINE_RESULT_BYTES - 100) and "result_artifact" not in receipt.data

    run(scenario())


def test_an_altered_artifact_stops_the_thread_before_anything_is_sent(sqlite_ledger: Ledger) -> None:
    model = ScriptedModel([ToolCall("export"), "done", "never sent"])

    async def scenario() -> None:
        harness = sqlite_ledger.harness(_agent(model))
        thread = await harness.create_thread()
        await thread.send("go")
        assert (await thread.wait()).status == "idle"
        [receipt] = [e for e in await thread.events() if e.type == "tool.completed"]
        stream = stream_of_artifact(receipt.data["result_artifact"]["sha256"])
        with sqlite3.connect(sqlite_ledger.path) as conn:
            conn.execute("DROP TRIGGER jixu_events_no_update")  # what someone with file access could do
            [(data,)] = conn.execute("SELECT data FROM jixu_events WHERE stream = ? AND seq = 1", (stream,))
            conn.execute("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = 1",
                         (data.replace("ünïcode", "unicode", 1), stream))
        calls_before = len(model.calls)
        events_before = len(await thread.events())
        fresh = sqlite_ledger.harness(_agent(model))
        reopened = await fresh.open_thread(thread.thread_id)
        await reopened.send("again")
        with pytest.raises(ArtifactCorrupt):
            await reopened.wait()
        assert len(model.calls) == calls_before, "no model call was made with a damaged conversation"
        events = await reopened.events()
        assert [e.type for e in events[events_before:]] == ["turn.started"], "no intent or marker was written"

    run(scenario())


def test_artifact_references_and_reads_are_checked() -> None:
    store = MemoryStore()
    ref = put_text(store, "héllo")
    assert ref == ArtifactRef(ref.sha256, len("héllo".encode())) and get_text(store, ref) == "héllo"
    assert put_text(store, "héllo") == ref and len(store.read(stream_of_artifact(ref.sha256))) == 1
    assert get_text(store, put_text(store, "")) == ""
    with pytest.raises(ArtifactNotFound):
        get_text(store, ArtifactRef("0" * 64, 1))
    for bad in (None, {"sha256": "abc", "size": 1}, {"sha256": "0" * 64, "size": "1"}, ["0" * 64, 1]):
        with pytest.raises(InvalidInput):
            ArtifactRef.from_dict(bad)
    with pytest.raises(InvalidInput):
        put_text(store, b"bytes")  # type: ignore[arg-type]


LONG_TEXT = "Ünïcode reply ✓ with \"quotes\" and \\ backslashes\n" * 30_000
"""About 1.5 MB: a model's text over the 1 MiB event limit."""


def test_a_long_model_text_is_stored_once_and_the_reply_and_the_next_request_hold_all_of_it(
        ledger: Ledger) -> None:
    from jixu.threads import ModelResponse

    @tool(semantics="read_only")
    def note() -> str:
        """A small call after the long answer."""
        return "noted"

    model = ScriptedModel([ModelResponse(text=LONG_TEXT, tool_calls=(ToolCall("note"),)), LONG_TEXT + "!",
                           "short"])

    async def scenario() -> None:
        harness = ledger.harness(Agent("long", model, tools=[note], max_steps=4))
        thread = await harness.create_thread()
        await thread.send("write a lot")
        state = await assert_same_answer(harness, thread)
        assert state.status == "idle" and state.last_reply == LONG_TEXT + "!"
        events = await thread.events()
        receipts = [e for e in events if e.type == "model.completed"]
        refs = [ArtifactRef.from_dict(e.data["result"]["text_artifact"]) for e in receipts]
        assert [json.loads(get_text(harness.store, ref)) for ref in refs] == [LONG_TEXT, LONG_TEXT + "!"]
        assert all(len(e.data["result"]["text"]) < 200 for e in receipts)
        [ended] = [e for e in events if e.type == "turn.ended"]
        assert ended.data["reply_artifact"] == refs[1].to_dict() and len(ended.data["reply"]) < 200
        assert all(len(e.data.get("reply") or "") < 200 for e in events)  # the text is in no thread event
        # The state keeps references; the second model call saw the whole first answer.
        assistant = [m for m in state.messages if m["role"] == "assistant"]
        assert [m["artifact"] for m in assistant] == [r.to_dict() for r in refs]
        [seen] = [m for m in model.calls[1].messages if m["role"] == "assistant"]
        assert seen["content"] == LONG_TEXT and "artifact" not in seen
        assert seen["tool_calls"] == assistant[0]["tool_calls"]

        # The record as the CLI, the API and the Studio read it gives the whole reply too.
        from jixu.threads.log import ThreadLog

        assert ThreadLog.load(harness.store, thread.thread_id).snapshot().last_reply == LONG_TEXT + "!"
        # Another process reads the reply and the conversation back from the store.
        other = ledger.harness(Agent("long", model, tools=[note], max_steps=4))
        again = await other.open_thread(thread.thread_id)
        assert again.state().last_reply == LONG_TEXT + "!"
        await again.send("and a short one")
        assert (await again.wait()).last_reply == "short"
        assert [m["content"] for m in model.calls[-1].messages if m["role"] == "assistant"][:2] == [
            LONG_TEXT, LONG_TEXT + "!"]

    run(scenario())


def test_a_model_text_just_under_the_inline_limit_stays_inline(ledger: Ledger) -> None:
    text = "y" * (INLINE_RESULT_BYTES - 100)

    async def scenario() -> None:
        harness = ledger.harness(Agent("inline", ScriptedModel([text]), max_steps=2))
        thread = await harness.create_thread()
        await thread.send("go")
        state = await thread.wait()
        assert state.last_reply == text
        [receipt] = [e for e in await thread.events() if e.type == "model.completed"]
        assert receipt.data["result"]["text"] == text and "text_artifact" not in receipt.data["result"]

    run(scenario())


def test_the_token_estimate_counts_the_stored_text_of_an_artifact_not_its_placeholder() -> None:
    from jixu.threads.compaction import estimate_tokens

    stored = {"role": "tool", "content": "[stored]", "artifact": {"sha256": "0" * 64, "size": 40_000}}
    assert estimate_tokens([stored]) == 10_000
    assert estimate_tokens([{"role": "tool", "content": "[stored]"}]) == 2


def test_a_model_text_of_characters_json_must_escape_is_measured_by_its_encoding(ledger: Ledger) -> None:
    """12,000 control characters are 72,000 bytes of canonical JSON (\\u0001 each): over the inline limit."""
    text = "\x01" * 12_000

    async def scenario() -> None:
        harness = ledger.harness(Agent("escaped", ScriptedModel([text]), max_steps=2))
        thread = await harness.create_thread()
        await thread.send("go")
        assert (await thread.wait()).last_reply == text
        [receipt] = [e for e in await thread.events() if e.type == "model.completed"]
        assert "text_artifact" in receipt.data["result"]

    run(scenario())


def test_the_artifact_scan_of_a_growing_conversation_sees_every_new_reference() -> None:
    """Only the messages added since the last model call are scanned, unless the conversation was spliced."""
    from jixu.threads import Harness

    async def scenario() -> None:
        harness = Harness(_agent(ScriptedModel(["done"])), MemoryStore())
        thread = await harness.create_thread()
        plain: list[dict[str, Any]] = [{"role": "user", "content": str(n)} for n in range(6)]
        ref = {"role": "tool", "content": "[stored]", "artifact": {"sha256": "0" * 64, "size": 1}}
        messages = list(plain)
        assert not thread._refers_to_artifacts(messages)
        messages.append(dict(plain[0]))
        assert not thread._refers_to_artifacts(messages)  # scanned from the 7th on
        messages.append(ref)
        assert thread._refers_to_artifacts(messages)
        # A compaction splices a summary over the head, then the conversation grows past its old length:
        # the reference that moved into the scanned range must still be seen.
        messages = list(plain)
        assert not thread._refers_to_artifacts(messages)
        messages[0:4] = [{"role": "user", "content": "summary"}]
        messages.extend([ref, dict(plain[1]), dict(plain[2]), dict(plain[3])])
        assert len(messages) > len(plain) and messages.index(ref) < len(plain)
        assert thread._refers_to_artifacts(messages)
        assert not thread._refers_to_artifacts(list(plain)), "another list is scanned whole"
        assert not thread._refers_to_artifacts([])

    run(scenario())


def test_the_artifact_scan_knows_a_message_rebuilt_from_the_same_event_by_its_source() -> None:
    """A receipt taken back and applied again (decision 0019) rebuilds its message as a new dict: with the
    messages' source events the scan still goes on from there, and a different event in place rescans."""
    from jixu.threads import Harness

    async def scenario() -> None:
        harness = Harness(_agent(ScriptedModel(["done"])), MemoryStore())
        thread = await harness.create_thread()
        messages: list[dict[str, Any]] = [{"role": "user", "content": str(n)} for n in range(6)]
        sources = [f"event-{n}" for n in range(6)]
        assert not thread._refers_to_artifacts(messages, sources)
        # Taken back and applied again: the last message is a new, equal dict from the same event.
        messages[5] = dict(messages[5])
        messages.append({"role": "user", "content": "6"})
        sources.append("event-6")
        # A reference planted in the scanned part (never done by the reducer) proves the scan went on
        # from the 7th message instead of starting over.
        messages[2]["artifact"] = {"sha256": "0" * 64, "size": 1}
        assert not thread._refers_to_artifacts(messages, sources)
        messages.append({"role": "tool", "content": "[stored]", "artifact": {"sha256": "1" * 64, "size": 1}})
        sources.append("event-7")
        assert thread._refers_to_artifacts(messages, sources)
        # Another event in the last scanned place (a reload after a failed shared append): scanned whole.
        del messages[7:], sources[7:], messages[2]["artifact"]
        assert not thread._refers_to_artifacts(messages, sources)
        messages[2]["artifact"] = {"sha256": "0" * 64, "size": 1}
        messages[6], sources[6] = {"role": "user", "content": "other"}, "event-other"
        assert thread._refers_to_artifacts(messages, sources), "the planted reference is found by a full scan"
        # Sources that do not line up with the messages are not trusted: the message's identity decides.
        del messages[2]["artifact"]
        assert not thread._refers_to_artifacts(messages, sources[:-1])
        messages[2]["artifact"] = {"sha256": "0" * 64, "size": 1}
        messages[6] = dict(messages[6])
        assert thread._refers_to_artifacts(messages, sources[:-1]), "a new dict without its source: scanned whole"

    run(scenario())

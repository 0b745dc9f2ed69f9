"""Request ids on mutations: a replay returns the original response, a changed body is refused.

Every mutating endpoint accepts an ``Idempotency-Key`` header (the request
id: 1-100 of ``A-Z a-z 0-9 . _ : = + -``). Its record is the ledger stream
``idempotency/<token_id>/<request_id>`` (so one caller's ids never collide with
another's), written in three steps:

- ``idempotency.started`` (method, path, the body's canonical hash, actor) is
  appended *before* the operation, with an expected seq, so two concurrent
  requests with one id cannot both run it;
- ``idempotency.answered`` (status and response body) after a success, which
  every later request with the same id and body gets back unchanged (a body too
  large for one event is kept as an artifact, ``body_artifact`` its reference);
- ``idempotency.released`` after a typed error (nothing was changed), so the
  caller may try the same id again.

A different method, path or body with a used id is refused (422,
``request_id_reused``). A request whose ``idempotency.started`` has neither a
completion nor a release was interrupted (or is still running): its outcome is
unknown, and it is answered with 409 ``request_in_progress`` instead of being
guessed; inspect the resource and use a new id. Records survive restarts
because they are events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jixu.errors import (
    ArtifactCorrupt,
    ArtifactNotFound,
    ConcurrencyError,
    InvalidInput,
    JixuError,
    PayloadTooLarge,
    StreamCorrupt,
)
from jixu.kernel import record
from jixu.ledger import NewEvent, Store, content_hash
from jixu.ledger.artifacts import ArtifactRef, get_text, put_text
from jixu.ledger.encoding import canonical_text
from jixu.server.problems import REQUEST_ID_REUSED, REQUEST_IN_PROGRESS, HTTPProblem, status_of

HEADER = "Idempotency-Key"
REQUEST_PREFIX = "idempotency/"
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:=+-]{1,100}$")


@dataclass(frozen=True)
class Outcome:
    """What an operation answered: HTTP status and JSON body."""

    status: int
    body: Any
    replayed: bool = False


def request_stream(token_id: str, request_id: str) -> str:
    """The ledger stream recording one caller's request id."""
    return f"{REQUEST_PREFIX}{token_id}/{request_id}"


def check_request_id(request_id: str) -> str:
    """Return ``request_id`` if usable (typed error naming the header otherwise)."""
    if not REQUEST_ID_PATTERN.match(request_id):
        raise InvalidInput(f"{HEADER} {request_id[:120]!r} must be 1-100 of A-Z a-z 0-9 . _ : = + -",
                           field=HEADER)
    return request_id


def fingerprint(method: str, path: str, body: Any) -> str:
    """The hash that identifies a request's content: method, path and the canonical JSON body."""
    return content_hash({"method": method, "path": path, "body": body})


def run_once(store: Store, token_id: str, request_id: str | None, *, method: str, path: str, body: Any,
             actor: str, operation: Callable[[], Outcome]) -> Outcome:
    """Run ``operation`` at most once per request id (see the module docstring); no id: just run it."""
    if request_id is None:
        return operation()
    check_request_id(request_id)
    stream = request_stream(token_id, request_id)
    digest = fingerprint(method, path, body)
    events = store.read(stream)
    if events:
        _refuse_if_broken(store, stream, request_id)
        replay = _answer_from(store, events, request_id, digest, method, path)
        if replay is not None:
            return replay
    meta = {"actor": actor}
    try:
        record(store, stream, [NewEvent("idempotency.started", {"request_id": request_id, "method": method,
                                                           "path": path, "body_hash": digest, "actor": actor},
                                       meta)], len(events))
    except ConcurrencyError:
        # Another request with this id got there first: answer as it did, or as "in progress".
        replay = _answer_from(store, store.read(stream), request_id, digest, method, path)
        if replay is not None:
            return replay
        raise HTTPProblem(REQUEST_IN_PROGRESS, f"request {request_id} is being handled by another call",
                          request_id=request_id) from None
    seq = len(events) + 1
    try:
        outcome = operation()
    except JixuError as error:
        status = error.status if isinstance(error, HTTPProblem) else status_of(error)
        # Typed errors change nothing, so the id is free again; a store failure here leaves the id in progress.
        record(store, stream, [NewEvent("idempotency.released", {"request_id": request_id, "status": status,
                                                            "code": error.code}, meta)], seq)
        raise
    answered = {"request_id": request_id, "status": outcome.status}
    try:
        record(store, stream, [NewEvent("idempotency.answered", {**answered, "body": outcome.body}, meta)], seq)
    except PayloadTooLarge:
        # The operation is done: its answer (which may repeat what it stored, plus summaries) is kept as an
        # artifact, never refused (a 4xx after a mutation that was made, and the id in progress for good).
        ref = put_text(store, canonical_text(outcome.body, path="body"))
        record(store, stream, [NewEvent("idempotency.answered", {**answered, "body_artifact": ref.to_dict()},
                                        meta)], seq)
    return outcome


def _refuse_if_broken(store: Store, stream: str, request_id: str) -> None:
    """:class:`~jixu.errors.StreamCorrupt` (409) when the request id's record does not verify: its stored answer
    is not replayed (it may not be the one given), and the request is not run again (it may have been)."""
    report = store.verify(stream)
    if not report.valid:
        raise StreamCorrupt(f"the record of request id {request_id} does not verify (first bad event "
                            f"#{report.first_bad_seq}, {report.reason}): its answer is not replayed and the request "
                            "is not run again. Inspect the resource, then use a new request id",
                            request_id=request_id, first_bad_seq=report.first_bad_seq, reason=report.reason)


def _answer_from(store: Store, events: list[Any], request_id: str, digest: str, method: str, path: str) -> Outcome | None:
    """The stored answer for a repeat, ``None`` when the id is free, or a problem (reused id, in progress)."""
    last = events[-1]
    if last.type == "idempotency.released":
        return None
    started = next(e for e in reversed(events) if e.type == "idempotency.started")
    if started.data.get("body_hash") != digest:
        raise HTTPProblem(REQUEST_ID_REUSED, f"request id {request_id} was used for {started.data.get('method')} "
                                             f"{started.data.get('path')} with another body; use a new id for a "
                                             "new request", field=HEADER, request_id=request_id,
                          first_method=started.data.get("method"), first_path=started.data.get("path"),
                          method=method, path=path)
    if last.type == "idempotency.answered":
        kept = last.data.get("body_artifact")
        try:
            body = json.loads(get_text(store, ArtifactRef.from_dict(kept))) if isinstance(kept, dict) \
                else last.data.get("body")
        except (ArtifactNotFound, ArtifactCorrupt) as lost:
            raise StreamCorrupt(f"request id {request_id} was answered, but its stored answer cannot be read "
                                f"({lost.message}): the request is not run again (it was made). Inspect the "
                                "resource, then use a new request id", request_id=request_id) from None
        return Outcome(int(last.data["status"]), body, replayed=True)
    raise HTTPProblem(REQUEST_IN_PROGRESS, f"request {request_id} started at {started.recorded_at} and has no "
                                           "recorded outcome (it is still running, or its server stopped): its "
                                           "effect is unknown, so it is not repeated. Inspect the resource, then "
                                           "use a new request id", request_id=request_id,
                      started_at=started.recorded_at)


__all__ = ["HEADER", "REQUEST_ID_PATTERN", "REQUEST_PREFIX", "Outcome", "check_request_id", "fingerprint",
           "request_stream", "run_once"]

"""``/api/v1/threads``: create threads, send input, read state and events (paged and live), decide.

Every thread belongs to the project recorded in its metadata at creation.
Inputs are queued turns (:func:`jixu.scheduling.submit_turn`): a worker (the
server's own, with ``jixu serve --agent``, or ``jixu worker``) runs them.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from jixu.errors import InvalidInput, JixuError, ProjectNotFound, ThreadNotFound
from jixu.ledger import Event, Store, is_valid_id
from jixu.ledger.chain import verify_rows
from jixu.scheduling import (
    create_thread_for,
    enqueue_thread,
    project_of,
    submit_turn,
    thread_work_key,
)
from jixu.scheduling.queue import check_project
from jixu.server.auth import authenticate
from jixu.server.context import Authenticated, Context, Services, context, mutation, principal, services
from jixu.server.idempotency import Outcome
from jixu.server.models import (
    ID,
    READ,
    WRITE,
    CreateThread,
    Decision,
    EffectDecided,
    EffectId,
    EventPage,
    ForkThread,
    InputQueued,
    InterruptTurn,
    RecoverTurn,
    ResolveOutcome,
    SendInput,
    ThreadCreated,
    ThreadDetail,
    ThreadForked,
    ThreadId,
    ThreadPage,
    ThreadState,
    ThreadSummary,
    TurnId,
    TurnInterrupted,
    TurnRecovered,
    Verification,
)
from jixu.server.problems import error_response
from jixu.threads.log import THREAD_PREFIX, ThreadLog, stream_of

router = APIRouter(prefix="/threads", tags=["threads"], route_class=Authenticated)
MAX_PAGE = 1000
KEEPALIVE_SECONDS = 15.0
PROJECTS_REMEMBERED = 1_000_000
MAX_SEQ = 2**53 - 1
"""The largest seq the API accepts: every JSON reader keeps it exact, and ``seq + MAX_PAGE`` fits every store's
integers (SQLite and PostgreSQL stop at 2**63 - 1). A larger one is 422, never a store error."""
_SEQ_TEXT = re.compile(r"[0-9]{1,16}")
SEQ_PATTERN = r"^[0-9]{1,15}$"
"""A seq as the published document declares it (within :data:`MAX_SEQ`: what the server accepts is a little wider)."""


def parse_seq(text: str, field: str) -> int:
    """``text`` as a seq: ASCII digits only (``str.isdigit`` also accepts ``²``, which ``int`` refuses), at most
    :data:`MAX_SEQ`; 422 naming ``field`` otherwise."""
    value = text.strip()
    if not _SEQ_TEXT.fullmatch(value) or int(value) > MAX_SEQ:
        raise InvalidInput(f"{field} must be a seq: a non-negative integer of ASCII digits, at most {MAX_SEQ}",
                           field=field)
    return int(value)


def _hidden(thread_id: str) -> ThreadNotFound:
    return ThreadNotFound(f"no thread {thread_id}", thread_id=thread_id)


FIRST_EVENTS = frozenset(("thread.created", "thread.forked"))
"""What a thread's first event is: it names the thread's project (in its metadata)."""
UNKNOWN_PROJECT = ""
"""The project of a thread whose first event does not hold and that the store's project index names no project
for: no project token's (no project is named so), so only an admin sees the thread, as ``corrupt``."""


def first_event(store: Store, stream: str, genesis_hash: str) -> Event | None:
    """The first event of the thread stored as ``stream`` when it holds (its own hash, its link from
    ``genesis_hash`` and to the second event) and is a thread's first (:data:`FIRST_EVENTS`); else None: one that
    was deleted, replaced or changed says nothing about the thread (its project, its parent)."""
    rows = list(store.read_rows(stream, 1, 2))
    if not rows or rows[0].type not in FIRST_EVENTS or not verify_rows(stream, rows, genesis_hash=genesis_hash).valid:
        return None
    return rows[0].to_event()


def project_of_stream(services: Services, stream: str) -> str | None:
    """The project of the thread stored as ``stream`` (None: no such thread), read from its first event once per
    server: the first event never changes, so neither does the answer (remembered for up to
    :data:`PROJECTS_REMEMBERED` threads). Every surface (the API, the Studio) takes a thread's project here.

    The first event is trusted only when it holds (:func:`first_event`). One that was deleted, replaced or
    changed says nothing: the thread is then the project's the store indexed it under when it was created (the one
    whose listing names it), else :data:`UNKNOWN_PROJECT`. A changed ``metadata.project`` never moves a thread to
    another project."""
    known = services.thread_projects.get(stream)
    if known is not None:
        return known
    store = services.store
    info = store.stream_info(stream)
    if info is None:
        return None
    first = first_event(store, stream, info.genesis_hash)
    if first is None:
        try:
            return check_project(info.group) if info.group is not None else UNKNOWN_PROJECT
        except InvalidInput:
            return UNKNOWN_PROJECT
    metadata = first.data.get("metadata")
    found = project_of(metadata if isinstance(metadata, dict) else {})
    _remember_project(services, stream, found)
    return found


def _remember_project(services: Services, stream: str, project: str) -> None:
    if len(services.thread_projects) >= PROJECTS_REMEMBERED:
        services.thread_projects.clear()
    services.thread_projects[stream] = project


def thread_project(ctx: Context, thread_id: str) -> str:
    """The project of a thread (404 when it does not exist); nothing about it is revealed."""
    if not is_valid_id(thread_id):
        raise InvalidInput(f"thread id {thread_id!r} is not a valid id", field="thread_id")
    found = project_of_stream(ctx.services, stream_of(thread_id))
    if found is None:
        raise _hidden(thread_id)
    return found


def authorize(ctx: Context, thread_id: str, role: str) -> str:
    """Allow the caller ``role`` on a thread (404 outside its projects, 403 when the role is too weak)."""
    project = thread_project(ctx, thread_id)
    ctx.principal.require(project, role, _hidden(thread_id))
    return project


def summary(log: ThreadLog) -> dict[str, Any]:
    """The thread after a decision: id, status, reason, head."""
    state = log.snapshot()
    return {"thread_id": state.thread_id, "status": state.status, "reason": state.reason, "seq": state.seq,
            "head_hash": state.head_hash}


def wake(ctx: Context, thread_id: str) -> None:
    """Put a thread workers run back in the queue, so a decision is acted on."""
    if ctx.store.get_work(thread_work_key(thread_id)) is not None:
        enqueue_thread(ctx.store, thread_id)


def state_dict(log: ThreadLog, project: str) -> dict[str, Any]:
    """A thread's full state with its project and who owns its active turn."""
    state = log.snapshot().to_dict()
    state["project"] = project
    state["ownership"] = log.ownership()
    return state


@router.post("", status_code=201, responses=WRITE, response_model=ThreadCreated, summary="Create a thread in a project")
def create_thread(body: CreateThread, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record a new idle thread of the server's agent in ``project`` (editor)."""
    ctx.principal.require(body.project, "editor", ProjectNotFound(f"no project {body.project}",
                                                                  project=body.project))

    def operation() -> Outcome:
        agent = ctx.services.require_agent()
        thread_id = create_thread_for(ctx.store, agent, project=body.project, metadata=body.metadata,
                                      actor=ctx.actor)
        _remember_project(ctx.services, stream_of(thread_id), body.project)  # what its first event just recorded
        log = ThreadLog.load(ctx.store, thread_id)
        return Outcome(201, {**summary(log), "project": body.project, "agent": log.state.agent.get("name")})

    return ctx.mutate(body, operation)


@router.get("", responses=READ, response_model=ThreadPage, summary="List threads")
def list_threads(ctx: Annotated[Context, Depends(context)],
                 project: Annotated[str | None, Query(max_length=100)] = None,
                 after: Annotated[str | None, Query(pattern=r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")] = None,
                 limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> JSONResponse:
    """Threads the caller may see (of ``project``), oldest first, ``limit`` per page after thread ``after``.

    The store finds them by its index of threads by project (:meth:`jixu.ledger.Store.list_streams` with
    ``projects``), so a page costs what the caller may see: at most ``limit`` threads of each of its projects are
    read, whatever else the store holds. Only an admin without ``project`` pages through every thread.
    """
    if project is not None and not ctx.principal.visible(project):
        return JSONResponse({"threads": [], "next_after": None})  # a project the caller has no role in: nothing
    cursor = THREAD_PREFIX + after if after else ""
    if ctx.principal.admin and project is None:
        page = ctx.store.list_streams(THREAD_PREFIX, after=cursor, limit=limit)
    else:
        wanted = [project] if project is not None else sorted(ctx.principal.roles)
        page = ctx.store.list_streams(THREAD_PREFIX, after=cursor, limit=limit, groups=wanted)
    rows = [{"thread_id": info.stream[len(THREAD_PREFIX):], "project": info.group or _unindexed_project(ctx, info.stream),
             "events": info.head_seq, "head_hash": info.head_hash, "created_at": info.created_at} for info in page]
    return JSONResponse({"threads": rows, "next_after": rows[-1]["thread_id"] if len(rows) == limit else None})


def _unindexed_project(ctx: Context, stream: str) -> str:
    """The project of a thread the index has none for (its metadata names no usable project): only an admin's
    listing shows such a thread, with what its metadata says, or ``""``."""
    try:
        return project_of_stream(ctx.services, stream) or ""
    except JixuError:
        return ""


@router.get("/{thread_id}", responses=READ, response_model=ThreadDetail, summary="A thread's state")
def get_thread(thread_id: ThreadId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """The thread's state: status, turns, messages, the resolver's decision on every effect, turn ownership.

    The whole history is verified first (O(events)): a thread whose history does not hold is ``corrupt``, with
    ``corruption`` naming the first bad seq and the reason, as on every other surface.
    """
    project = authorize(ctx, thread_id, "viewer")
    return JSONResponse(state_dict(ThreadLog.load(ctx.store, thread_id, verify=True), project))


@router.post("/{thread_id}/inputs", status_code=202, responses=WRITE, response_model=InputQueued,
             summary="Send input (starts a turn)")
def send_input(thread_id: ThreadId, body: SendInput, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Queue a turn with the user's input for a worker (editor); 409 while a turn is active or it waits."""
    authorize(ctx, thread_id, "editor")

    def operation() -> Outcome:
        turn_id = submit_turn(ctx.store, thread_id, body.input, actor=ctx.actor)
        return Outcome(202, {"thread_id": thread_id, "turn_id": turn_id, "queued": True})

    return ctx.mutate(body, operation)


@router.post("/{thread_id}/resume", responses=WRITE, response_model=ThreadSummary, summary="Resume a paused turn")
def resume_thread(thread_id: ThreadId, body: Decision, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record an explicit resume of a turn paused for quota or authentication (editor)."""
    authorize(ctx, thread_id, "editor")

    def operation() -> Outcome:
        log = ThreadLog.load(ctx.store, thread_id, actor=ctx.actor)
        log.resume_turn(actor=ctx.actor, note=body.note)
        wake(ctx, thread_id)
        return Outcome(200, summary(log))

    return ctx.mutate(body, operation)


@router.post("/{thread_id}/interrupt", responses=WRITE, response_model=TurnInterrupted,
             summary="Interrupt the turn in progress")
def interrupt_thread(thread_id: ThreadId, body: InterruptTurn,
                     ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Stop the thread's turn (editor): ended at once when no process runs it, else asked of the process that
    does, which ends it at its next step (what it has in flight finishes and is recorded). 409 ``no_active_turn``
    without a turn; a durable run of code is refused (its code stops it)."""
    authorize(ctx, thread_id, "editor")

    def operation() -> Outcome:
        log = ThreadLog.load(ctx.store, thread_id, actor=ctx.actor)
        outcome = log.interrupt(actor=ctx.actor, reason=body.reason)
        state = log.snapshot()
        return Outcome(200, {"thread_id": thread_id, "outcome": outcome, "status": state.status,
                             "reason": state.reason})

    return ctx.mutate(body, operation)


@router.get("/{thread_id}/events", responses=READ, response_model=EventPage, summary="A page of a thread's events")
def list_events(thread_id: ThreadId, ctx: Annotated[Context, Depends(context)],
                after_seq: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
                limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> JSONResponse:
    """Events with ``seq > after_seq``, at most ``limit``; ``next_after_seq`` continues the listing;
    ``corruption`` is the thread's verdict, as ``GET /threads/{id}`` gives it (the whole history verified)."""
    authorize(ctx, thread_id, "viewer")
    stream = stream_of(thread_id)
    known = ThreadLog.load(ctx.store, thread_id, verify=True).corruption()
    events = ctx.store.read(stream, after_seq + 1, after_seq + limit)
    info = ctx.store.stream_info(stream)
    return JSONResponse({"thread_id": thread_id, "events": [e.to_dict() for e in events],
                         "next_after_seq": events[-1].seq if events else after_seq,
                         "head_seq": info.head_seq if info else 0,
                         "corruption": known.to_dict() if known is not None else None})


def sse(event: Event) -> str:
    """One server-sent event: ``id`` is the seq (resume with Last-Event-ID), ``event`` the event type."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {json.dumps(event.to_dict(), ensure_ascii=False)}\n\n"


def sse_problem(error: JixuError, instance: str) -> str:
    """The last server-sent event of a stream its caller may no longer read: ``event: problem``, the problem
    document as data (no ``id``: a client resumes from the last event it did get)."""
    response = error_response(error, instance)
    return f"event: problem\ndata: {bytes(response.body).decode('utf-8')}\n\n"


@router.get("/{thread_id}/events/stream", responses={**READ, 200: {"content": {"text/event-stream": {}},
                                                                    "description": "Server-sent events."}},
            summary="Live stream of a thread's events (SSE)")
async def stream_events(thread_id: ThreadId, request: Request,
                        after_seq: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
                        timeout: Annotated[float, Query(gt=0, le=3600)] = 3600,
                        last_event_id: Annotated[str | None, Header(json_schema_extra={"pattern": SEQ_PATTERN})] = None,
                        ) -> StreamingResponse:
    """Every event after ``after_seq`` (or the ``Last-Event-ID`` seq), then new ones as they are appended.

    Everything is checked before the 200: the caller, its role, the seq to start after. The stream ends after
    ``timeout`` seconds, when the server shuts down, or, with a last ``problem`` event, when the caller may no
    longer read the thread (its token revoked): that is checked again every few seconds. A comment line every
    15 s keeps proxies from closing it.
    """
    found = services(request)
    caller = await asyncio.to_thread(principal, request)
    ctx = Context(request, found, caller)
    await asyncio.to_thread(authorize, ctx, thread_id, "viewer")
    start = after_seq
    if start is None and last_event_id:
        start = parse_seq(last_event_id, "Last-Event-ID")
    stream = stream_of(thread_id)
    authorization = request.headers.get("authorization")

    def still_allowed() -> JixuError | None:
        """Why the caller may no longer read the thread (None: it still may)."""
        try:
            again = Context(request, found, authenticate(found.store, authorization))
            authorize(again, thread_id, "viewer")
        except JixuError as error:
            return error
        return None

    async def events() -> AsyncIterator[str]:
        seq = start or 0
        now = time.monotonic()
        deadline, quiet_since, checked_at = now + timeout, now, now
        while time.monotonic() < deadline and not found.closing.is_set() and not await request.is_disconnected():
            if time.monotonic() - checked_at >= found.stream_recheck_interval:
                refused = await asyncio.to_thread(still_allowed)
                if refused is not None:
                    yield sse_problem(refused, request.url.path)
                    return
                checked_at = time.monotonic()
            batch = await asyncio.to_thread(found.store.read, stream, seq + 1, seq + MAX_PAGE)
            for event in batch:
                yield sse(event)
                seq = event.seq
            if batch:
                quiet_since = time.monotonic()
                continue
            if time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
            await asyncio.sleep(found.stream_poll_interval)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/{thread_id}/verify", responses=READ, response_model=Verification,
            summary="Verify a thread's hash chain and effects")
def verify_thread(thread_id: ThreadId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """Recompute the whole chain, check the effects are consistent and re-project the checkpoint; ``valid`` is
    all three (``corruption``: the thread's verdict; ``checkpoint``: what re-projecting its checkpoint found)."""
    authorize(ctx, thread_id, "viewer")
    return JSONResponse(ThreadLog.load(ctx.store, thread_id, verify=True).verification())


@router.get("/{thread_id}/replay", responses=READ, response_model=ThreadState,
            summary="Rebuild the state from events alone")
def replay_thread(thread_id: ThreadId, ctx: Annotated[Context, Depends(context)],
                  upto: Annotated[str | None, Query(max_length=40, description="A seq or an event id",
                                                    json_schema_extra={"pattern": f"^[1-9][0-9]{{0,14}}$|{ID}"})] = None,
                  ) -> JSONResponse:
    """The state rebuilt from the events (up to ``upto``) by the pure projection; no driver is called."""
    authorize(ctx, thread_id, "viewer")
    log = ThreadLog.load(ctx.store, thread_id)
    point: int | str | None = upto
    if upto is not None and not is_valid_id(upto) and upto.strip().isdigit():  # digits of any script: a seq or 422
        point = parse_seq(upto, "upto")
    return JSONResponse(log.replay(point).to_dict())


@router.post("/{thread_id}/fork", status_code=201, responses=WRITE, response_model=ThreadForked,
             summary="Fork a thread at an event")
def fork_thread(thread_id: ThreadId, body: ForkThread, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """A child thread with this thread's state at event ``at``, in the same project (editor)."""
    project = authorize(ctx, thread_id, "editor")

    def operation() -> Outcome:
        log = ThreadLog.load(ctx.store, thread_id, actor=ctx.actor)
        # The child's queued turn and its queue row in one transaction: a crash never leaves one without the other.
        child = log.fork(body.at, input=body.input, enqueue=lambda child_id: (thread_work_key(child_id), project))
        turn = child.state.active_turn()
        return Outcome(201, {**summary(child), "project": project, "parent": child.state.parent,
                             "turn_id": turn.turn_id if turn else None})

    return ctx.mutate(body, operation)


@router.post("/{thread_id}/effects/{effect_id}/resolve", responses=WRITE, response_model=EffectDecided,
             summary="Resolve an effect whose outcome is unknown")
def resolve_effect(thread_id: ThreadId, effect_id: EffectId, body: ResolveOutcome,
                   ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record an operator's decision (occurred, not_occurred, abandoned_unknown) about an unknown effect."""
    authorize(ctx, thread_id, "operator")

    def operation() -> Outcome:
        log = ThreadLog.load(ctx.store, thread_id, actor=ctx.actor)
        recorded = log.resolve(effect_id, body.resolution, resolution_id=body.resolution_id, note=body.note,
                               actor=ctx.actor, evidence=body.evidence, result=body.result)
        wake(ctx, thread_id)
        return Outcome(200, {"recorded": recorded, "effect": log.analysis().decisions[effect_id].to_dict(),
                             "thread": summary(log)})

    return ctx.mutate(body, operation)


def _decide(ctx: Context, thread_id: str, effect_id: str, phase: str, body: Decision) -> JSONResponse:
    authorize(ctx, thread_id, "operator")

    def operation() -> Outcome:
        log = ThreadLog.load(ctx.store, thread_id, actor=ctx.actor)
        log.decide_parked(effect_id, phase, actor=ctx.actor, note=body.note)
        wake(ctx, thread_id)
        return Outcome(200, {"recorded": True, "effect": log.analysis().decisions[effect_id].to_dict(),
                             "thread": summary(log)})

    return ctx.mutate(body, operation)


@router.post("/{thread_id}/effects/{effect_id}/approve", responses=WRITE, response_model=EffectDecided,
             summary="Approve a parked call")
def approve_effect(thread_id: ThreadId, effect_id: EffectId, body: Decision,
                      ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Approve a call parked for approval (operator); a worker then dispatches it."""
    return _decide(ctx, thread_id, effect_id, "approved", body)


@router.post("/{thread_id}/effects/{effect_id}/deny", responses=WRITE, response_model=EffectDecided,
             summary="Deny a parked call")
def deny_effect(thread_id: ThreadId, effect_id: EffectId, body: Decision,
                ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Deny a call parked for approval (operator); the model is told."""
    return _decide(ctx, thread_id, effect_id, "denied", body)


@router.post("/{thread_id}/turns/{turn_id}/recover", responses=WRITE, response_model=TurnRecovered,
             summary="Recover an expired turn")
def recover_turn(thread_id: ThreadId, turn_id: TurnId, body: RecoverTurn,
                 ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Fence out the owner of an expired turn and record a recovery receipt (editor); nothing is retried."""
    authorize(ctx, thread_id, "editor")

    def operation() -> Outcome:
        log = ThreadLog.load(ctx.store, thread_id, actor=ctx.actor)
        replay = log.state.recovery(body.request_id) is not None
        receipt = log.recover_turn(turn_id, request_id=body.request_id, expected_epoch=body.expected_epoch,
                                   legacy_confirmed_stopped=body.legacy_confirmed_stopped, actor=ctx.actor,
                                   note=body.note)
        wake(ctx, thread_id)
        return Outcome(200, {"recorded": not replay, "receipt": receipt, "thread": summary(log)})

    return ctx.mutate(body, operation)


__all__ = ["authorize", "router", "thread_project"]

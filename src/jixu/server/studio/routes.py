"""The Studio's pages and form posts under ``/studio``.

Pages are rendered on the server (Jinja2, autoescaped). Posts are plain HTML
forms: each checks the session's CSRF token, then performs the *same*
operation as the HTTP API by calling its route functions with the caller's
:class:`~jixu.server.context.Context` — so authorization (403 for a role that
is too weak, 404 outside the caller's projects), validation and the wake-up
of workers are the API's own.

Every post answers ``303 See Other`` to a page (Post/Redirect/Get, decision
0038): on success with ``?done=<what>``, on refusal with ``?flash=<id>``: the
page shows what the server refused and why (for example the 409 of a
reconciliation without proof, explained in place) and refills what was
typed. A page is only ever a GET, so a reload, a live update or the back
button never sends a form again. Live pages follow the thread's events over a
server-sent stream (``/studio/threads/{id}/events/stream``) and update their
parts in place; they never reload.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from importlib import resources
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError

from jixu.errors import InvalidInput, JixuError, NotFound
from jixu.ledger import Store
from jixu.ledger.trust import verdict
from jixu.server import runs as runs_api
from jixu.server import threads as threads_api
from jixu.server.auth import Principal
from jixu.server.context import Context, run_async, services
from jixu.server.models import (
    CancelRun,
    Decision,
    ForkThread,
    Handoff,
    Inspect,
    InterruptTurn,
    RecoverTurn,
    ResolveOutcome,
    ResolveRequest,
    ResumeRun,
    RetryRun,
    SendInput,
)
from jixu.server.problems import HTTPProblem, status_of
from jixu.server.studio import views
from jixu.server.studio.flash import Flash, flashes
from jixu.server.studio.session import (
    CSRF_FIELD,
    check_token,
    clear_session,
    csrf_token,
    end_session,
    read_form,
    require_csrf,
    same_origin,
    session_principal,
    session_token,
    set_session,
)
from jixu.threads.log import stream_of
from jixu.threads.projection import ThreadProjection

PREFIX = "/studio"
STATIC = {"studio.css": "text/css; charset=utf-8", "studio.js": "text/javascript; charset=utf-8",
          "icon.svg": "image/svg+xml"}
# Scripts and styles come only from /studio/static: no inline script can run, forms post only here.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NOTICES = {
    "resolved": "Resolution recorded. A worker continues the thread if nothing else is open.",
    "approved": "Approved: a worker dispatches the call.",
    "denied": "Denied: nothing was sent, and the model is told.",
    "sent": "Input queued: a worker runs the turn.",
    "forked": "Forked: this is the child thread.",
    "thread_resumed": "Resumed: a worker continues the paused turn.",
    "turn_interrupted": "Interrupted: no process ran the turn; it is ended.",
    "interrupt_requested": "Interrupt recorded: the process running the turn ends it at its next step (what it has "
                           "in flight finishes and is recorded).",
    "turn_recovered": "Recovered: the former owner is fenced out and the receipt recorded. Nothing was retried; "
                      "reconcile the turn's open effects to continue it.",
    "resumed": "Resumed: the workspace was reconciled and the run is queued for a worker.",
    "handed_off": "Handed off: a new provider snapshot and plan revision were recorded.",
    "retried": "Retried: this is the new run.",
    "cancelled": "Cancelled.",
    "reconciled": "Reconciled: the retained evidence settled the request.",
    "inspected": "Inspected: what the provider shows now is retained in the request (nothing was changed there).",
    "request_resolved": "Resolution recorded: it cites the latest inspection.",
}
LOGIN_REASONS = {
    "session": "Your session has ended (or was never started): log in again. The form you sent was not carried "
               "out; nothing was recorded.",
}
FIELD_LABELS = {"note": "Note", "resolution": "What happened", "input": "Message", "reason": "Reason",
                "agent": "Provider", "at": "Fork point", "reconciliation_id": "Reconciliation id",
                "resolution_id": "Resolution id", "request_id": "Request id", "expected_epoch": "Epoch",
                "legacy_confirmed_stopped": "Process stopped"}
STREAM_SECONDS = 600.0
"""A page's event stream ends after this long; the browser's EventSource then opens it again by itself."""
KEEPALIVE_SECONDS = 15.0

_env = Environment(loader=PackageLoader("jixu.server.studio", "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True), trim_blocks=True,
                   lstrip_blocks=True)

router = APIRouter(prefix=PREFIX, include_in_schema=False)


def _owner(principal: Principal | None) -> str:
    """Whom a flash belongs to: the token of the session that posted (``""`` before logging in)."""
    return principal.token_id if principal is not None else ""


def _render(request: Request, template: str, http_status: int = 200, /, **values: Any) -> HTMLResponse:
    principal: Principal | None = values.pop("principal", None)
    token = session_token(request) if principal is not None else None
    notice = NOTICES.get(request.query_params.get("done", ""))
    flash: Flash | None = None
    flash_id = request.query_params.get("flash")
    if flash_id:
        flash = flashes(request).get(flash_id, _owner(principal))
        if flash is None:
            notice = "The message about an earlier form has expired. Nothing was sent again."
        elif values.get("problem") is None:
            values["problem"] = {**flash.problem, "refused_form": True}

    def kept(action: str, name: str) -> str:
        """What was typed into field ``name`` of the refused form posting to ``action`` ("" otherwise)."""
        return flash.fields.get(name, "") if flash is not None and flash.action == action else ""

    html = _env.get_template(template).render(
        principal=principal, csrf_field=CSRF_FIELD, csrf=csrf_token(token) if token else "", notice=notice,
        prefix=PREFIX, kept=kept, assets=ASSET_VERSIONS, **values)
    return HTMLResponse(html, status_code=http_status, headers=SECURITY_HEADERS)


def _problem(error: JixuError) -> dict[str, Any]:
    status = error.status if isinstance(error, HTTPProblem) else status_of(error)
    details = {k: v for k, v in error.details.items() if k != "result"}
    return {"status": status, "code": error.code, "message": error.message,
            "details": views.pretty(details) if details else "", "result": error.details.get("result")}


def _error_page(request: Request, principal: Principal | None, error: JixuError,
                headers: dict[str, str] | None = None, back: str | None = None) -> HTMLResponse:
    problem = _problem(error)
    titles = {404: "Not found", 405: "This address takes a form, not a visit", 401: "Log in first",
              403: "Refused", 409: "Conflict", 422: "Invalid input"}
    response = _render(request, "error.html", problem["status"], principal=principal, problem=problem,
                       title=f"{problem['status']}: {titles.get(problem['status'], error.code)}", back=back)
    response.headers.update(headers or {})
    return response


def _login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}", status_code=303)


def _safe_next(value: str | None) -> str:
    # Only a Studio path: never an absolute URL another site could smuggle in.
    if value and value.startswith(f"{PREFIX}/") and not value.startswith("//") and "\\" not in value:
        return value
    return f"{PREFIX}/threads"


def _with(location: str, **query: str) -> str:
    """``location`` with ``query`` added before its fragment."""
    path, hash_mark, fragment = location.partition("#")
    extra = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    return f"{path}{'&' if '?' in path else '?'}{extra}{hash_mark}{fragment}"


def _page(request: Request, build: Callable[[Context], dict[str, Any]], template: str, title: str,
          status: int = 200) -> Response:
    principal = session_principal(request)
    if principal is None:
        return _login_redirect(request)
    ctx = Context(request, services(request), principal)
    try:
        values = build(ctx)
    except JixuError as error:
        return _error_page(request, principal, error)
    return _render(request, template, status, principal=principal, title=title, problem=None, **values)


# --- login -------------------------------------------------------------------------------------


@router.get("")
@router.get("/")
def home(request: Request) -> Response:
    """The threads list (or the login page)."""
    return RedirectResponse(f"{PREFIX}/threads", status_code=303)


@router.get("/login")
def login_page(request: Request, next: str | None = None, reason: str | None = None) -> Response:
    """The token login form (after a refused login: why, from its flash)."""
    flash_id = request.query_params.get("flash")
    found = flashes(request).get(flash_id, "") if flash_id else None
    error = found.problem["message"] if found is not None else None
    return _render(request, "login.html", title="Log in", next=_safe_next(next), error=error, reason=LOGIN_REASONS.get(reason or ""))


def _login_refused(request: Request, target: str, status: int, message: str) -> Response:
    flash_id = flashes(request).put("", {"status": status, "code": "login_refused", "message": message},
                                    request.url.path, {})
    return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}&flash={flash_id}", status_code=303)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the pasted token; keep it in the session cookie and go on, or go back to the form saying why."""
    form = await read_form(request)
    target = _safe_next(form.get("next"))
    if not same_origin(request):
        return _login_refused(request, target, 403, "This login form was posted from another site.")
    token = form.get("token", "").strip()
    try:
        await asyncio.to_thread(check_token, request, token)
    except HTTPProblem as error:
        message = error.message if token else "Paste a bearer token (jixu_<id>_<secret>)."
        # 401, or 429 while this address or token failed too often: said on the login page (Post/Redirect/Get)
        return _login_refused(request, target, error.status if token else 401, message)
    response = RedirectResponse(target, status_code=303)
    set_session(response, request, token)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Forget the session (needs the CSRF token, so another site cannot log you out)."""
    form = await read_form(request)
    try:
        require_csrf(request, form)
    except HTTPProblem as error:
        return _refused(request, session_principal(request), _problem(error), f"{PREFIX}/threads", {})
    await asyncio.to_thread(end_session, request)
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    clear_session(response)
    return response


def _asset(name: str) -> bytes:
    return resources.files("jixu.server.studio").joinpath("static", name).read_bytes()


ASSET_VERSIONS = {name: hashlib.sha256(_asset(name)).hexdigest()[:12] for name in STATIC}
"""Each asset's content hash: pages link ``studio.css?v=<hash>``, so a browser may keep it (a new jixu version
has new hashes)."""


@router.get("/static/{name}")
def static(request: Request, name: str) -> Response:
    """The Studio's stylesheet and script (packaged with jixu: no CDN, works offline); kept by browsers for a
    year when asked for by their content hash (``?v=``), revalidated otherwise."""
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    version = ASSET_VERSIONS[name]
    cache = ("public, max-age=31536000, immutable" if request.query_params.get("v") == version
             else "no-cache")
    headers = {"Cache-Control": cache, "X-Content-Type-Options": "nosniff", "ETag": f'"{version}"'}
    if request.headers.get("if-none-match") == f'"{version}"':
        return Response(status_code=304, headers=headers)
    return Response(_asset(name), media_type=STATIC[name], headers=headers)


# --- pages -------------------------------------------------------------------------------------


def _query_seq(request: Request, name: str) -> int | None:
    text = request.query_params.get(name)
    return None if text is None or text == "" else threads_api.parse_seq(text, name)


def _choice(request: Request, name: str, allowed: tuple[str, ...] | list[str] | dict[str, Any]) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and value not in allowed:
        raise InvalidInput(f"{name} must be one of: {', '.join(allowed)}", field=name)
    return value


@router.get("/threads")
def threads_list(request: Request) -> Response:
    """The threads the caller may see: what needs a person first; counts, filters and search by id."""
    def build(ctx: Context) -> dict[str, Any]:
        text = request.query_params.get("q", "").strip()
        page = _query_seq(request, "page") or 1
        chosen = views.ListFilter(status=_choice(request, "status", views.LABELS),
                                  project=request.query_params.get("project") or None,
                                  tool=request.query_params.get("tool") or None,
                                  age=_choice(request, "age", views.AGES), q=text[:40] or None, page=page)
        return views.thread_list(ctx, chosen)

    return _page(request, build, "threads.html", "Threads")


@router.get("/threads/{thread_id}")
def thread_detail(request: Request, thread_id: str) -> Response:
    """One thread: its state, decisions, the end of its conversation and one page of its timeline."""
    def build(ctx: Context) -> dict[str, Any]:
        return views.thread_page(ctx, thread_id, before=_query_seq(request, "before"),
                                 view=request.query_params.get("view") or "compact",
                                 all_messages=request.query_params.get("messages") == "all")

    return _page(request, build, "thread.html", f"Thread {thread_id}")


@router.get("/threads/{thread_id}/at/{seq}")
def thread_at(request: Request, thread_id: str, seq: str) -> Response:
    """The thread's state right after one event (replayed from the events), with a fork from there."""
    return _page(request, lambda ctx: views.state_at(ctx, thread_id, threads_api.parse_seq(seq, "seq")),
                 "state_at.html", f"Thread {thread_id} at event #{seq}")


@router.get("/threads/{thread_id}/events.json")
def thread_events_json(request: Request, thread_id: str) -> Response:
    """A page of the thread's events as the API answers it (``after_seq``, ``limit``), for the session."""
    principal = session_principal(request)
    if principal is None:
        return JSONResponse({"error": "not logged in"}, status_code=401, headers={"Cache-Control": "no-store"})
    ctx = Context(request, services(request), principal)
    try:
        after = _query_seq(request, "after_seq") or 0
        limit = min(max(_query_seq(request, "limit") or 100, 1), threads_api.MAX_PAGE)
        answer = threads_api.list_events(thread_id, ctx, after, limit)  # the API's own response, as written
    except JixuError as error:
        return JSONResponse({"error": error.code, "message": error.message}, status_code=_problem(error)["status"])
    return Response(bytes(answer.body), media_type="application/json",
                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


@router.get("/runs")
def runs_list(request: Request) -> Response:
    """Every run the caller may see: what needs a person first."""
    return _page(request, lambda ctx: {"runs": views.run_rows(ctx)}, "runs.html", "Runs")


@router.get("/runs/{run_id}")
def run_detail(request: Request, run_id: str) -> Response:
    """One run: plan, tasks, journal, checks, execution requests and controls."""
    return _page(request, lambda ctx: views.run_page(ctx, run_id), "run.html", f"Run {run_id}")


def _head(request: Request, read: Callable[[Context], dict[str, Any]]) -> Response:
    principal = session_principal(request)
    if principal is None:
        return JSONResponse({"error": "not logged in"}, status_code=401, headers={"Cache-Control": "no-store"})
    try:
        body = read(Context(request, services(request), principal))
    except JixuError as error:
        return JSONResponse({"error": error.code}, status_code=_problem(error)["status"])
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


@router.get("/threads/{thread_id}/head")
def thread_head(request: Request, thread_id: str) -> Response:
    """The thread's seq and status (the page's fallback when its event stream cannot be opened)."""
    return _head(request, lambda ctx: views.thread_head(ctx, thread_id))


@router.get("/runs/{run_id}/head")
def run_head(request: Request, run_id: str) -> Response:
    """The run's seq and status, polled by the page for live updates."""
    return _head(request, lambda ctx: views.run_head(ctx, run_id))


def _holds(store: Store, stream: str) -> bool:
    """Whether the thread's whole history verifies (the ledger's verdict; a break found is recorded, so every
    later reader sees it at once)."""
    return verdict(store, stream, checkpoints=(ThreadProjection.name,)).valid


def _may_read(request: Request, thread_id: str) -> bool:
    """True while the session may still read the thread (its token not revoked, its role kept)."""
    principal = session_principal(request)
    if principal is None:
        return False
    try:
        threads_api.authorize(Context(request, services(request), principal), thread_id, "viewer")
    except JixuError:
        return False
    return True


@router.get("/threads/{thread_id}/events/stream")
async def thread_stream(request: Request, thread_id: str) -> Response:
    """Server-sent events for a thread page: one ``{"seq"}`` message whenever the thread's head moves on.

    The page fetches its changed parts then (the events themselves are on the page and in the API's stream).
    Authenticated by the session; checked again every few seconds, ending with an ``ended`` event when the
    session may no longer read the thread. Resumes after ``Last-Event-ID`` (or ``after_seq``).
    """
    principal = await asyncio.to_thread(session_principal, request)
    if principal is None:
        return JSONResponse({"error": "not logged in"}, status_code=401, headers={"Cache-Control": "no-store"})
    found = services(request)
    try:
        await asyncio.to_thread(threads_api.authorize, Context(request, found, principal), thread_id, "viewer")
        sent = request.headers.get("last-event-id") or request.query_params.get("after_seq") or "0"
        start = threads_api.parse_seq(sent, "after_seq")
    except JixuError as error:
        return JSONResponse({"error": error.code}, status_code=_problem(error)["status"])
    stream = stream_of(thread_id)

    async def events() -> AsyncIterator[str]:
        seq = start
        now = time.monotonic()
        deadline, quiet_since, checked_at = now + STREAM_SECONDS, now, now
        broken = False
        yield "retry: 2000\n\n"
        while time.monotonic() < deadline and not found.closing.is_set() and not await request.is_disconnected():
            if time.monotonic() - checked_at >= found.stream_recheck_interval:
                if not await asyncio.to_thread(_may_read, request, thread_id):
                    yield "event: ended\ndata: {}\n\n"
                    return
                if not broken and not await asyncio.to_thread(_holds, found.store, stream):
                    # Changed in the store without the head moving (an edit in the middle): the open page shows
                    # corrupt and drops its controls, as a new load of it would.
                    broken = True
                    yield f"id: {seq}\ndata: {json.dumps({'seq': seq, 'status': 'corrupt'})}\n\n"
                checked_at = time.monotonic()
            info = await asyncio.to_thread(found.store.stream_info, stream)
            if info is not None and info.head_seq != seq:
                seq = info.head_seq
                quiet_since = time.monotonic()
                yield f"id: {seq}\ndata: {json.dumps({'seq': seq})}\n\n"
            elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
            await asyncio.sleep(found.stream_poll_interval)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# --- posts -------------------------------------------------------------------------------------


Action = Callable[[Context, dict[str, str]], str]


def _invalid(error: ValidationError) -> InvalidInput:
    """A form's validation errors as a person reads them (``Note: required``), never pydantic's wording."""
    complaints = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "form"
        label = FIELD_LABELS.get(field, field)
        kind = item.get("type", "")
        if kind == "missing" or (kind == "string_too_short" and (item.get("ctx") or {}).get("min_length") == 1):
            complaints.append(f"{label}: this field is required")
        elif kind == "string_too_long":
            complaints.append(f"{label}: at most {(item.get('ctx') or {}).get('max_length')} characters")
        elif kind in ("literal_error", "enum"):
            complaints.append(f"{label}: choose one of the options")
        elif kind == "string_pattern_mismatch":
            complaints.append(f"{label}: not in the expected form")
        else:
            complaints.append(f"{label}: {item['msg']}")
    return InvalidInput("; ".join(complaints))


def _refused(request: Request, principal: Principal | None, problem: dict[str, Any], back: str,
             form: dict[str, str]) -> Response:
    """303 to the page ``back`` with the refusal as a flash (the typed fields kept for the form)."""
    flash_id = flashes(request).put(_owner(principal), problem, request.url.path, form)
    return RedirectResponse(_with(back, flash=flash_id), status_code=303)


def _back(form: dict[str, str], page: str) -> str:
    """Where a refusal is shown: the page the form was on when it says so (a page of ``page``), else ``page``."""
    wanted = form.get("back", "")
    if wanted == page or wanted.startswith((f"{page}?", f"{page}/at/")):
        return wanted
    return page


async def _post(request: Request, action: Action, page: str) -> Response:
    """CSRF check, the operation (in a worker thread), then 303: to where it says, or back to ``page`` with
    the refusal in a flash. Never a page rendered at the post's URL: nothing can send it again."""
    principal = session_principal(request)
    if principal is None:
        return RedirectResponse(f"{PREFIX}/login?next={quote(page, safe='')}&reason=session", status_code=303)
    form = await read_form(request)
    back = _back(form, page)
    ctx = Context(request, services(request), principal)
    try:
        require_csrf(request, form)
        location = await asyncio.to_thread(action, ctx, form)
    except JixuError as error:
        return _refused(request, principal, _problem(error), back, form)
    except ValidationError as error:
        return _refused(request, principal, _problem(_invalid(error)), back, form)
    return RedirectResponse(location, status_code=303)


def _text(form: dict[str, str], name: str) -> str | None:
    value = form.get(name, "").strip()
    return value or None


def _required(form: dict[str, str], name: str, why: str) -> str:
    value = _text(form, name)
    if value is None:
        raise InvalidInput(f"{FIELD_LABELS.get(name, name)}: {why}", field=name)
    return value


def _thread_post(request: Request, thread_id: str, action: Action) -> Coroutine[Any, Any, Response]:
    return _post(request, action, f"{PREFIX}/threads/{thread_id}")


def _run_post(request: Request, run_id: str, action: Action) -> Coroutine[Any, Any, Response]:
    return _post(request, action, f"{PREFIX}/runs/{run_id}")


@router.post("/threads/{thread_id}/effects/{effect_id}/resolve")
async def resolve_effect(request: Request, thread_id: str, effect_id: str) -> Response:
    """Record an operator's resolution of an unknown effect (a note is required)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        body = ResolveOutcome.model_validate({"resolution": form.get("resolution", ""),
                                              "note": form.get("note", "").strip(),
                                              "resolution_id": _text(form, "resolution_id")})
        threads_api.resolve_effect(thread_id, effect_id, body, ctx)
        return f"{PREFIX}/threads/{thread_id}?done=resolved#effect-{effect_id}"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/effects/{effect_id}/approve")
async def approve_effect(request: Request, thread_id: str, effect_id: str) -> Response:
    """Approve a parked call."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        threads_api.approve_effect(thread_id, effect_id, Decision(note=_text(form, "note")), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=approved"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/effects/{effect_id}/deny")
async def deny_effect(request: Request, thread_id: str, effect_id: str) -> Response:
    """Deny a parked call (the Studio asks for a reason: the model is told it)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        note = _required(form, "note", "say why the call is denied (the model is told)")
        threads_api.deny_effect(thread_id, effect_id, Decision(note=note), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=denied"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/fork")
async def fork_thread(request: Request, thread_id: str) -> Response:
    """Fork the thread at an event (optionally starting the child's first turn)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        response = threads_api.fork_thread(thread_id, ForkThread(at=form.get("at", ""), input=_text(form, "input")),
                                           ctx)
        child = _json(response)["thread_id"]
        return f"{PREFIX}/threads/{child}?done=forked"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/inputs")
async def send_input(request: Request, thread_id: str) -> Response:
    """Send input to an idle thread (starts a turn a worker runs)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        threads_api.send_input(thread_id, SendInput(input=form.get("input", "")), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=sent"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/resume")
async def resume_thread(request: Request, thread_id: str) -> Response:
    """Resume a turn paused for quota or authentication."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        threads_api.resume_thread(thread_id, Decision(note=_text(form, "note")), ctx)
        return f"{PREFIX}/threads/{thread_id}?done=thread_resumed"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/interrupt")
async def interrupt_thread(request: Request, thread_id: str) -> Response:
    """Stop the turn in progress: ended now if no process runs it, else at its runner's next step."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        response = threads_api.interrupt_thread(thread_id, InterruptTurn(reason=_text(form, "reason")), ctx)
        outcome = json.loads(bytes(response.body)).get("outcome")
        done = "turn_interrupted" if outcome == "ended" else "interrupt_requested"
        return f"{PREFIX}/threads/{thread_id}?done={done}"

    return await _thread_post(request, thread_id, action)


@router.post("/threads/{thread_id}/turns/{turn_id}/recover")
async def recover_turn(request: Request, thread_id: str, turn_id: str) -> Response:
    """Recover a turn whose owner's lease expired (the Studio asks for a reason: it is in the receipt)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        note = _required(form, "note", "say why the turn is recovered (it is recorded)")
        epoch = form.get("expected_epoch", "")
        # ASCII digits (``isdigit`` alone takes "²"), at most 19: a store's integer; int() of a longer text can
        # raise ValueError (over 4,300 digits), which would be a 500.
        if not (epoch.isascii() and epoch.isdigit() and len(epoch) <= 19):
            raise InvalidInput("Epoch: not in the expected form", field="expected_epoch")
        body = RecoverTurn.model_validate({"request_id": form.get("request_id", ""), "expected_epoch": int(epoch),
                                           "legacy_confirmed_stopped": form.get("legacy_confirmed_stopped") == "yes",
                                           "note": note})
        threads_api.recover_turn(thread_id, turn_id, body, ctx)
        return f"{PREFIX}/threads/{thread_id}?done=turn_recovered"

    return await _thread_post(request, thread_id, action)


@router.post("/runs/{run_id}/resume")
async def resume_run(request: Request, run_id: str) -> Response:
    """Resume a paused, interrupted or unreconciled run."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.resume_run(run_id, ResumeRun(note=_text(form, "note")), ctx)
        return f"{PREFIX}/runs/{run_id}?done=resumed"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/handoff")
async def handoff_run(request: Request, run_id: str) -> Response:
    """Hand the run to another configured provider."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.handoff_run(run_id, Handoff(agent=form.get("agent", ""), note=_text(form, "note")), ctx)
        return f"{PREFIX}/runs/{run_id}?done=handed_off"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/retry")
async def retry_run(request: Request, run_id: str) -> Response:
    """Retry a failed or cancelled run as a fresh run."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        response = runs_api.retry_run(run_id, RetryRun(provider=_text(form, "provider")), ctx)
        return f"{PREFIX}/runs/{_json(response)['run_id']}?done=retried"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/cancel")
async def cancel_run(request: Request, run_id: str) -> Response:
    """Cancel the run (the Studio asks for a reason: it is recorded)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        reason = _required(form, "reason", "say why the run is cancelled (it is recorded)")
        runs_api.cancel_run(run_id, CancelRun(reason=reason), ctx)
        return f"{PREFIX}/runs/{run_id}?done=cancelled"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/requests/{request_id}/reconcile")
async def reconcile_request(request: Request, run_id: str, request_id: str) -> Response:
    """Reconcile an execution request from retained evidence (409 explained when there is no proof)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.authorize(ctx, run_id, "operator")
        run_async(ctx.services.runs.reconcile_execution_request(
            run_id, request_id, form.get("reconciliation_id", ""), actor=ctx.actor))
        return f"{PREFIX}/runs/{run_id}?done=reconciled#request-{request_id}"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/requests/{request_id}/inspect")
async def inspect_request(request: Request, run_id: str, request_id: str) -> Response:
    """Ask the request's provider, read-only, what it shows now; the finding is retained in the request."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        runs_api.inspect_remote(run_id, request_id, Inspect(), ctx)
        return f"{PREFIX}/runs/{run_id}?done=inspected#request-{request_id}"

    return await _run_post(request, run_id, action)


@router.post("/runs/{run_id}/requests/{request_id}/resolve")
async def resolve_request(request: Request, run_id: str, request_id: str) -> Response:
    """Record an operator's resolution of an unknown request, citing the latest inspection (note required)."""
    def action(ctx: Context, form: dict[str, str]) -> str:
        body = ResolveRequest.model_validate({"resolution": form.get("resolution", ""),
                                              "note": form.get("note", "").strip(),
                                              "resolution_id": _text(form, "resolution_id")})
        runs_api.resolve_request(run_id, request_id, body, ctx)
        return f"{PREFIX}/runs/{run_id}?done=request_resolved#request-{request_id}"

    return await _run_post(request, run_id, action)


def _json(response: Response) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(bytes(response.body))
    return body


# --- anything else under /studio: the Studio's own error pages ------------------------------------

_OWNER_PAGE = re.compile(rf"^{PREFIX}/(threads|runs)/([0-9A-Za-z]+)")


def _takes_posts(path: str) -> bool:
    return any(isinstance(route, APIRoute) and "POST" in (route.methods or ()) and route.path != f"{PREFIX}/{{path:path}}"
               and route.path_regex.match(path) for route in router.routes)


@router.get("/{path:path}")
def not_here(request: Request, path: str) -> Response:
    """An address the Studio has no page at: 405 for a form's address visited (with where its page is), 404
    otherwise; both as Studio pages, never the API's JSON."""
    principal = session_principal(request)
    full = request.url.path
    if _takes_posts(full):
        owner = _OWNER_PAGE.match(full)
        page = f"{PREFIX}/{owner.group(1)}/{owner.group(2)}" if owner else f"{PREFIX}/threads"
        error = HTTPProblem("method_not_allowed", f"{full} is the address of a form: it takes the form's post, not "
                                                  f"a visit, so nothing was done here. The form is on {page}.",
                            status=405, page=page)
        return _error_page(request, principal, error, headers={"Allow": "POST"}, back=page)
    return _error_page(request, principal, NotFound(f"the Studio has no page at {full}"))


@router.post("/{path:path}")
def post_not_here(request: Request, path: str) -> Response:
    """A post to an address that takes none: 303 to the same address, whose page says so (nothing was done)."""
    return RedirectResponse(request.url.path, status_code=303)


__all__ = ["PREFIX", "router"]

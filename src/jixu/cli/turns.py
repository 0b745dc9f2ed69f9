"""``jixu turns …``: who owns each active turn, and the explicit recovery of an expired one.

Ownership is read against the store's clock (never this machine's): owner,
claim epoch, lease expiry and last heartbeat. ``recover`` fences out the
owner of an expired turn (``ThreadLog.recover_turn``): it records an
immutable receipt, retries nothing, and the turn waits as
``needs_reconciliation`` until its open effects are settled and it continues.
"""

from __future__ import annotations

import datetime
import shlex
import sys
from typing import Any

import click
from rich.table import Table

from jixu.cli.output import EXIT_OK, emit_json, handled, json_option, literal
from jixu.cli.threads import default_actor, load_verified, out, trim
from jixu.errors import InvalidInput, JixuError
from jixu.ledger import Store, open_store
from jixu.scheduling import enqueue_thread, queued_work, thread_work_key
from jixu.threads.log import THREAD_PREFIX, ThreadLog

_PAGE = 1000


def clock_text(seconds: float | None) -> str:
    """Epoch seconds (store clock) as UTC ISO text, or empty."""
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def turn_rows(store: Store) -> list[dict[str, Any]]:
    """One row per thread with an active turn: ownership by the store's clock, and its work item; a corrupt
    thread's row says so and offers nothing (status ``corrupt``, its ``corruption``)."""
    rows: list[dict[str, Any]] = []
    after = ""
    while True:
        page = store.list_streams(THREAD_PREFIX, after=after, limit=_PAGE)
        for info in page:
            thread_id = info.stream[len(THREAD_PREFIX):]
            try:
                log = ThreadLog.load(store, thread_id)
            except JixuError as error:
                rows.append({"thread_id": thread_id, "turn_id": None, "status": "unreadable", "error": error.message})
                continue
            turn = log.state.active_turn()
            if turn is not None:
                log.establish()  # a turn an operator might recover: its whole history must hold first
            found = log.corruption()
            if found is not None:  # nothing is offered on it (its state stops before the first bad event)
                rows.append({"thread_id": thread_id, "turn_id": turn.turn_id if turn is not None else None,
                             "status": "corrupt", "error": found.summary(), "corruption": found.to_dict()})
                continue
            ownership = log.ownership()
            if turn is None or ownership is None:
                continue
            now = float(ownership.get("store_now") or store.now())
            expires_at = ownership.get("expires_at")
            heartbeat_at = ownership.get("heartbeat_at")
            work = queued_work(store, thread_work_key(thread_id))
            rows.append({
                "thread_id": thread_id,
                "turn_id": turn.turn_id,
                "status": turn.status,
                "owner": ownership.get("owner"),
                "epoch": ownership.get("epoch"),
                "expires_at": expires_at,
                "expires_at_utc": clock_text(expires_at),
                "expires_in": None if expires_at is None else round(float(expires_at) - now, 3),
                "heartbeat_at": heartbeat_at,
                "heartbeat_at_utc": clock_text(heartbeat_at),
                "heartbeat_age": None if heartbeat_at is None else round(now - float(heartbeat_at), 3),
                "expired": bool(ownership.get("expired")) and not ownership.get("released"),
                "released": bool(ownership.get("released")),
                "legacy": bool(ownership.get("legacy")) and not turn.queued,
                "queued": turn.queued and ownership.get("owner") is None,
                "store_now": now,
                "work": work.to_dict() if work is not None else None,
            })
        if len(page) < _PAGE:
            return rows
        after = page[-1].stream


def recover_hint(store: str, row: dict[str, Any]) -> str:
    """The command that recovers the turn of ``row``."""
    legacy = " --legacy-confirmed-stopped" if row.get("legacy") else ""
    return (f"jixu turns recover {shlex.quote(store)} {row['thread_id']} {row['turn_id']} --request-id "
            f"$(openssl rand -hex 16) --expected-epoch {row.get('epoch')}{legacy}")


def lease_text(row: dict[str, Any]) -> str:
    """``in 12.3s`` / ``expired 4.0s ago`` / ``released``."""
    if row.get("released"):
        return "released"
    left = row.get("expires_in")
    if left is None:
        return "-"
    return f"in {left:.1f}s" if left > 0 else f"[bold red]expired {-left:.1f}s ago[/]"


@click.group("turns", short_help="Who owns each active turn; recover an expired one.")
def turns_group() -> None:
    """Inspect turn ownership and recover turns whose owner stopped.

    STORE is a SQLite path or sqlite:/// URL, or a postgresql:// URL (never
    created by these commands). Expiry is judged by the store's clock.
    """


@turns_group.command("list", short_help="Active turns: owner, epoch, lease expiry, heartbeat (store clock).")
@click.argument("store")
@click.option("--expired", "only_expired", is_flag=True,
              help="Only turns whose owner's lease expired (or legacy turns): the ones to recover.")
@json_option
def list_command(store: str, only_expired: bool, as_json: bool) -> None:
    """List threads with an active turn: owner, epoch, lease expiry and last heartbeat by the store's clock.

    A turn whose lease expired stays `processing` until someone recovers it
    (`jixu turns recover`); a legacy turn (recorded before ownership existed)
    needs --legacy-confirmed-stopped.
    """
    with handled(as_json), open_store(store, create=False) as opened:
        rows = turn_rows(opened)
        now = opened.now()
    if only_expired:
        rows = [r for r in rows if r.get("expired") or r.get("legacy")]
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"active turns in {literal(store)} (store clock {clock_text(now)})")
    table.add_column("thread", no_wrap=True, min_width=26)
    table.add_column("turn", no_wrap=True, min_width=26)
    for column in ("status", "owner", "epoch", "lease", "heartbeat", "flags", "queue"):
        table.add_column(column)
    for row in rows:
        if row["status"] in ("unreadable", "corrupt"):
            table.add_row(literal(row["thread_id"]), literal(row.get("turn_id") or ""),
                          f"[bold red]{literal(row['status'])}[/]", literal(trim(row.get("error"), 60)),
                          "", "", "", "", "")
            continue
        flags = [name for name in ("expired", "legacy", "queued", "released") if row.get(name)]
        work = row.get("work") or {}
        heartbeat = "" if row.get("heartbeat_age") is None else f"{row['heartbeat_age']:.1f}s ago"
        table.add_row(literal(row["thread_id"]), literal(row["turn_id"]), literal(row["status"]),
                      literal(row.get("owner") or "-"), literal(row.get("epoch")), lease_text(row), heartbeat,
                      ", ".join(f"[bold red]{f}[/]" if f in ("expired", "legacy") else f for f in flags),
                      literal(work.get("state") or "-"))
    out().print(table)
    out().print(f"{len(rows)} active turn(s)", highlight=False)
    for row in rows:
        if row.get("expired") or row.get("legacy"):
            out().print(f"recover {row['thread_id']}: {recover_hint(store, row)}", highlight=False, markup=False)


def parse_epoch(text: str) -> int:
    """``--expected-epoch`` as an integer >= 0 (typed error otherwise)."""
    value = text.strip()
    if not value.isdigit():
        raise InvalidInput(f"--expected-epoch {text!r} must be an integer >= 0 (the epoch `jixu turns list` shows)",
                           field="expected_epoch")
    return int(value)


@turns_group.command("recover", short_help="Fence out the owner of an expired turn and record a receipt.")
@click.argument("store")
@click.argument("thread_id")
@click.argument("turn_id")
@click.option("--request-id", required=True, metavar="HEX",
              help="32 lower-case hex characters; repeating the same request returns the same receipt.")
@click.option("--expected-epoch", required=True, metavar="N", help="The epoch you observed (`jixu turns list`).")
@click.option("--legacy-confirmed-stopped", is_flag=True,
              help="For a turn recorded before ownership existed: you assert its process has stopped (recorded).")
@click.option("--actor", default=None, help="Who recovers (recorded; default cli:<login name>).")
@click.option("--note", default=None, help="Why you recover it (recorded in the receipt).")
@json_option
def recover_command(store: str, thread_id: str, turn_id: str, request_id: str, expected_epoch: str,
                    legacy_confirmed_stopped: bool, actor: str | None, note: str | None, as_json: bool) -> None:
    """Recover TURN_ID of THREAD_ID after its owner stopped: the store checks expiry by its own clock.

    The epoch moves past the owner's, so anything the former owner still
    writes is refused; an immutable receipt is recorded; nothing is retried
    and no model is called. The turn then needs reconciliation: settle its
    unknown effects (`jixu threads resolve`), then it continues (a worker picks
    it up again when the thread is in the work queue).

    Exit codes: 0 recovered (or the same request again: the same receipt), 3 no
    such thread or turn, 4 the lease is still live or the epoch moved, 6 bad
    input (request id, epoch, a legacy assertion that does not fit).
    """
    who = actor if actor is not None else default_actor()
    with handled(as_json), open_store(store, create=False) as opened:
        epoch = parse_epoch(expected_epoch)
        log = load_verified(opened, thread_id, actor=who)
        replay = log.state.recovery(request_id) is not None
        receipt = log.recover_turn(turn_id, request_id=request_id, expected_epoch=epoch,
                                   legacy_confirmed_stopped=legacy_confirmed_stopped, actor=who, note=note)
        work = None
        if opened.get_work(thread_work_key(thread_id)) is not None:
            work = enqueue_thread(opened, thread_id)  # a worker continues it once its effects are settled
        state = log.snapshot()
    if as_json:
        emit_json({"recorded": not replay, "receipt": receipt,
                   "thread": {"thread_id": state.thread_id, "status": state.status, "reason": state.reason,
                              "seq": state.seq, "head_hash": state.head_hash},
                   "work": work.to_dict() if work is not None else None})
        sys.exit(EXIT_OK)
    if replay:
        out().print(f"already recovered by request {request_id}: nothing written; the receipt:", highlight=False,
                    markup=False)
    else:
        out().print(f"recovered turn {turn_id} of thread {thread_id}: the former owner is fenced out",
                    highlight=False, markup=False)
    table = Table(title="recovery receipt")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key in ("turn_id", "request_id", "reason", "previous_owner", "expected_epoch", "epoch", "actor"):
        table.add_row(key, literal(receipt.get(key)))
    table.add_row("previous lease expired at", clock_text(receipt.get("previous_expires_at")) or "-")
    table.add_row("store time", clock_text(receipt.get("store_time")))
    out().print(table)
    out().print(f"thread {state.thread_id}: {state.status}: {state.reason}", highlight=False, markup=False)
    if work is not None:
        out().print(f"queued for a worker ({work.state}); it continues once the open effects are settled",
                    highlight=False)


__all__ = ["turns_group"]

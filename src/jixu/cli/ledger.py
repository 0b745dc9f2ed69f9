"""``jixu verify``, ``jixu ledger …`` and ``jixu effects``: the ledger and the resolver from the shell."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import click
from rich.table import Table

from jixu.cli.output import EXIT_CHECK_FAILED, console, emit_json, handled, json_option, literal
from jixu.errors import InvalidInput, KeyUnavailable, NotFound, StoreError, StreamCorrupt
from jixu.ledger import NewEvent, Store, VerifyReport, open_store
from jixu.ledger.chain import REASONS
from jixu.ledger.keys import Keyring, keyring, retire_keys, rotate_keys
from jixu.ledger.projection import CheckpointAudit, Projection, audit_checkpoint
from jixu.ledger.trust import recorded_break, reseal_break, reseal_checkpoints, verdict
from jixu.recovery import RecoveryResolver

STORE_HELP = "Store: a SQLite file path, sqlite:///PATH, or another store URL."


def checkpointed(stream: str) -> list[Projection[Any]]:
    """The projections whose checkpoints a stream of this kind has (threads and runs keep one each)."""
    if stream.startswith("thread/"):
        from jixu.threads.projection import ThreadProjection

        return [ThreadProjection()]
    if stream.startswith("run/"):
        from jixu.runs.projection import RunProjection

        return [RunProjection()]
    return []


def stream_verdict(opened: Store, stream: str, keys: Keyring | None = None) -> VerifyReport:
    """The ledger's verdict on ``stream`` with the checkpoints its kind keeps (a break found is recorded)."""
    return verdict(opened, stream, checkpoints=[p.name for p in checkpointed(stream)], keys=keys)


def check_stream(opened: Store, stream: str) -> tuple[VerifyReport, list[CheckpointAudit]]:
    """The ledger's verdict on ``stream`` (recorded when broken) and each of its checkpoints re-projected."""
    report = stream_verdict(opened, stream)
    audits = [audit for p in checkpointed(stream) if (audit := audit_checkpoint(opened, stream, p)) is not None]
    return report, audits


def _streams(opened: Store) -> list[str]:
    names: list[str] = []
    after = ""
    while True:
        page = opened.list_streams(after=after, limit=1000)
        names.extend(info.stream for info in page)
        if len(page) < 1000:
            return names
        after = page[-1].stream


@click.command("verify")
@click.argument("store")
@click.option("--stream", default=None, help="Verify only this stream.")
@json_option
def verify_command(store: str, stream: str | None, as_json: bool) -> None:
    """Recompute the hash chain of every stream in STORE and re-project every checkpoint against the events
    (exit 1 if any stream is invalid or any checkpoint was forged)."""
    with handled(as_json), open_store(store, create=False) as opened:
        if stream is not None and opened.stream_info(stream) is None:
            raise NotFound(f"stream {stream!r} does not exist in {store}", stream=stream)
        checked = [check_stream(opened, name) for name in ([stream] if stream is not None else _streams(opened))]
    reports = [report for report, _audits in checked]
    forged = [audit for _report, audits in checked for audit in audits if audit.failed]
    valid = all(r.valid for r in reports) and not forged
    if as_json:
        emit_json({"valid": valid, "streams": [{**r.to_dict(), "checkpoints": [a.to_dict() for a in audits]}
                                               for r, audits in checked],
                   "forged_checkpoints": [a.to_dict() for a in forged]})
    else:
        table = Table(title=f"jixu verify {literal(store)}")
        for column in ("stream", "valid", "events", "head hash", "first bad seq", "why", "checkpoint"):
            table.add_column(column)
        for r, audits in checked:
            table.add_row(
                literal(r.stream),
                "[green]valid[/]" if r.valid else "[bold red]INVALID[/]",
                str(r.count),
                literal(r.head_hash[:16]) + "…",
                "" if r.first_bad_seq is None else str(r.first_bad_seq),
                "" if r.reason is None else literal(f"{r.reason}: {REASONS[r.reason]} ({r.detail})"),
                "; ".join((f"[bold red]{literal(a.status.upper())}[/]" if a.failed else literal(a.status))
                          + literal(f" at seq {a.seq}: {a.detail}") for a in audits),
            )
        console.print(table)
        total = sum(r.count for r in reports)
        outcome = "[green]all valid[/]" if valid else "[bold red]tampering or damage detected[/]"
        # Each failed checkpoint by what was found: a forged one, or a genuine one whose events were rewritten.
        failed = Counter(audit.status for audit in forged)
        failures = ", ".join(f"{count} {status}" for status, count in sorted(failed.items())) or "none failed"
        console.print(f"{len(reports)} stream(s), {total} event(s), {sum(len(a) for _r, a in checked)} "
                      f"checkpoint(s) ({failures}): {outcome}")
    if not valid:
        sys.exit(EXIT_CHECK_FAILED)


@click.group("ledger")
def ledger_group() -> None:
    """Read and append raw ledger events."""


_KEPT_BY_JIXU = {
    "thread/": "a thread's record: change it with `jixu threads` (send, resolve, approve, deny, resume)",
    "run/": "a run's journal: change it with `jixu runs`",
    "request/": "an execution request's record: change it with `jixu runs` (resolve-request, ...)",
    "project/": "a project's record: change it with `jixu projects`",
    "auth/token/": "an API token's record: change it with `jixu tokens`",
    "idempotency/": "the record of an API request's answer: the server keeps it",
    "artifact/": "an artifact's record: jixu keeps it",
}
"""Streams whose events jixu's harness writes after its own checks (the turn's owner, the effect's state)."""


@ledger_group.command("append")
@click.argument("store")
@click.argument("stream")
@click.argument("event_type")
@click.argument("data", default="{}")
@click.option("--expected-seq", type=int, default=None,
              help="The head seq you expect (default: the current head, read just before).")
@click.option("--id", "event_id", default=None, help="Event id (a ULID) to make a retried append idempotent.")
@click.option("--actor", default=None, help="Recorded in the event's meta as the actor.")
@click.option("--force", is_flag=True,
              help="Append to a stream jixu keeps (thread/, run/, request/, project/, auth/token/, idempotency/, "
                   "artifact/) without its checks.")
@json_option
def append_command(store: str, stream: str, event_type: str, data: str, expected_seq: int | None,
                   event_id: str | None, actor: str | None, force: bool, as_json: bool) -> None:
    """Append one event of EVENT_TYPE with DATA (a JSON object) to STREAM (refused if STREAM does not verify).

    A stream jixu keeps (a thread's, a run's, ...) is refused without --force: its commands check what a raw
    append does not (an operator's resolution of a call another process still runs would be recorded, and that
    process's receipt then refused).
    """
    with handled(as_json):
        kept = next((what for prefix, what in _KEPT_BY_JIXU.items() if stream.startswith(prefix)), None)
        if kept is not None and not force:
            raise InvalidInput(f"{stream!r} is {kept}; a raw append skips their checks (nothing was appended; "
                               "--force appends it anyway)", field="stream")
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise InvalidInput(f"DATA is not valid JSON: {exc}", field="data") from exc
        if actor is not None and not actor.strip():
            raise InvalidInput("--actor must name who appends (or leave it out)", field="actor")
        meta = {"actor": actor} if actor else {}
        event = NewEvent(event_type, payload, meta) if event_id is None else NewEvent(event_type, payload, meta, event_id)
        with open_store(store) as opened:
            info = opened.stream_info(stream)
            if expected_seq is None:
                expected_seq = info.head_seq if info else 0
            if info is not None:
                # A raw append is still an act on the stream: never onto a history that does not verify.
                report = stream_verdict(opened, stream)
                if not report.valid:
                    raise StreamCorrupt(f"stream {stream!r} is corrupt from event #{report.first_bad_seq} "
                                        f"({report.reason}): nothing was appended; `jixu verify` tells more",
                                        stream=stream, first_bad_seq=report.first_bad_seq, reason=report.reason)
            [stored] = opened.append(stream, [event], expected_seq)
    if as_json:
        emit_json(stored.to_dict())
    else:
        console.print(f"appended [bold]{literal(stored.type)}[/] to {literal(stored.stream)} at seq {stored.seq} "
                      f"(id {literal(stored.id)}, hash {literal(stored.hash[:16])}…)", highlight=False)


@ledger_group.command("streams")
@click.argument("store")
@click.option("--prefix", default="", help="Only streams whose name starts with this.")
@json_option
def streams_command(store: str, prefix: str, as_json: bool) -> None:
    """List the streams in STORE with their heads."""
    with handled(as_json), open_store(store, create=False) as opened:
        infos = opened.list_streams(prefix, limit=100_000)
    if as_json:
        emit_json([i.to_dict() for i in infos])
        return
    table = Table(title=f"streams in {literal(store)}")
    for column in ("stream", "events", "head hash", "created"):
        table.add_column(column)
    for i in infos:
        table.add_row(literal(i.stream), str(i.head_seq), literal(i.head_hash[:16]) + "…", literal(i.created_at))
    console.print(table)


@ledger_group.command("events")
@click.argument("store")
@click.argument("stream")
@click.option("--from-seq", type=int, default=1, help="First seq to show.")
@json_option
def events_command(store: str, stream: str, from_seq: int, as_json: bool) -> None:
    """Show the events of STREAM in order."""
    with handled(as_json), open_store(store, create=False) as opened:
        if opened.stream_info(stream) is None:  # as `ledger effects` and `verify --stream` answer
            raise NotFound(f"stream {stream!r} has no events in {store}", stream=stream)
        events = opened.read(stream, from_seq)
    if as_json:
        emit_json([e.to_dict() for e in events])
        return
    table = Table(title=f"{literal(stream)} in {literal(store)}")
    for column in ("seq", "type", "id", "recorded at", "data"):
        table.add_column(column)
    for e in events:
        text = json.dumps(e.data, ensure_ascii=False)
        table.add_row(str(e.seq), literal(e.type), literal(e.id), literal(e.recorded_at),
                      literal(text if len(text) < 80 else text[:77] + "…"))
    console.print(table)


_STATE_STYLE = {
    "completed": "green",
    "not_dispatched": "cyan",
    "unknown": "bold yellow",
    "parked": "magenta",
    "corrupt": "bold red",
}


@click.command("effects")
@click.argument("store")
@click.argument("stream")
@json_option
def effects_command(store: str, stream: str, as_json: bool) -> None:
    """Classify every effect in STREAM with the RecoveryResolver (exit 1 if corrupt or needing an operator)."""
    with handled(as_json), open_store(store, create=False) as opened:
        events = opened.read(stream)
        if not events:
            raise NotFound(f"stream {stream!r} has no events in {store}", stream=stream)
        report = stream_verdict(opened, stream)
    analysis = RecoveryResolver.analyze(events, chain_break_seq=None if report.valid else report.first_bad_seq)
    if as_json:
        emit_json(analysis.to_dict())
    else:
        table = Table(title=f"effects in {literal(stream)}")
        for column in ("effect", "kind", "name", "state", "reason", "retry safe", "resolution"):
            table.add_column(column)
        for d in analysis.decisions.values():
            style = _STATE_STYLE.get(d.state, "")
            table.add_row(literal(d.effect_id), literal(d.kind), literal(d.name or ""),
                          f"[{style}]{literal(d.state)}[/]" if style else literal(d.state), literal(d.reason),
                          "yes" if d.retry_safe else "no",
                          literal((d.resolution or {}).get("resolution", "") if d.resolution else ""))
        console.print(table)
        console.print(
            f"safe to continue: {'yes' if analysis.safe_to_continue else 'no'}; "
            f"needs an operator's resolution: {len(analysis.requires_resolution)}; "
            f"parked: {len(analysis.waiting_on_parked)}; corruption: {'YES' if analysis.has_corruption else 'no'}",
            highlight=False,
        )
    if analysis.has_corruption or analysis.requires_resolution:
        sys.exit(EXIT_CHECK_FAILED)


@click.group("keys")
def keys_group() -> None:
    """The checkpoint key file (decision 0025): show it, rotate it, retire old keys.

    Checkpoints are sealed with HMAC-SHA256 under a key held outside the store:
    $JIXU_KEY_FILE, else ~/.config/jixu/checkpoint-keys (made 0600 by the first
    seal). Give every process that opens the same store the same file.
    """


def _key_report(found: Keyring) -> dict[str, Any]:
    return {"path": None if found.path is None else str(found.path), "current": found.current,
            "keys": [kid for kid, _secret in found.keys], "problem": found.problem}


def _print_keys(found: Keyring, as_json: bool) -> None:
    report = _key_report(found)
    if as_json:
        emit_json(report)
        return
    console.print(f"key file {report['path']}", highlight=False, markup=False)
    if found.problem:
        console.print(f"[bold red]no usable key[/]: {literal(found.problem)}", highlight=False)
    for kid in report["keys"]:
        console.print(f"  {kid}" + ("  (seals; verifies)" if kid == found.current else "  (verifies)"),
                      highlight=False, markup=False)


@keys_group.command("show")
@click.option("--file", "path", default=None, help="The key file (default: $JIXU_KEY_FILE or the user's).")
@json_option
def keys_show_command(path: str | None, as_json: bool) -> None:
    """Where the key file is and which keys it holds (ids only; exit 1 when no key is usable)."""
    found = keyring(path)
    _print_keys(found, as_json)
    if not found.keys:
        sys.exit(EXIT_CHECK_FAILED)


@keys_group.command("rotate")
@click.option("--file", "path", default=None, help="The key file (default: $JIXU_KEY_FILE or the user's).")
@json_option
def keys_rotate_command(path: str | None, as_json: bool) -> None:
    """Make a new key the one that seals; the earlier keys still verify the checkpoints they sealed."""
    with handled(as_json):
        found = rotate_keys(path)
    _print_keys(found, as_json)


def _seal_again(opened: Store, keys: Keyring) -> dict[str, int]:
    """Before retiring every key of ``keys`` but the current one: verify each stream of ``opened`` (a checkpoint
    an old key sealed that proves a rewrite records its break), and seal again with the current key each recorded
    break and each checkpoint that still holds. A break that cannot be kept so (a read-only store, say) stops it
    all: nothing is retired (decision 0069)."""
    counts = {"breaks": 0, "checkpoints": 0}
    for stream in _streams(opened):
        names = [p.name for p in checkpointed(stream)]
        report = stream_verdict(opened, stream, keys)
        counts["breaks"] += reseal_break(opened, stream, keys)
        if not report.valid and report.reason != "break_unchecked":  # one no key here checks already: nothing lost
            kept = recorded_break(opened, stream, keys)
            if kept is None or kept.reason == "break_unchecked":
                raise StoreError(f"{stream} is broken ({report.reason} at seq {report.first_bad_seq}) but its break "
                                 "could not be recorded under the current key (is the store writable?): nothing "
                                 "retired, as the old key is what proves it", stream=stream)
        counts["checkpoints"] += reseal_checkpoints(opened, stream, names, keys)
    return counts


@keys_group.command("retire")
@click.option("--file", "path", default=None, help="The key file (default: $JIXU_KEY_FILE or the user's).")
@click.option("--store", "stores", multiple=True, metavar="STORE",
              help="A store whose recorded breaks are sealed again with the current key first (repeatable).")
@json_option
def keys_retire_command(path: str | None, stores: tuple[str, ...], as_json: bool) -> None:
    """Keep only the current key: checkpoints sealed by the others are no longer trusted (they are rebuilt).

    With --store (give every store these keys seal), each store is verified first, every stream with the keys
    held now (a checkpoint that proves a rewrite records its break), and each recorded break, and each checkpoint
    that still holds, is sealed again with the current key (decision 0069); a break that cannot be recorded (a
    read-only store) stops it, nothing retired. Without it, breaks recorded under a retired key show as
    break_unchecked: still corrupt, but their details are no longer vouched for.
    """
    resealed: dict[str, dict[str, int]] = {}
    with handled(as_json):
        found = keyring(path)
        if found.current is None:
            raise KeyUnavailable(f"no key to keep: {found.problem}", path=str(found.path))
        for url in stores:
            with open_store(url, create=False) as opened:
                resealed[url] = _seal_again(opened, found)
        found = retire_keys(path, keep=found.current)
    if as_json:
        emit_json({**_key_report(found), "sealed_again": resealed})
        return
    for url, counts in resealed.items():
        console.print(f"{literal(url)}: {counts['breaks']} recorded break(s) and {counts['checkpoints']} "
                      f"checkpoint(s) sealed again with key {found.current}", highlight=False)
    _print_keys(found, as_json)

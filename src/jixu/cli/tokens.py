"""``jixu tokens …``: bearer tokens of the HTTP API, made locally against a store or through a server.

``--store URL`` writes the token's record into the ledger directly (this is
how the first admin token is made); ``--server URL --token T`` (or
``$JIXU_SERVER`` / ``$JIXU_TOKEN``) asks a running server, with an admin
token. The secret is printed once and never stored.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from jixu.cli.output import emit_json, handled, json_option, literal
from jixu.cli.threads import default_actor, out
from jixu.errors import InvalidInput
from jixu.ledger import open_store
from jixu.server.auth import ROLES, create_token, list_tokens, parse_duration, revoke_token, rotate_token
from jixu.server.client import SERVER_ENV, TOKEN_ENV, Client


def target_options(fn: Any) -> Any:
    """``--store`` (local) or ``--server``/``--token`` (remote)."""
    fn = click.option("--token", envvar=TOKEN_ENV, default=None, metavar="TOKEN",
                      help=f"An admin bearer token for --server (default ${TOKEN_ENV}).")(fn)
    fn = click.option("--server", envvar=SERVER_ENV, default=None, metavar="URL",
                      help=f"A jixu server, e.g. http://127.0.0.1:8420 (default ${SERVER_ENV}).")(fn)
    return click.option("--store", "store_url", default=None, metavar="URL",
                        help="Work on this store directly (a SQLite path or URL, or postgresql://…).")(fn)


def _remote(store_url: str | None, server: str | None, token: str | None) -> Client | None:
    if store_url and server:
        raise InvalidInput("give --store (local) or --server (remote), not both", field="server")
    if store_url:
        return None
    if not server:
        raise InvalidInput(f"give --store URL, or --server URL with --token (or ${SERVER_ENV} / ${TOKEN_ENV})",
                           field="store")
    return Client(server, token)


@click.group("tokens", short_help="Make, list, rotate and revoke the HTTP API's bearer tokens.")
def tokens_group() -> None:
    """Bearer tokens of the HTTP API: a role per project (viewer < editor < operator), or admin."""


@tokens_group.command("create", short_help="Make a token; its secret is printed once.")
@click.option("--name", default=None, help="A label (default: <project>-<role>, or admin).")
@click.option("--project", "projects", multiple=True, metavar="PROJECT", help="A project (repeatable).")
@click.option("--role", type=click.Choice(ROLES), default=None, help="The role in every --project.")
@click.option("--admin", is_flag=True, help="An admin token: every project, and projects and tokens themselves.")
@click.option("--expires-in", "expires_in", default=None, metavar="DURATION",
              help="Stop working after this long: 45s, 15m, 12h, 30d, 2w (default: never).")
@target_options
@json_option
def create_command(name: str | None, projects: tuple[str, ...], role: str | None, admin: bool,
                   expires_in: str | None, store_url: str | None, server: str | None, token: str | None,
                   as_json: bool) -> None:
    """Make a bearer token with ROLE in each --project (or --admin); prints the secret once.

    Exit codes: 0 made, 2 usage, 5 store or server unreachable, 6 invalid input, 7 not authorized.
    """
    with handled(as_json):
        if admin and (projects or role is not None):
            raise InvalidInput("--admin is every project with every right: give it without --project and --role",
                               field="admin")
        if not admin and (not projects or role is None):
            raise InvalidInput("give --project P --role R (or --admin)", field="role")
        if any(not project.strip() for project in projects):
            raise InvalidInput("--project must name a project", field="project")
        roles = {} if admin else dict.fromkeys(projects, role or "")
        label = name or ("admin" if admin else f"{projects[0]}-{role}")
        lifetime = parse_duration(expires_in, "expires_in") if expires_in is not None else None
        client = _remote(store_url, server, token)
        if client is None:
            with open_store(str(store_url)) as store:
                info, secret = create_token(store, label, roles=roles, admin=admin, actor=default_actor(),
                                            expires_in=lifetime)
            made: dict[str, Any] = {"token": info.to_dict(), "secret": secret}
        else:
            with client:
                made = client.create_token(label, roles=roles, admin=admin, expires_in=lifetime)
    if as_json:
        emit_json(made)
        return
    _print_secret(made)


def _print_secret(made: dict[str, Any]) -> None:
    record = made["token"]
    roles = "admin" if record["kind"] == "admin" else ", ".join(f"{p}: {r}" for p, r in record["roles"].items())
    out().print(f"token [bold]{literal(record['token_id'])}[/] ({literal(record['name'])}, {literal(roles)})",
                highlight=False)
    out().print("secret (shown once; keep it, it is not stored):", highlight=False)
    out().print(str(made["secret"]), highlight=False, markup=False, soft_wrap=True)
    if record.get("expires_at"):
        out().print(f"expires at {record['expires_at']}", highlight=False, markup=False)


@tokens_group.command("list", short_help="List tokens (never their secrets).")
@target_options
@json_option
def list_command(store_url: str | None, server: str | None, token: str | None, as_json: bool) -> None:
    """List every token: id, name, kind, roles, who made it, expiry, last use, revoked or not (or corrupt: its
    stream does not verify, it authenticates nobody)."""
    with handled(as_json):
        client = _remote(store_url, server, token)
        if client is None:
            with open_store(str(store_url), create=False) as store:
                rows = [t.to_dict() for t in list_tokens(store)]
        else:
            with client:
                rows = client.list_tokens()["tokens"]
    if as_json:
        emit_json(rows)
        return
    table = Table(title="tokens")
    table.add_column("token", no_wrap=True, min_width=26)
    for column in ("name", "kind", "roles", "created by", "expires", "last used", "state"):
        table.add_column(column)
    for row in rows:
        broken = row.get("corruption")
        state = (f"[red]corrupt[/] (first bad event #{broken.get('first_bad_seq')}, {literal(str(broken.get('reason')))})"
                 if broken else "[red]revoked[/]" if row["revoked"] else "[yellow]expired[/]" if row.get("expired") else
                 f"rotated {literal(_short(row.get('rotated_at')))}" if row.get("rotated_at") else "")
        table.add_row(literal(row["token_id"]), literal(row["name"]), literal(row["kind"]),
                      literal(", ".join(f"{p}: {r}" for p, r in row["roles"].items())), literal(row["created_by"]),
                      literal(_short(row.get("expires_at")) or "never"),
                      literal(_short(row.get("last_used_at")) or "never"), state)
    out().print(table)


def _short(moment: str | None) -> str:
    """A ``recorded_at`` text to the minute (``2026-12-02 10:15``)."""
    return moment[:16].replace("T", " ") if moment else ""


@tokens_group.command("rotate", short_help="Give a token a new secret; printed once.")
@click.argument("token_id")
@click.option("--grace", "grace", default=None, metavar="DURATION",
              help="Let the old secret keep working this long (e.g. 1h; at most 7d). Default: it stops now.")
@target_options
@json_option
def rotate_command(token_id: str, grace: str | None, store_url: str | None, server: str | None,
                   token: str | None, as_json: bool) -> None:
    """Replace TOKEN_ID's secret: the new one is printed once, the old one stops working (after --grace).

    Roles, id and expiry stay; the token's Studio sessions end.
    """
    with handled(as_json):
        seconds = parse_duration(grace, "grace") if grace is not None else 0
        client = _remote(store_url, server, token)
        if client is None:
            with open_store(str(store_url), create=False) as store:
                info, secret = rotate_token(store, token_id, actor=default_actor(), grace_seconds=seconds)
            made: dict[str, Any] = {"token": info.to_dict(), "secret": secret}
        else:
            with client:
                made = client.rotate_token(token_id, seconds)
    if as_json:
        emit_json(made)
        return
    _print_secret(made)


@tokens_group.command("revoke", short_help="Revoke a token (at once).")
@click.argument("token_id")
@click.option("--reason", default=None, help="Why (recorded).")
@target_options
@json_option
def revoke_command(token_id: str, reason: str | None, store_url: str | None, server: str | None,
                   token: str | None, as_json: bool) -> None:
    """Revoke TOKEN_ID: every server over the store refuses it from now on."""
    with handled(as_json):
        client = _remote(store_url, server, token)
        if client is None:
            with open_store(str(store_url), create=False) as store:
                row = revoke_token(store, token_id, actor=default_actor(), reason=reason).to_dict()
        else:
            with client:
                row = client.revoke_token(token_id, reason)
    if as_json:
        emit_json(row)
        return
    out().print(f"token {row['token_id']} ({row['name']}) is revoked", highlight=False, markup=False)


__all__ = ["tokens_group"]

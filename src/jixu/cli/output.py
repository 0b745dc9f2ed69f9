"""Shared CLI plumbing: exit codes per error kind, JSON output, Rich tables."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console, ConsoleOptions, ConsoleRenderable, RichCast
from rich.markup import escape
from rich.segment import Segment

from jixu.errors import JixuError

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
"""Verification failed, or the thing inspected is corrupt / needs an operator."""
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_STORE = 5
EXIT_INVALID_INPUT = 6
EXIT_UNAUTHORIZED = 7
"""A remote command's token is missing, unknown, revoked, or lacks the role (HTTP 401/403)."""

_EXIT_BY_CODE: dict[str, int] = {
    "not_found": EXIT_NOT_FOUND,
    "store_not_found": EXIT_NOT_FOUND,
    "concurrency_conflict": EXIT_CONFLICT,
    "stale_fence": EXIT_CONFLICT,
    "idempotency_conflict": EXIT_CONFLICT,
    "lease_held": EXIT_CONFLICT,
    "store_error": EXIT_STORE,
    "store_locked": EXIT_STORE,
    "store_read_only": EXIT_STORE,
    "schema_too_new": EXIT_STORE,
    "unsupported_store_url": EXIT_USAGE,
    "missing_extra": EXIT_USAGE,
    "thread_not_found": EXIT_NOT_FOUND,
    "thread_corrupt": EXIT_CHECK_FAILED,
    "stream_corrupt": EXIT_CHECK_FAILED,
    "run_corrupt": EXIT_CHECK_FAILED,
    "request_corrupt": EXIT_CHECK_FAILED,
    "project_corrupt": EXIT_CHECK_FAILED,
    "key_unavailable": EXIT_STORE,
    "thread_busy": EXIT_CONFLICT,
    "turn_not_paused": EXIT_CONFLICT,
    "no_active_turn": EXIT_CONFLICT,
    "harness_closed": EXIT_CONFLICT,
    "incompatible_agent": EXIT_CONFLICT,
    "step_outcome_unknown": EXIT_CONFLICT,
    "step_mismatch": EXIT_CONFLICT,
    "step_failed": EXIT_CONFLICT,
    "effect_not_unknown": EXIT_CONFLICT,
    "effect_not_parked": EXIT_CONFLICT,
    "resolution_conflict": EXIT_CONFLICT,
    "turn_owned": EXIT_CONFLICT,
    "ownership_lost": EXIT_CONFLICT,
    # runs (jixu runs / jixu projects)
    "project_not_found": EXIT_NOT_FOUND,
    "run_not_found": EXIT_NOT_FOUND,
    "source_unavailable": EXIT_NOT_FOUND,
    "project_exists": EXIT_CONFLICT,
    "run_state_error": EXIT_CONFLICT,
    "run_owned": EXIT_CONFLICT,
    "provider_mismatch": EXIT_CONFLICT,
    "workspace_mismatch": EXIT_CHECK_FAILED,
    "provider_test_failed": EXIT_CHECK_FAILED,
    "git_error": EXIT_CHECK_FAILED,
    "request_not_found": EXIT_NOT_FOUND,
    "request_state_error": EXIT_CONFLICT,
    "request_owned": EXIT_CONFLICT,
    "receipt_conflict": EXIT_CONFLICT,
    "reconciliation_needs_proof": EXIT_CONFLICT,
    "already_reconciled": EXIT_CONFLICT,
    "resolution_needs_evidence": EXIT_CONFLICT,
    "agent_still_running": EXIT_CONFLICT,
    # the HTTP API (jixu remote, jixu tokens --server): problem codes map back to the same statuses
    "unauthorized": EXIT_UNAUTHORIZED,
    "forbidden": EXIT_UNAUTHORIZED,
    "request_id_reused": EXIT_CONFLICT,
    "request_in_progress": EXIT_CONFLICT,
    "agent_not_configured": EXIT_CONFLICT,
    "token_not_found": EXIT_NOT_FOUND,
    "request_too_large": EXIT_INVALID_INPUT,
}


def exit_code_for(error: JixuError) -> int:
    """The process exit status for ``error`` (invalid input unless listed)."""
    return _EXIT_BY_CODE.get(error.code, EXIT_INVALID_INPUT)


_CONTROL_CHARACTERS = {code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F,
                                                              *range(0x80, 0xA0))}
"""Every control character but the tab and the newline, as the escape that names it."""
_HAS_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with every control character but tab and newline written as its escape (``\\x1b``)."""
    return text.translate(_CONTROL_CHARACTERS) if _HAS_CONTROL.search(text) else text


class CLIConsole(Console):
    """The console every command prints through: the text it prints shows control characters as escapes.

    A model's reply, a tool's result or a file may hold terminal escape sequences (a hyperlink, a colour, a window
    title, a line erased); printed as they are, they would act on the operator's terminal. Only the text of what
    is rendered is changed (Rich's own styles and control codes are not text).
    """

    def render(self, renderable: ConsoleRenderable | RichCast | str,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            text = segment.text
            if segment.control is None and text and _HAS_CONTROL.search(text):
                yield Segment(visible(text), segment.style)
            else:
                yield segment


console = CLIConsole(soft_wrap=True, emoji=False)
err_console = CLIConsole(stderr=True, soft_wrap=True, emoji=False)
"""The consoles. Emoji codes stay off: ``:warning:`` in a model's reply is printed as written, not as a glyph."""


def literal(value: object) -> str:
    """``value`` as text that Rich prints exactly as written inside the CLI's own markup.

    The one rule for every value the CLI did not write itself (what the store holds, a server answered, a model,
    a tool, an operator or a file said, an exception's message, a command-line argument): it is data, never
    console markup, so ``[/bold]`` in a reply neither breaks the output nor styles it, and
    ``[link=…]`` never becomes a link. Escape at the point of interpolation (after trimming), once; a line printed
    with ``markup=False`` takes the raw value instead. Trailing backslashes are written doubled and closed by an
    empty tag, so they print as written whether markup follows or not (Rich's ``escape`` doubles a single one,
    which then shows twice at the end of a cell).
    """
    text = value if isinstance(value, str) else str(value)
    trailing = len(text) - len(text.rstrip("\\"))
    if not trailing:
        return escape(text)
    return escape(text[:-trailing]).rstrip("\\") + "\\" * (2 * trailing) + "[bold][/bold]"


def emit_json(value: Any) -> None:
    """Print ``value`` as one JSON document on stdout."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False))


@contextmanager
def handled(as_json: bool) -> Iterator[None]:
    """Turn a :class:`JixuError` into a clear message (or JSON error) and its exit code."""
    try:
        yield
    except JixuError as error:
        if as_json:
            click.echo(json.dumps({"error": error.to_dict()}, ensure_ascii=False))
        else:
            # The message is plain text: brackets in it (e.g. "dict[str, Provider]") must not be read as markup.
            err_console.print(f"[bold red]error[/] ({literal(error.code)}): {literal(error.message)}", highlight=False)
        sys.exit(exit_code_for(error))


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--json`` flag every inspecting command has."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")(fn)

"""A provider that runs an external agent CLI (any command) in the run's workspace.

The command runs without a shell, in the workspace, in its own process group
(killed with SIGKILL on timeout or cancellation; recorded in the run's journal
before the command starts, see :mod:`jixu.runs.processes`), with:

* stdin: the brief;
* environment: the caller's, plus the configured ``env``, plus
  ``JIXU_RUN_ID``, ``JIXU_BRIEF``, ``JIXU_ATTEMPT``, ``JIXU_WORKSPACE`` and
  ``JIXU_REPAIR_OF`` (the failed checks' evidence as JSON for a repair attempt,
  else empty) and ``JIXU_KNOWLEDGE`` (the run's knowledge context as JSON, or empty).

How its end maps to the run (the convention an agent CLI or a wrapper script follows):

| the command | means |
|---|---|
| exit 0 | done; the summary is the last non-empty line of stdout |
| a stderr line ``JIXU_PROVIDER_ERROR: <kind> [retry_after=<seconds>] [message]`` and a non-zero exit | ``ProviderError(kind)``; kind is ``rate_limit``, ``transient``, ``quota``, ``authentication`` or ``invalid`` (the last such line wins) |
| exit 69 (``EX_UNAVAILABLE``) | ``rate_limit`` (automatic retry) |
| exit 75 (``EX_TEMPFAIL``) | ``transient`` (automatic retry) |
| exit 76 | ``quota`` (waits for an operator) |
| exit 77 (``EX_NOPERM``) | ``authentication`` (waits for an operator) |
| timeout | ``transient`` (the process group is killed; the work so far stays in the workspace) |
| any other exit, or it cannot start | ``invalid``: the implementation failed |

Only the names of ``env`` entries are part of the provider snapshot (values
may be secrets).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from jixu.ledger.encoding import JSONObject
from jixu.runs.checks import digest_output, run_process
from jixu.runs.providers import (
    ImplementContext,
    ImplementResult,
    ProviderError,
    ProviderErrorKind,
    ProviderTest,
)

EXIT_CODES: Final[dict[int, ProviderErrorKind]] = {69: "rate_limit", 75: "transient", 76: "quota",
                                                   77: "authentication"}
"""Exit statuses that map to provider error kinds (see the module docstring)."""
MARKER: Final = "JIXU_PROVIDER_ERROR:"
_KINDS: Final[frozenset[str]] = frozenset({"rate_limit", "transient", "quota", "authentication", "invalid"})
_RETRY_AFTER = re.compile(r"^retry_after=([0-9]+(?:\.[0-9]+)?)$")


def parse_marker(stderr: str) -> tuple[ProviderErrorKind, float | None, str] | None:
    """The last ``JIXU_PROVIDER_ERROR:`` line of ``stderr`` as ``(kind, retry_after, message)``, if any."""
    found: tuple[ProviderErrorKind, float | None, str] | None = None
    for raw in stderr.splitlines():
        line = raw.strip()
        if not line.startswith(MARKER):
            continue
        words = line[len(MARKER):].split()
        if not words or words[0] not in _KINDS:
            continue
        kind: ProviderErrorKind = words[0]  # type: ignore[assignment]
        retry_after: float | None = None
        rest = words[1:]
        if rest and (match := _RETRY_AFTER.match(rest[0])):
            retry_after = float(match.group(1))
            rest = rest[1:]
        found = (kind, retry_after, " ".join(rest))
    return found


class CommandProvider:
    """Run ``argv`` in the workspace for each implementation attempt (see the module docstring)."""

    kind = "command"

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 3600.0,
                 *, test_argv: Sequence[str] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a provider needs a name")
        if not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
            raise ValueError("argv must be a non-empty list of strings")
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        self._name = name
        self.argv = list(argv)
        self.env = dict(env or {})
        self.timeout = float(timeout)
        self.test_argv = list(test_argv) if test_argv is not None else None

    @property
    def name(self) -> str:
        return self._name

    def settings(self) -> JSONObject:
        """argv, the names (not values) of the extra environment, the timeout and the test command."""
        return {"argv": list(self.argv), "env_keys": sorted(self.env), "timeout_s": self.timeout,
                "test_argv": None if self.test_argv is None else list(self.test_argv)}

    def _environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.env, **(extra or {})}

    async def test(self) -> ProviderTest:
        """The executable exists; and ``test_argv``, when configured, exits 0 within 60 s."""
        executable = self.argv[0]
        if shutil.which(executable, path=self._environment().get("PATH")) is None:
            return ProviderTest(False, f"{executable!r} is not an executable on PATH")
        if self.test_argv is None:
            return ProviderTest(True, f"{executable} found")
        with tempfile.TemporaryFile() as output, tempfile.TemporaryDirectory() as scratch:
            status, timed_out, error = await run_process(self.test_argv, Path(scratch), 60.0,
                                                         env=self._environment(), stdout=output)
            excerpt = digest_output(output)[2]
        if status == 0:
            return ProviderTest(True, excerpt.strip()[-500:] or "test command passed")
        why = error or ("timed out" if timed_out else f"exit {status}")
        return ProviderTest(False, f"test command failed ({why}): {excerpt.strip()[-500:]}")

    async def implement(self, workspace: Path, context: ImplementContext) -> ImplementResult:
        """Run the command (see the module docstring for how its end maps to a result or a ProviderError)."""
        extra = {"JIXU_RUN_ID": context.run_id, "JIXU_BRIEF": context.brief, "JIXU_ATTEMPT": str(context.attempt),
                 "JIXU_WORKSPACE": str(workspace),
                 "JIXU_REPAIR_OF": json.dumps(context.repair_of, sort_keys=True) if context.repair_of else "",
                 "JIXU_KNOWLEDGE": json.dumps(context.knowledge, sort_keys=True) if context.knowledge else ""}
        started = time.monotonic()
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            status, timed_out, error = await run_process(self.argv, workspace, self.timeout,
                                                         env=self._environment(extra), stdin_text=context.brief,
                                                         stdout=stdout, stderr=stderr,
                                                         started=context.process_started)
            out_digest, out_size, out_excerpt = digest_output(stdout)
            _err_digest, _err_size, err_excerpt = digest_output(stderr)
        details: JSONObject = {"exit_status": status, "timed_out": timed_out,
                               "duration_s": round(time.monotonic() - started, 3), "output_digest": out_digest,
                               "output_bytes": out_size, "stdout_excerpt": out_excerpt[-2000:],
                               "stderr_excerpt": err_excerpt[-2000:]}
        if error is not None:
            raise ProviderError(f"{self._name}: cannot start {self.argv[0]!r}: {error}", kind="invalid", **details)
        if timed_out:
            raise ProviderError(f"{self._name}: no result within {self.timeout:.0f}s (process group killed)",
                                kind="transient", **details)
        if status == 0:
            lines = [line.strip() for line in out_excerpt.splitlines() if line.strip()]
            return ImplementResult(lines[-1][:2000] if lines else f"{self._name} exited 0", details)
        marker = parse_marker(err_excerpt)
        if marker is not None:
            kind, retry_after, message = marker
            raise ProviderError(f"{self._name}: {message or kind}", kind=kind, retry_after=retry_after, **details)
        mapped = EXIT_CODES.get(status) if status is not None else None
        raise ProviderError(f"{self._name} exited {status}: {err_excerpt.strip()[-500:]}",
                            kind=mapped or "invalid", **details)


__all__ = ["EXIT_CODES", "MARKER", "CommandProvider", "parse_marker"]

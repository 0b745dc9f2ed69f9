"""Remote task providers: deploy, rollback and knowledge writes carried out by an external command.

Like a publisher (:mod:`jixu.runs.publication`), a remote provider does I/O
and decides nothing about durability: the execution request records the
intent and dispatch marker before :meth:`RemoteProvider.perform` and the
evidence it reports after. Its evidence is the provider's own identifier of
what happened: a job id (``job_id``) or a version (``version``). Without one a
``perform`` that returned is not a receipt, and the outcome stays unknown.

:class:`CommandRemote` runs ``argv + [MODE]`` (``MODE`` is ``preflight``,
``perform`` or ``inspect``) in the run's workspace, without a shell, in its own
process group, with ``JIXU_TASK_KIND``, ``JIXU_RUN_ID``, ``JIXU_REQUEST_ID``,
``JIXU_SOURCE_COMMIT``, ``JIXU_SOURCE_TREE``, ``JIXU_PARAMETERS`` (JSON),
``JIXU_IDEMPOTENCY_KEY`` and ``JIXU_WORKSPACE`` in its environment. Its
contract:

| mode | exit 0 | otherwise |
|---|---|---|
| ``preflight`` (must change nothing) | may proceed | a rejection: the request fails, nothing happened |
| ``perform`` | the last stdout line is a JSON object with ``job_id`` or ``version`` | the outcome is unknown |
| ``inspect`` (read-only) | the last stdout line is a JSON object: what the provider shows now | recorded as such |
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from jixu.errors import InvalidInput, JixuError
from jixu.ledger.encoding import JSONObject
from jixu.runs.checks import digest_output, run_process
from jixu.runs.publication import RemoteRejected

REMOTE_TASK_KINDS: Final = ("deploy", "rollback", "knowledge_write")
DEFAULT_TIMEOUT_S: Final = 600.0


@dataclass(frozen=True, slots=True)
class RemoteContext:
    """What a remote task is about, as recorded in its intent."""

    run_id: str
    request_id: str
    kind: str
    workspace: Path
    source_commit: str
    tree: str
    parameters: JSONObject
    idempotency_key: str


class RemoteProvider(Protocol):
    """The interface of deploy / rollback / knowledge-write providers."""

    @property
    def name(self) -> str:
        """The configured provider's name."""
        ...

    @property
    def kind(self) -> str:
        """``command`` (or another provider kind)."""
        ...

    def settings(self) -> JSONObject:
        """The configuration without secrets (recorded in the request)."""
        ...

    async def preflight(self, context: RemoteContext) -> None:
        """Check that the task can be attempted; :class:`~jixu.runs.publication.RemoteRejected` if not."""
        ...

    async def perform(self, context: RemoteContext) -> JSONObject:
        """Do it; the provider-reported evidence (``job_id`` or ``version``)."""
        ...

    async def inspect(self, context: RemoteContext) -> JSONObject:
        """What the provider shows now for this task; read-only."""
        ...


class CommandRemote:
    """A remote provider that runs an external command (see the module docstring for its contract)."""

    kind = "command"

    def __init__(self, name: str, argv: Sequence[str], *, kinds: Sequence[str] = REMOTE_TASK_KINDS,
                 env: Mapping[str, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise InvalidInput("argv must be a non-empty list of non-empty strings", field="argv")
        unknown = sorted(set(kinds) - set(REMOTE_TASK_KINDS))
        if unknown or not kinds:
            raise InvalidInput(f"kinds {unknown or list(kinds)} must be some of {list(REMOTE_TASK_KINDS)}",
                               field="kinds")
        if not 0 < timeout_s <= 86_400:
            raise InvalidInput("timeout_s must be in (0, 86400]", field="timeout_s")
        self._name = name
        self.argv = list(argv)
        self.kinds = tuple(kinds)
        self._env = dict(env or {})
        self.timeout_s = float(timeout_s)

    @property
    def name(self) -> str:
        """The configured name."""
        return self._name

    def settings(self) -> JSONObject:
        """argv, task kinds, timeout and the *names* of extra environment variables (values may be secrets)."""
        return {"argv": self.argv, "kinds": list(self.kinds), "env": sorted(self._env), "timeout_s": self.timeout_s}

    async def _call(self, mode: str, context: RemoteContext) -> tuple[int | None, JSONObject | None, str]:
        if context.kind not in self.kinds:
            raise RemoteRejected(f"provider {self.name!r} does not do {context.kind} tasks (only {list(self.kinds)})")
        env = {**os.environ, **self._env, "JIXU_TASK_KIND": context.kind, "JIXU_RUN_ID": context.run_id,
               "JIXU_REQUEST_ID": context.request_id, "JIXU_SOURCE_COMMIT": context.source_commit,
               "JIXU_SOURCE_TREE": context.tree, "JIXU_PARAMETERS": json.dumps(context.parameters, sort_keys=True),
               "JIXU_IDEMPOTENCY_KEY": context.idempotency_key, "JIXU_WORKSPACE": str(context.workspace)}
        cwd = context.workspace if context.workspace.is_dir() else Path(tempfile.gettempdir())
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            status, timed_out, start_error = await run_process([*self.argv, mode], cwd, self.timeout_s, env=env,
                                                               stdout=stdout, stderr=stderr)
            _digest, _size, out = digest_output(stdout)
            _digest, _size, err = digest_output(stderr)
        if start_error is not None or timed_out:
            return None, None, start_error or f"timed out after {self.timeout_s:.0f}s"
        lines = [line for line in out.splitlines() if line.strip()]
        reported: JSONObject | None = None
        if lines:
            try:
                parsed = json.loads(lines[-1])
            except ValueError:
                parsed = None
            reported = parsed if isinstance(parsed, dict) else None
        return status, reported, err.strip()[-2000:]

    async def preflight(self, context: RemoteContext) -> None:
        """``argv preflight``: exit 0 or a rejection."""
        status, _reported, err = await self._call("preflight", context)
        if status != 0:
            raise RemoteRejected(f"{self.name} preflight refused (exit {status}): {err or 'no message'}",
                                 exit_status=status)

    async def perform(self, context: RemoteContext) -> JSONObject:
        """``argv perform``: the reported ``job_id``/``version``; anything else raises (the outcome is unknown)."""
        status, reported, err = await self._call("perform", context)
        if status != 0:
            raise JixuError(f"{self.name} perform exited {status}: {err or 'no message'}", exit_status=status)
        evidence = reported or {}
        if not any(isinstance(evidence.get(k), str) and evidence.get(k) for k in ("job_id", "version")):
            raise JixuError(f"{self.name} perform reported no job_id or version on its last stdout line",
                            reported=evidence)
        return {**evidence, "kind": context.kind}

    async def inspect(self, context: RemoteContext) -> JSONObject:
        """``argv inspect``: whatever the provider shows now (read-only by contract)."""
        status, reported, err = await self._call("inspect", context)
        return {"exit_status": status, "reported": reported, "stderr": err[-500:]}


__all__ = ["REMOTE_TASK_KINDS", "CommandRemote", "RemoteContext", "RemoteProvider"]

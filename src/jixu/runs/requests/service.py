"""The execution-request service: admission, execution and reconciliation over one store."""

from __future__ import annotations

from jixu.runs.requests.admission import Admission
from jixu.runs.requests.execution import Execution
from jixu.runs.requests.reconciliation import Reconciliation


class ExecutionRequests(Admission, Execution, Reconciliation):
    """Admit, execute, list, inspect and reconcile a store's execution requests (used through
    :class:`~jixu.runs.Runs`)."""


__all__ = ["ExecutionRequests"]

"""The work queue's policy: projects as the queue's groups, their limits, and the fairness between them.

The ledger keeps the queue as storage (:meth:`jixu.ledger.Store.claim_work`): items by key, each in a group,
and an atomic claim that takes a census of the queue and claims the oldest claimable item of the first group
an order names. Here is that order. A work item's group is its project (a thread's metadata ``project``, a
run's project); a claim keeps the live claims below a global limit and each project below its own
(``project_limits[p]``, else ``default_project_limit``, else only the global limit; 0 holds a project back),
and ranks the projects it may serve by (fewest live claims, served longest ago, oldest claimable item, name).
So one project's backlog never holds every slot, and even a single worker takes turns between projects.

The limits hold across every process and machine sharing a store because the census and the claim are one
transaction of the store's, serialised with every other claim; give every worker of a deployment the same
limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from jixu.errors import InvalidInput
from jixu.ledger import Store
from jixu.ledger.store import QueueCensus, WorkClaim, WorkItem
from jixu.threads.log import DEFAULT_PROJECT  # a thread records its project when it is made

_MAX_PROJECT = 100
_MAX_LIMIT = 1_000_000


def check_project(project: object) -> str:
    """Return ``project`` if it is a usable project name for the queue (1-100 printable characters)."""
    if not isinstance(project, str) or not project or len(project) > _MAX_PROJECT or not project.isprintable():
        raise InvalidInput(f"project {project!r} must be 1-100 printable characters", field="project")
    return project


@dataclass(frozen=True, slots=True)
class WorkLimits:
    """Concurrency bounds a claimer respects: live claims in total and per project."""

    global_limit: int
    project_limits: dict[str, int]
    default_project_limit: int

    def limit_of(self, project: str) -> int:
        """The most live claims ``project`` may have."""
        return self.project_limits.get(project, self.default_project_limit)

    def order(self, census: QueueCensus) -> list[str]:
        """The projects a claim under these limits tries, best first (a :data:`~jixu.ledger.store.ClaimOrder`)."""
        return claim_order(census.live, census.oldest, census.last_claimed, self)


def _check_limit(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _MAX_LIMIT:
        raise InvalidInput(f"{name} {value!r} must be an integer between {minimum} and {_MAX_LIMIT}", field=name)
    return value


def check_limits(global_limit: object, project_limits: object, default_project_limit: object) -> WorkLimits:
    """Validate claim limits: ``global_limit`` >= 1, each project limit >= 0 (0 holds a project back).

    ``default_project_limit`` ``None`` means a project is bounded by the global limit only.
    """
    total = _check_limit(global_limit, "global_limit", 1)
    if project_limits is None:
        project_limits = {}
    if not isinstance(project_limits, dict):
        raise InvalidInput("project_limits must be a dict of project name -> limit", field="project_limits")
    limits = {check_project(p): _check_limit(n, f"project limit of {p!r}", 0) for p, n in project_limits.items()}
    default = total if default_project_limit is None else _check_limit(
        default_project_limit, "default_project_limit", 0)
    return WorkLimits(total, limits, default)


def claim_order(live: Mapping[str, int], oldest: Mapping[str, tuple[float, int]], last_claimed: Mapping[str, int],
                limits: WorkLimits) -> list[str]:
    """Projects a claimer should try, best first (pure); empty when the global limit is reached.

    ``live`` counts live claims per project, ``oldest`` gives each project's
    oldest claimable item as ``(ready_at, position)``, ``last_claimed`` the
    number of each project's latest claim (claims are numbered 1, 2, … per
    store, so the order is exact whatever the clock's resolution). Only projects under their own limit
    are eligible; fewest live claims first; among equals, the project served
    longest ago (never served first), then the one whose oldest item waited
    longest. So a project's backlog cannot hold every slot, and even a single
    worker takes turns instead of draining one backlog first.
    """
    if sum(live.values()) >= limits.global_limit:
        return []
    eligible = [p for p in oldest if live.get(p, 0) < limits.limit_of(p)]
    return sorted(eligible, key=lambda p: (live.get(p, 0), last_claimed.get(p, 0), oldest[p], p))


def claim(store: Store, owner: str, ttl: float, *, global_limit: int, project_limits: dict[str, int] | None = None,
          default_project_limit: int | None = None) -> WorkClaim | None:
    """Atomically claim one ready work item for ``owner`` for ``ttl`` seconds of store time, or ``None``.

    Ready means pending with ``ready_at`` reached, or claimed with a claim
    expired by the store's clock. Live claims stay below ``global_limit``
    in total and below each project's limit (``project_limits``, else
    ``default_project_limit``, else only the global limit), counted in the
    claim's own transaction. Fair across projects: the eligible project with
    the fewest live claims wins (ties: the one served longest ago, then the
    one whose oldest ready item waited longest), then its oldest item. The
    claim's epoch is the item's previous epoch + 1.
    """
    limits = check_limits(global_limit, project_limits, default_project_limit)
    return store.claim_work(owner, ttl, limits.order)


def claim_some(store: Store, owner: str, ttl: float, count: int, *, global_limit: int,
               project_limits: dict[str, int] | None = None,
               default_project_limit: int | None = None) -> list[WorkClaim]:
    """Up to ``count`` claims, each as :func:`claim` makes one (the limits and the fairness counted again
    for each), in one transaction: a worker with ``count`` free slots takes them with one commit."""
    limits = check_limits(global_limit, project_limits, default_project_limit)
    return store.claim_works(owner, ttl, limits.order, count)


@dataclass(frozen=True, slots=True, eq=False)
class QueuedWork(WorkItem):
    """A work item as jixu's interfaces tell it: the ledger's item, whose group is a project.

    Equal to the :class:`~jixu.ledger.store.WorkItem` it tells (the same item, named otherwise).
    """

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkItem):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(WorkItem))

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(WorkItem)))

    @property
    def project(self) -> str:
        """The project the item counts against (the ledger's group)."""
        return self.group

    @classmethod
    def of(cls, item: WorkItem) -> QueuedWork:
        """``item`` told as queued work."""
        return cls(**{f.name: getattr(item, f.name) for f in fields(item)})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, the group named ``project``."""
        return {("project" if name == "group" else name): value for name, value in WorkItem.to_dict(self).items()}


def queued_work(store: Store, key: str) -> QueuedWork | None:
    """The work item ``key`` as the store sees it now, or ``None``."""
    item = store.get_work(key)
    return QueuedWork.of(item) if item is not None else None


def enqueue(store: Store, key: str, project: str) -> QueuedWork:
    """Put the work item ``key`` in the queue of ``project`` (idempotent; see :meth:`jixu.ledger.Store.enqueue`)."""
    return QueuedWork.of(store.enqueue(key, check_project(project)))


__all__ = ["DEFAULT_PROJECT", "QueuedWork", "WorkLimits", "check_limits", "check_project", "claim",
           "claim_order", "claim_some", "enqueue", "queued_work"]

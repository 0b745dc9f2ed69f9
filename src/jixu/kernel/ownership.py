"""Claims and heartbeats: the one fence mechanism of threads' turns, runs and the workers that execute them.

A claim takes a stream's lease (``thread/<id>/turn``, ``run/<id>/owner``) for
one owner at a new epoch and records the ``*.claimed`` event fenced by it; the
owner then renews the lease every ``ttl / 3`` seconds against the store's clock
for as long as it works (:class:`Session`), and every event it appends is
fenced by the claim. A claim classifies what it took over:

==========================  ======================================================
``claimed``                 no lease existed
``continued``               the previous holder released it
``reclaimed_by_same_owner`` this owner name held it (a restarted process)
``took_over_expired``       another owner's lease expired by the store's clock
``took_over_dead_owner``    another owner's live lease, whose process is proven gone
==========================  ======================================================

**Owner death as evidence** (issue 23). Every claim records the claiming
process's identity (:func:`process_identity`: boot id, pid namespace, pid and
the process's start time). A claimant on the same kernel (same boot id and pid
namespace) that finds no process with that pid and start time has proof that
the owner is gone (:func:`owner_gone`): it takes the lease over at once, live
or not, and its ``*.claimed`` event carries the proof. A live owner, or one on
another machine, in another container or before a reboot, keeps its lease
until it expires by the store's clock.

**Process groups** (issue 23). The processes a run starts (an agent CLI, a
check) each lead a process group of their own; :func:`group_identity` records
the leader the same way (pid, start time, boot id, pid namespace, plus
``pgid``), and :func:`group_members` / :func:`group_gone` answer, by the same
rule, whether any process of that group still runs: a recycled pid is never
taken for the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from jixu.errors import ConcurrencyError, FencingError, JixuError, LeaseHeld
from jixu.kernel.batched import lease_renewals, lease_takes
from jixu.kernel.commits import Commits
from jixu.kernel.shutdown import ServingTask
from jixu.kernel.writer import StreamWriter
from jixu.ledger.event import NewEvent, PreparedEvent
from jixu.ledger.store import Fence, Lease, LeaseTake, Store

_log = logging.getLogger("jixu.kernel.ownership")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError:
        return None


def _parse_stat(stat: str | None) -> tuple[int, int, int] | None:
    """``(parent pid, process group, start time in clock ticks after boot)`` from a ``/proc/<pid>/stat`` text, or
    None when there is none or the process is a zombie (it has exited already)."""
    if stat is None:
        return None
    try:
        # Fields after the command name (which may hold spaces and parentheses): state is the 3rd field.
        fields = stat[stat.rindex(")") + 2:].split()
        return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[2]), int(fields[19]))
    except (ValueError, IndexError):
        return None


def _stat(pid: int) -> tuple[int, int] | None:
    """``(process group, start time in clock ticks after boot)`` of a running process ``pid`` (Linux), or None
    when there is none (a zombie has exited already)."""
    found = _parse_stat(_read(f"/proc/{pid}/stat"))
    return None if found is None else (found[1], found[2])


_Scan = dict[int, tuple[int, int, int]]
"""Running processes: pid -> (parent pid, process group, start time in clock ticks after boot)."""

_SCANNED: tuple[float, _Scan] | None = None


def _processes(max_age: float = 0.0) -> _Scan:
    """Every running process of this pid namespace (Linux; ``{}`` elsewhere); a scan at most ``max_age`` seconds
    old may be answered again (a list of many threads whose holders died scans ``/proc`` once)."""
    global _SCANNED
    now = time.monotonic()
    if max_age > 0 and _SCANNED is not None and now - _SCANNED[0] <= max_age:
        return _SCANNED[1]
    found: _Scan = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = []
    for entry in entries:
        if entry.isdigit() and (parsed := _parse_stat(_read(f"/proc/{entry}/stat"))) is not None:
            found[int(entry)] = parsed
    _SCANNED = (now, found)
    return found


def _descendants_in(scan: _Scan, pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _group, _started) in scan.items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if child not in found:
            found.add(child)
            todo.extend(children.get(child, []))
    return found


def _ancestors_in(scan: _Scan, pid: int) -> set[int]:
    found: set[int] = set()
    parent = scan.get(pid, (0, 0, 0))[0]
    while parent > 0 and parent not in found:
        found.add(parent)
        parent = scan.get(parent, (0, 0, 0))[0]
    return found


def descendants(pid: int) -> list[int]:
    """The running processes whose chain of parents leads to ``pid`` (Linux; ``[]`` elsewhere): a process's
    children, theirs, and so on, whatever group or session they moved to."""
    return sorted(_descendants_in(_processes(), pid))


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot, Linux), or None when there is none."""
    found = _stat(pid)
    return None if found is None else found[1]


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


_IDENTITY: tuple[int, dict[str, Any]] | None = None


def process_identity() -> dict[str, Any]:
    """What identifies this process on this machine, for a later claimant to prove it gone: ``host``,
    ``boot_id``, ``pid_namespace``, ``pid`` and ``start_time`` (the last three None where unknown), plus
    ``pgid`` (= ``pid``) while it leads its process group: the processes its tools start are then found after it
    died (:func:`left_running`)."""
    global _IDENTITY
    pid = os.getpid()
    if _IDENTITY is None or _IDENTITY[0] != pid:  # a forked child is another process
        boot = _read("/proc/sys/kernel/random/boot_id")
        _IDENTITY = (pid, {"host": socket.gethostname(), "boot_id": boot.strip() if boot else None,
                           "pid_namespace": _pid_namespace(), "pid": pid, "start_time": _start_time(pid)})
    identity = dict(_IDENTITY[1])
    if os.getpgrp() == pid:
        identity["pgid"] = pid
    return identity


def owner_gone(identity: object) -> dict[str, Any] | None:
    """The proof that the process ``identity`` (a claim's ``process``) no longer runs, or None when that cannot
    be proven from here: another machine, pid namespace or boot, an identity without a start time, or the
    process alive (or this very process)."""
    checked = _checkable(identity)
    if checked is None:
        return None
    pid, started, here = checked
    if pid == here["pid"]:
        return None
    found = _start_time(pid)
    if found == started:
        return None
    assert isinstance(identity, dict)
    return {"process": _named(identity),
            "found": "no such process" if found is None else f"pid {pid} now belongs to a process started at "
                                                               f"{found} (clock ticks after boot)",
            "checked_by": here}


def another_live_process(identity: object) -> bool:
    """Whether ``identity`` (a claim's ``process``) is a process of this machine other than this one that still
    runs (its pid started at the recorded time): one that shares this process's owner name, against the rule
    that an owner name is unique among running processes (two CLI commands with the default ``--owner``)."""
    checked = _checkable(identity)
    if checked is None:
        return False
    pid, started, here = checked
    return pid != here["pid"] and _start_time(pid) == started


def own_lease(lease: Lease, owner: str | None, holder_process: Callable[[Lease], object] | None) -> bool:
    """Whether ``lease`` is ``owner``'s own: held under its name, and not by :func:`another_live_process` (what
    ``holder_process(lease)``, the identity its holder's claim recorded, says). Its own lease a process takes
    back at once (a restart); one a live process of the same name holds is another process's."""
    if owner is None or lease.owner != owner:
        return False
    return holder_process is None or not another_live_process(holder_process(lease))


_IDENTITY_KEYS = ("host", "boot_id", "pid_namespace", "pid", "start_time")


def _named(identity: dict[str, Any]) -> dict[str, Any]:
    return {k: identity.get(k) for k in (*_IDENTITY_KEYS, *(("pgid",) if "pgid" in identity else ()))}


def _checkable(identity: object) -> tuple[int, int, dict[str, Any]] | None:
    """``(pid, start time, this process's identity)`` when ``identity`` names a process that can be looked at
    from here (this kernel: the same boot id and pid namespace), else None."""
    if not isinstance(identity, dict):
        return None
    pid, started = identity.get("pid"), identity.get("start_time")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or isinstance(started, bool) \
            or not isinstance(started, int):
        return None
    here = process_identity()
    if here["boot_id"] is None or identity.get("boot_id") != here["boot_id"] \
            or identity.get("pid_namespace") != here["pid_namespace"]:
        return None
    return pid, started, here


def group_identity(leader: int) -> dict[str, Any]:
    """The identity of the process group that ``leader`` (a child this process started in a session of its
    own) leads: :func:`process_identity`'s fields for the leader, plus ``pgid`` (= its pid)."""
    found = _stat(leader)
    return {**process_identity(), "pid": leader, "pgid": leader, "start_time": None if found is None else found[1]}


def group_members(identity: object) -> list[int] | None:
    """The pids of the processes still running in the group ``identity`` (:func:`group_identity`) records:
    ``[]`` when none remains, None when that cannot be checked from here (another machine, pid namespace or
    boot, or an identity without a start time).

    A member is a process whose process group is the leader's pid and which started no earlier than the
    leader. The leader's pid in use by a process with another start time proves the group empty: the kernel
    gives a pid out again only once no process has it as its process group.
    """
    checked = _checkable(identity)
    if checked is None:
        return None
    leader, started, _here = checked
    return _members_in(_processes(), leader, started)


def _members_in(scan: _Scan, leader: int, started: int) -> list[int]:
    """The processes of ``scan`` in the group ``leader`` (started at ``started``) leads, started no earlier than
    it; ``[]`` when the leader's pid belongs to a process with another start time."""
    reused = scan.get(leader)
    if reused is not None and reused[2] != started:
        return []  # the pid is used again: the kernel gives a pid out only once no group has it
    return sorted(pid for pid, (_parent, group, start) in scan.items() if group == leader and start >= started)


def group_gone(identity: object) -> dict[str, Any] | None:
    """The proof that no process of the group ``identity`` records runs any more, or None when one does or
    that cannot be proven from here (see :func:`group_members`)."""
    members = group_members(identity)
    if members is None or members:
        return None
    assert isinstance(identity, dict)
    return {"process": _named(identity), "found": "no process of the group remains",
            "checked_by": process_identity()}


LEFT_RUNNING_MARGIN_S = 5.0
"""Seconds past a dead holder's lease expiry that a process it started may have started (the clocks of the store and
of this machine may differ that much): one started later is not its."""


def left_running(identity: object, alive_until: float | None = None) -> list[int]:
    """The processes that the gone process ``identity`` (a claim's ``process``) left running: what still runs in
    the process group it led (a tool's subprocess, its children), started between it and ``alive_until`` (when
    its lease expired, by the store's clock: the holder renewed it while it lived; plus
    :data:`LEFT_RUNNING_MARGIN_S`), other than this process, its ancestors and its descendants. ``[]`` when it did
    not lead its group (its children cannot be told from others), still runs, cannot be checked from here, or
    left nothing.

    The bound keeps a group that a later process made with the holder's recycled pid (a daemon's ``setsid``) from
    being taken for the holder's, however long its claim stays; a later process that descends from one within
    it (a tool's shell script starting its next step) is the holder's all the same. A ``/proc`` scan up to a
    second old is used: a group found empty cannot have gained a member since (only a member can start one)."""
    if not isinstance(identity, dict) or "pgid" not in identity or identity.get("pgid") != identity.get("pid") \
            or owner_gone(identity) is None:
        return []
    scan = _processes(max_age=1.0)
    latest = _ticks_at(alive_until + LEFT_RUNNING_MARGIN_S) if alive_until is not None else None
    here = os.getpid()
    mine = {here} | _ancestors_in(scan, here) | _descendants_in(scan, here)
    members = [pid for pid in _members_in(scan, int(identity["pid"]), int(identity["start_time"]))
               if pid not in mine]
    early = {pid for pid in members if latest is None or scan[pid][2] <= latest}
    # A later one started by one of those (a script's next step) is the holder's too: a recycled pid's group
    # descends from none of them.
    return [pid for pid in members if pid in early or not early.isdisjoint(_ancestors_in(scan, pid))]


def _ticks_at(wall: float) -> int | None:
    """``wall`` (seconds since the epoch) as a process start time (clock ticks after boot), or None unknown."""
    booted = _boot_time()
    if booted is None:
        return None
    return int((wall - booted) * os.sysconf("SC_CLK_TCK"))


_BOOTED: list[float | None] = []


def _boot_time() -> float | None:
    """When this machine booted (``btime`` of ``/proc/stat``, seconds since the epoch), or None."""
    if not _BOOTED:
        text = _read("/proc/stat") or ""
        line = next((row for row in text.splitlines() if row.startswith("btime ")), None)
        _BOOTED.append(float(line.split()[1]) if line else None)
    return _BOOTED[0]


STOP_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when a group of processes is stopped."""
_KILL_WAIT_S = 10.0


def wait_group_gone(identity: dict[str, Any], timeout: float) -> list[int] | None:
    """Wait up to ``timeout`` seconds until no process of the group remains; the members still there
    (``[]``: none), or None when the group cannot be checked from here."""
    deadline = time.monotonic() + timeout
    while True:
        members = group_members(identity)
        if not members or time.monotonic() >= deadline:
            return members
        time.sleep(0.02)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_group(identity: dict[str, Any], grace: float = STOP_GRACE_S) -> dict[str, Any]:
    """Stop the recorded group and wait for it (blocking): SIGTERM, up to ``grace`` seconds, SIGKILL.

    What happened: ``outcome`` (``gone``: nothing was running; ``terminated``:
    SIGTERM sufficed; ``killed``: SIGKILL was needed; ``still_running``:
    processes remain even after SIGKILL; ``unverifiable``: the group cannot be
    checked from here, nothing was signalled), ``members`` found,
    ``remaining``, ``signals`` sent.
    """
    members = group_members(identity)
    if members is None:
        return {"outcome": "unverifiable", "members": None, "remaining": None, "signals": []}
    if not members:
        return {"outcome": "gone", "members": [], "remaining": [], "signals": []}
    pgid = int(identity["pid"])
    _signal_group(pgid, signal.SIGTERM)
    remaining = wait_group_gone(identity, grace)
    if not remaining:
        return {"outcome": "terminated", "members": members, "remaining": [], "signals": ["SIGTERM"]}
    _signal_group(pgid, signal.SIGKILL)
    remaining = wait_group_gone(identity, _KILL_WAIT_S)
    return {"outcome": "killed" if not remaining else "still_running", "members": members,
            "remaining": remaining, "signals": ["SIGTERM", "SIGKILL"]}


def stop_processes(pids: list[int], grace: float = STOP_GRACE_S) -> dict[str, Any]:
    """Stop ``pids`` (blocking): SIGTERM, up to ``grace`` seconds, SIGKILL, and a wait. Each is followed by its start
    time, so one that a dying parent left to another is still stopped and a pid used again is never signalled.

    What happened, as :func:`stop_group` reports it: ``outcome`` (``gone``, ``terminated``, ``killed`` or
    ``still_running``), ``members`` (those running), ``remaining``, ``signals`` sent."""
    running = {pid: started for pid in pids if (started := _start_time(pid)) is not None}
    left, signals = sorted(running), []
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, _KILL_WAIT_S)):
        if not left:
            break
        signals.append(signal.Signals(signum).name)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait
        while True:
            left = [pid for pid in left if _start_time(pid) == running[pid]]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
    global _SCANNED
    _SCANNED = None  # what a scan found is no longer so
    outcome = ("gone" if not signals else "still_running" if left
               else "terminated" if signals == ["SIGTERM"] else "killed")
    return {"outcome": outcome, "members": sorted(running), "remaining": left, "signals": signals}


def stop_descendants(grace: float = STOP_GRACE_S) -> list[int]:
    """Stop this process's :func:`descendants` (:func:`stop_processes`); the pids that were running."""
    return list(stop_processes(descendants(os.getpid()), grace)["members"])


DEFAULT_LEASE_TTL = 9.0
"""Seconds a claim lives without a renewal (renewed every third of it against the store's clock): another
machine can take a stopped owner's work over at most this long after its last renewal, so within 10 s of a
crash with the new process's start (bench/takeover.py); on the same machine a proven death frees it at once.
Two renewals can be missed (a stalled loop, a slow store) before the claim is lost."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A lease taken for one owner: the fence and what it took over."""

    fence: Fence
    reason: str
    """``claimed``, ``continued``, ``reclaimed_by_same_owner``, ``took_over_expired`` or
    ``took_over_dead_owner``."""
    previous_owner: str | None
    previous_epoch: int
    proof: dict[str, Any] | None = None
    """For ``took_over_dead_owner``: :func:`owner_gone`'s proof."""
    stopped: dict[str, Any] | None = None
    """What the dead holder left running and how it was stopped first (:func:`stop_processes`'s report, with the
    holder's ``process``), or None."""

    def record(self) -> dict[str, Any]:
        """The fields every ``*.claimed`` event carries (the claiming process's identity too)."""
        data = {"owner": self.fence.owner, "epoch": self.fence.epoch, "reason": self.reason,
                "previous_owner": self.previous_owner, "previous_epoch": self.previous_epoch,
                "process": process_identity()}
        if self.proof is not None:
            data["proof"] = self.proof
        if self.stopped is not None:
            data["stopped"] = self.stopped
        return data


TAKE_LOOKS = 3
"""Times :func:`take_claim` reads a lease that changed hands between its read and its take."""


async def take_claim(store: Store, key: str, owner: str, ttl: float, *,
                     holder_process: Callable[[Lease], object] | None = None) -> Claim:
    """Take ``key``'s lease for ``owner`` at the next epoch (with the other take-overs of the loop, in one
    durable transaction in a thread: ``kernel.batched``).

    Another owner's lease is taken only once it expired by the store's clock
    (:class:`~jixu.errors.LeaseHeld` otherwise), or at once when
    ``holder_process(lease)`` (the process identity its holder's claim
    recorded) is proven gone (:func:`owner_gone`). ``owner``'s own live lease is
    taken back at once (a restarted process), unless ``holder_process(lease)``
    is another process of this machine that still runs under the same name
    (:func:`another_live_process`: :class:`~jixu.errors.LeaseHeld`); a lease that changed hands
    since it was read is read again and judged anew (a killed process's last commit can land after the read),
    :data:`TAKE_LOOKS` times at most, then raises :class:`~jixu.errors.FencingError`.

    A holder that died leaving processes running in the group it led (:func:`left_running`: a tool's subprocess)
    has them stopped first (:func:`stop_processes`, in a thread), and the claim records how (``stopped``): nothing it
    started acts on after its work was taken over. :class:`~jixu.errors.LeaseHeld` when they cannot be stopped.
    """
    looks = 0
    while True:
        looks += 1
        lease = store.get_lease(key)
        proof: dict[str, Any] | None = None
        stopped: dict[str, Any] | None = None
        if lease is None:
            reason, previous_owner, previous_epoch, require_expired = "claimed", None, 0, False
        else:
            previous_owner, previous_epoch = lease.owner, lease.epoch
            identity = holder_process(lease) if holder_process is not None and not lease.released else None
            recorded = None if holder_process is None else _recorded(identity)
            if lease.released:
                reason, require_expired = "continued", False
            elif own_lease(lease, owner, recorded):
                reason, require_expired = "reclaimed_by_same_owner", False
            elif lease.owner == owner:
                raise LeaseHeld(f"{key} is held under the owner name {owner!r} by another process that still runs; "
                                "give every process running at once its own owner name", key=key, owner=owner)
            else:
                proof = dead_holder(lease, recorded)
                reason, require_expired = ("took_over_dead_owner", False) if proof else ("took_over_expired", True)
            orphans = left_running(identity, lease.expires_at)
            if orphans:
                stopped = await _stop_left_running(key, identity, orphans)
        asked = asyncio.ensure_future(lease_takes(store).ask(LeaseTake(key, owner, ttl, previous_epoch,
                                                                       require_expired)))
        try:
            fence = await asyncio.shield(asked)
        except asyncio.CancelledError:
            # The take may be in flight: once it is answered, give back what nobody will use (no one waits it out).
            asked.add_done_callback(_give_back(store))
            raise
        except FencingError:
            if looks >= TAKE_LOOKS:
                raise
            continue  # the lease moved on since it was read: nothing was taken; look at it again
        return Claim(fence, reason, previous_owner, previous_epoch, proof, stopped)


def _recorded(identity: object) -> Callable[[Lease], object]:
    """A ``holder_process`` answering ``identity``, already read."""
    return lambda _lease: identity


async def _stop_left_running(key: str, identity: object, orphans: list[int]) -> dict[str, Any]:
    """Stop what ``key``'s dead holder ``identity`` left running (:func:`stop_processes`); the report, or
    :class:`~jixu.errors.LeaseHeld` when something of it still runs after SIGKILL."""
    assert isinstance(identity, dict)
    report = await asyncio.to_thread(stop_processes, orphans)
    if report["outcome"] == "still_running":
        raise LeaseHeld(f"{key}'s holder (pid {identity.get('pid')}) is gone, but processes it started still run "
                        f"after SIGKILL: {report['remaining']}", key=key)
    return {"process": _named(identity), **report}


def _give_back(store: Store) -> Callable[[asyncio.Future[Fence]], None]:
    def done(taken: asyncio.Future[Fence]) -> None:
        if not taken.cancelled() and taken.exception() is None:
            release(store, taken.result())

    return done


def dead_holder(lease: Lease | None, holder_process: Callable[[Lease], object] | None) -> dict[str, Any] | None:
    """The proof that the live holder of ``lease`` is gone (see :func:`owner_gone`), or None."""
    if lease is None or lease.released or holder_process is None:
        return None
    return owner_gone(holder_process(lease))


@dataclass(frozen=True, slots=True)
class LiveClaim:
    """A claim that another process may still act under (:func:`live_claim`)."""

    lease: Lease
    left: float
    """Seconds it has left by the store's clock (negative: expired that long ago)."""
    left_running: list[int]
    """The processes its gone holder left running in the group it led (:func:`left_running`); ``[]`` while the
    holder itself runs."""
    pgid: int | None = None
    """That group (with ``left_running``)."""

    def held_for(self) -> str:
        """How the claim stands, for a message."""
        if self.left_running:
            return (f"its process is gone, but processes it started still run in its process group {self.pgid} "
                    f"(pids {', '.join(map(str, self.left_running))}) and may still act: wait for them to end or "
                    f"stop them (kill -TERM {' '.join(map(str, self.left_running))}); a worker stops them first "
                    "only when it continues the turn, never while a call of it waits for an operator")
        if self.left > 0:
            return f"its claim renewed for another {self.left:.1f}s"
        return f"its claim expired {-self.left:.1f}s ago, but its process still runs on this machine: stop it first"


def lease_pgid(identity: object) -> int | None:
    """The process group a claim's recorded ``identity`` led, or None."""
    found = identity.get("pgid") if isinstance(identity, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def live_claim(store: Store, key: str, holder_process: Callable[[Lease], object],
               owner: str | None = None, *, released_too: bool = False) -> LiveClaim | None:
    """The live claim on ``key`` of a process other than ``owner`` (see :func:`own_lease`), or None: none held,
    released, its holder's process (``holder_process(lease)``) proven gone with nothing left running, or expired
    with a holder not known to run.

    An expired claim whose holder is a process of this machine that still runs (stopped, say, past its lease) is
    live: what it has in flight can still happen when it goes on (its writes to the store are fenced out; its calls
    are not). So is the claim of a holder that died leaving processes running in the group it led
    (:func:`left_running`): a tool's subprocess can still act. With ``released_too`` (settling a call in doubt),
    so is a released claim whose holder died leaving processes running: a process that drained, cutting a call
    off, and ended (no serving process, which stops its own) left the call's subprocess at work."""
    lease = store.get_lease(key)
    if lease is None:
        return None
    if lease.released:
        if not released_too:
            return None
        identity = holder_process(lease)
        orphans = left_running(identity, lease.expires_at)
        return LiveClaim(lease, 0.0, orphans, lease_pgid(identity)) if orphans else None
    identity = holder_process(lease)
    if own_lease(lease, owner, _recorded(identity)):
        return None
    left = lease.expires_at - store.now()
    orphans = left_running(identity, lease.expires_at)
    if orphans:
        return LiveClaim(lease, left, orphans, lease_pgid(identity))
    if left <= 0:
        return LiveClaim(lease, left, []) if another_live_process(identity) else None
    if owner_gone(identity) is not None:
        return None
    return LiveClaim(lease, left, [])


def acquire_claim(store: Store, key: str, owner: str, ttl: float) -> Fence:
    """Take ``key``'s lease for ``owner`` (the same epoch when ``owner`` holds it already; the next one once
    it was released or expired; :class:`~jixu.errors.LeaseHeld` while another owner's is live)."""
    return store.acquire_lease(key, owner, ttl)


def recovery_claim(store: Store, key: str, recoverer: str, ttl: float, *, expected_epoch: int,
                   require_expired: bool) -> tuple[Fence, Lease | None]:
    """An explicit recovery's claim on ``key``: ``(its fence, the lease it found)``.

    The store checks that the lease is still at ``expected_epoch`` (the one
    the operator looked at) and, with ``require_expired``, that it expired by
    the store's clock, and moves it to the next epoch; a late write of the
    former owner is refused from then on. The same recovery repeated after it
    took the lease (and stopped before recording its receipt) gets that claim
    back, renewed.
    """
    previous = store.get_lease(key)
    if previous is not None and previous.owner == recoverer and previous.epoch == expected_epoch + 1:
        fence = previous.fence()
        store.renew_lease(fence, ttl)
        return fence, previous
    return store.take_over_lease(key, recoverer, ttl, expected_epoch=expected_epoch,
                                 require_expired=require_expired), previous


def holds(store: Store, fence: Fence | None) -> bool:
    """Whether ``fence`` is still the current, unreleased holder of its lease (by owner and epoch)."""
    if fence is None:
        return False
    lease = store.get_lease(fence.key)
    return lease is not None and not lease.released and (lease.owner, lease.epoch) == (fence.owner, fence.epoch)


async def claim_stream(writer: StreamWriter[Any], key: str, owner: str, ttl: float,
                       claimed: Callable[[Claim], NewEvent | PreparedEvent | Sequence[NewEvent | PreparedEvent]], *,
                       still_wanted: Callable[[], bool], tries: int = 5,
                       holder_process: Callable[[Lease], object] | None = None) -> Claim | None:
    """Take ``key``'s lease and record ``claimed(claim)`` (an event, or events in order, asked again after a
    conflict) in ``writer``'s stream, fenced by it.

    Neither holds the event loop: the take goes with the loop's other
    take-overs, the event through its shared commits (claims starting together
    share both). When another writer moved the head meanwhile, the new events
    are folded and, while ``still_wanted()`` (there is still work to do), the
    claim is recorded again after them; otherwise the lease is given back and
    ``None`` returned.
    """
    claim = await take_claim(writer.store, key, owner, ttl, holder_process=holder_process)
    # Cut off (a drain's deadline) or failed while recording the claim, nobody will use it.
    with given_back_on_failure(writer.store, claim.fence):
        for _ in range(tries):
            try:
                events = claimed(claim)
                await writer.append_async([events] if isinstance(events, NewEvent | PreparedEvent) else events,
                                          claim.fence)
                return claim
            except ConcurrencyError:
                await writer.idle()
                writer.sync()
                if not still_wanted():
                    break
    release(writer.store, claim.fence)
    return None


def release(store: Store, fence: Fence | None) -> None:
    """Give the lease back (nothing if it was lost meanwhile, or if the store failed: it then expires)."""
    if fence is not None:
        with contextlib.suppress(JixuError):
            store.release_lease(fence)


def release_later(store: Store, fence: Fence) -> None:
    """:func:`release`, for a claim given back after its holder may have closed ``store`` (a call that outlived
    its loop ended): then through the same store opened again (:meth:`Store.opened_again`)."""
    if not store.closed:
        release(store, fence)
        return
    with contextlib.suppress(JixuError, OSError), store.opened_again() as again:
        release(again, fence)


@contextlib.contextmanager
def given_back_on_failure(store: Store, fence: Fence | None) -> Iterator[None]:
    """Release ``fence``'s lease when the block raises (a cancellation included): a claim whose record was not
    made (or is not known to be) stands for work nobody does. Given back, the next claimer goes on at once; left
    to expire, it would look like a crashed owner's, an operator's case."""
    try:
        yield
    except BaseException:
        release(store, fence)
        raise


class Session:
    """An owner at work on a claim: renews the lease every ``ttl / 3`` seconds against the store's clock, counts
    the owner as a running user of the loop's commits, and releases the lease at the end (``async with``).

    When a renewal finds the claim lost (:class:`~jixu.errors.FencingError`),
    the task that opened the session is cancelled and :attr:`lost` says why;
    the owner's next fenced append would fail anyway. A renewal the store
    fails (any other error) is logged and tried again after ``ttl / 10``.
    """

    def __init__(self, store: Store, fence: Fence, ttl: float, *, release_at_end: bool = True) -> None:
        self.store = store
        self.fence = fence
        self.ttl = ttl
        self.lost: FencingError | None = None
        self.renewal_error: JixuError | None = None
        """The store's error of the last renewal, while the next one has not succeeded."""
        self._release_at_end = release_at_end
        self._heartbeat: asyncio.Task[None] | None = None
        self._owner_task: asyncio.Task[Any] | None = None
        self._user: contextlib.ExitStack | None = None

    async def __aenter__(self) -> Session:
        self._owner_task = asyncio.current_task()
        self._user = contextlib.ExitStack()
        self._user.enter_context(Commits.of(self.store).user())
        # A loop's shutdown leaves it beating while a call is in flight: the call's receipt needs the claim.
        self._heartbeat = ServingTask(self._beat(), name=f"jixu-heartbeat {self.fence.key}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._user is not None:
            self._user.close()
        if self._release_at_end:
            release(self.store, self.fence)

    def cancelled_by_loss(self, task: asyncio.Task[Any] | None) -> FencingError | None:
        """The loss (:attr:`lost`) when this session's heartbeat, and nothing else, cancelled ``task`` (the
        owner's task, now seeing ``CancelledError``): that cancellation is taken back (``uncancel``) so the
        owner can stop with ``OwnershipLost`` instead. None for any other cancellation: let it go on.

        Left a plain cancellation, the owner's caller could not tell a lost claim from a drain or its own cancel.
        """
        if self.lost is None or task is None or task is not self._owner_task:
            return None
        return self.lost if task.uncancel() == 0 else None

    async def _beat(self) -> None:
        period = self.ttl / 3
        while True:
            await asyncio.sleep(period)
            try:
                # With the loop's other renewals, in one call in a thread (kernel.batched): a renewal is a
                # write (a round trip on PostgreSQL) that would hold every turn on the loop.
                await lease_renewals(self.store).renew(self.fence, self.ttl)
            except FencingError as error:
                self.lost = error
                if self._owner_task is not None:
                    self._owner_task.cancel()
                return
            except JixuError as error:
                # The store failed (locked past its busy timeout, a dropped connection), not the claim: try
                # again soon, while the lease still runs. Ending the heartbeat here would let the lease lapse
                # under a live owner and lose the turn at its next append.
                self.renewal_error = error
                period = self.ttl / 10
                _log.warning("renewing %s failed (%s); trying again in %.2f s", self.fence.key, error.message,
                             period)
                continue
            self.renewal_error = None
            period = self.ttl / 3


__all__ = ["DEFAULT_LEASE_TTL", "LEFT_RUNNING_MARGIN_S", "STOP_GRACE_S", "Claim", "LiveClaim", "Session",
           "acquire_claim", "another_live_process", "claim_stream", "dead_holder", "descendants",
           "given_back_on_failure", "group_gone", "group_identity", "group_members", "holds", "lease_pgid",
           "left_running", "live_claim", "own_lease", "owner_gone", "process_identity", "recovery_claim", "release",
           "stop_descendants", "stop_group", "stop_processes", "take_claim", "wait_group_gone"]

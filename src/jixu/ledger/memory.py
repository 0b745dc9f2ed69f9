"""An in-memory store for unit tests: the full contract, no durability."""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

from jixu.errors import InvalidInput, JixuError, NotFound
from jixu.ledger.chain import VerifyReport
from jixu.ledger.event import GENESIS_HASH, PreparedEvent, StoredRow, utc_now_text
from jixu.ledger.store import (
    SESSION_RETENTION,
    AlreadyStored,
    Checkpoint,
    ClaimOrder,
    Fence,
    Lease,
    QueueCensus,
    Session,
    Store,
    StreamInfo,
    WorkClaim,
    WorkItem,
    WorkRow,
    claimed_row,
    claims_up_to,
    decide_append,
    group_of_meta,
    work_claim_of,
)


class MemoryStore(Store):
    """Keeps everything in process memory; for tests and experiments only."""

    def __init__(self, *, max_payload_bytes: int | None = None) -> None:
        self.url = "memory://"
        self.durability = "none (in memory: nothing outlives the process)"
        if max_payload_bytes is not None:
            self.max_payload_bytes = max_payload_bytes
        self._lock = threading.RLock()
        self._streams: dict[str, list[StoredRow]] = {}
        self._genesis: dict[str, str] = {}
        self._created: dict[str, str] = {}
        self._stream_groups: dict[str, str | None] = {}
        self._sessions: dict[str, Session] = {}
        self._used: dict[str, float] = {}
        self._names: list[str] = []
        self._by_id: dict[str, StoredRow] = {}
        self._leases: dict[str, Lease] = {}
        self._checkpoints: dict[tuple[str, str], Checkpoint] = {}
        self._work: dict[str, WorkRow] = {}
        self._work_positions = 0
        self._last_claimed: dict[str, int] = {}
        self._clock_offset = 0.0

    def now(self) -> float:
        return time.time() + self._clock_offset

    def advance_clock(self, seconds: float) -> None:
        """Move this store's clock forward (tests of lease expiry)."""
        self._clock_offset += seconds

    def schema_version(self) -> int:
        return 3

    def close(self) -> None:
        pass

    def opened_again(self) -> MemoryStore:
        """This store itself: closing it closes nothing."""
        return self

    def _append(
        self,
        stream: str,
        batch: list[PreparedEvent],
        expected_seq: int,
        fence: Fence | None,
        genesis_hash: str,
    ) -> list[StoredRow]:
        with self._lock:
            found = {p.id: self._by_id[p.id] for p in batch if p.id in self._by_id}
            rows = self._streams.get(stream)
            verdict = decide_append(
                stream, batch, expected_seq, fence, found=found,
                lease=self._leases.get(fence.key) if fence is not None else None,
                now=self.now() if fence is not None else 0.0,
                head=(len(rows), rows[-1].hash) if rows else None, genesis_hash=genesis_hash,
                recorded_at=utc_now_text())
            if isinstance(verdict, JixuError):
                raise verdict
            if isinstance(verdict, AlreadyStored):
                return verdict
            new_rows = verdict
            if not rows:
                rows = self._streams[stream] = []
                self._genesis[stream] = genesis_hash
                self._created[stream] = new_rows[0].recorded_at
                self._stream_groups[stream] = group_of_meta(new_rows[0].meta_json)
                bisect.insort(self._names, stream)
            rows.extend(new_rows)
            for row in new_rows:
                self._by_id[row.id] = row
            return new_rows

    def _append_after(self, stream: str, expected_seq: int, fence: Fence | None,
                      build: Callable[[list[StoredRow], int], list[PreparedEvent]]
                      ) -> tuple[list[StoredRow], list[StoredRow]]:
        with self._lock:  # re-entrant: the read, build and append under one hold
            rows = self._streams.get(stream)
            if not rows:
                raise NotFound(f"stream {stream!r} has no events", stream=stream)
            later = rows[expected_seq:]
            batch = build(list(later), len(rows))
            if not batch:
                return list(later), []
            return list(later), self._append(stream, batch, len(rows), fence, GENESIS_HASH)

    def _append_and_enqueue(self, stream: str, batch: list[PreparedEvent], expected_seq: int, fence: Fence | None,
                            change: Callable[[WorkRow | None, float], WorkRow], key: str,
                            genesis_hash: str = GENESIS_HASH) -> list[StoredRow]:
        with self._lock:  # re-entrant: both under one hold, nothing between them
            now = self.now()
            current = self._work.get(key)
            row = change(current, now)  # refused (a key of another group): before anything is written
            rows = self._append(stream, batch, expected_seq, fence, genesis_hash)
            self._put_work(current, row)
            return rows

    def _verify_snapshot(self, stream: str) -> VerifyReport:
        with self._lock:
            return super()._verify_snapshot(stream)

    def _read_rows(self, stream: str, from_seq: int, to_seq: int | None) -> Iterator[StoredRow]:
        with self._lock:
            rows = self._streams.get(stream, [])
            end = len(rows) if to_seq is None else min(to_seq, len(rows))
            return iter(rows[from_seq - 1 : end])

    def _get_row(self, event_id: str) -> StoredRow | None:
        return self._by_id.get(event_id)

    def _stream_info(self, stream: str) -> StreamInfo | None:
        with self._lock:
            rows = self._streams.get(stream)
            if not rows:
                return None
            return StreamInfo(stream, len(rows), rows[-1].hash, self._genesis.get(stream, GENESIS_HASH),
                              self._created[stream], self._stream_groups.get(stream))

    def _list_streams(self, prefix: str, after: str, limit: int) -> list[StreamInfo]:
        with self._lock:
            start = bisect.bisect_right(self._names, after) if after else 0
            out: list[StreamInfo] = []
            for name in self._names[start:]:
                if len(out) >= limit:
                    break
                if name.startswith(prefix):
                    info = self._stream_info(name)
                    assert info is not None
                    out.append(info)
            return out

    def _list_group_streams(self, prefix: str, after: str, limit: int, groups: list[str]) -> list[StreamInfo]:
        with self._lock:
            wanted = set(groups)
            start = bisect.bisect_right(self._names, after) if after else 0
            out: list[StreamInfo] = []
            for name in self._names[start:]:
                if len(out) >= limit:
                    break
                if name.startswith(prefix) and self._stream_groups.get(name) in wanted:
                    info = self._stream_info(name)
                    assert info is not None
                    out.append(info)
            return out

    # --- sessions and credential use -------------------------------------------------

    def _create_session(self, key: str, subject: str, ttl: float) -> Session:
        with self._lock:
            now = self.now()
            if key in self._sessions:
                raise InvalidInput(f"session {key!r} exists already", field="key")
            for old in [s for s in self._sessions.values() if s.expires_at < now - SESSION_RETENTION]:
                del self._sessions[old.key]
            made = Session.of_row(key, subject, now, now + ttl, None, now)
            self._sessions[key] = made
            return made

    def _get_session(self, key: str) -> Session | None:
        with self._lock:
            found = self._sessions.get(key)
            if found is None:
                return None
            return Session.of_row(found.key, found.subject, found.created_at, found.expires_at, found.revoked_at,
                                  self.now())

    def _revoke_sessions(self, key: str | None, subject: str | None) -> int:
        with self._lock:
            now = self.now()
            ended = 0
            for found in list(self._sessions.values()):
                if (key is not None and found.key != key) or (subject is not None and found.subject != subject):
                    continue
                if found.revoked_at is None and found.expires_at > now:
                    self._sessions[found.key] = dataclasses.replace(found, revoked_at=now, active=False)
                    ended += 1
            return ended

    def _record_use(self, key: str) -> None:
        with self._lock:
            self._used[key] = self.now()

    def _last_used(self, keys: list[str]) -> dict[str, float]:
        with self._lock:
            return {key: self._used[key] for key in keys if key in self._used}

    def _change_lease(self, key: str, change: Callable[[Lease | None, float], Lease]) -> Lease:
        with self._lock:
            lease = change(self._leases.get(key), self.now())
            self._leases[key] = lease
            return lease

    def _release_lease(self, fence: Fence) -> None:
        with self._lock:
            current = self._leases.get(fence.key)
            if current and current.owner == fence.owner and current.epoch == fence.epoch:
                self._leases[fence.key] = Lease(fence.key, fence.owner, fence.epoch, current.expires_at,
                                                current.heartbeat_at, True)

    def _get_lease(self, key: str) -> Lease | None:
        return self._leases.get(key)

    def _write_checkpoints(self, checkpoints: list[Checkpoint]) -> None:
        with self._lock:
            for checkpoint in checkpoints:
                self._checkpoints[(checkpoint.stream, checkpoint.name)] = checkpoint

    def _read_checkpoints(self, stream: str, names: list[str]) -> dict[str, Checkpoint]:
        found = (self._checkpoints.get((stream, name)) for name in names)
        return {checkpoint.name: checkpoint for checkpoint in found if checkpoint is not None}

    def _checkpoints_named(self, name: str, streams: list[str]) -> dict[str, Checkpoint]:
        found = (self._checkpoints.get((stream, name)) for stream in streams)
        return {checkpoint.stream: checkpoint for checkpoint in found if checkpoint is not None}

    # --- work queue -----------------------------------------------------------------

    def _change_work(self, key: str, change: Callable[[WorkRow | None, float], WorkRow]) -> tuple[WorkItem, WorkRow]:
        with self._lock:
            now = self.now()
            current = self._work.get(key)
            row = self._put_work(current, change(current, now))
            return row.item(now), row

    def _put_work(self, current: WorkRow | None, row: WorkRow) -> WorkRow:
        """Keep ``row`` (unless it is ``current`` itself), numbered when it is new; the row kept."""
        if row is not current:
            if current is None:
                self._work_positions += 1
                row = dataclasses.replace(row, position=self._work_positions)
            self._work[row.key] = row
        return row

    def _claim_works(self, owner: str, ttl: float, order: ClaimOrder, count: int) -> list[WorkClaim]:
        with self._lock:  # one "transaction": nothing else claims in between
            now = self.now()
            live: dict[str, int] = {}
            oldest: dict[str, tuple[float, int]] = {}
            for row in self._work.values():
                if row.live(now):
                    live[row.group] = live.get(row.group, 0) + 1
                elif row.claimable(now):
                    here = (row.ready_at, row.position)
                    oldest[row.group] = min(oldest.get(row.group, here), here)

            def claim_from(group: str, number: int) -> tuple[WorkClaim, tuple[float, int] | None] | None:
                candidates = sorted((r for r in self._work.values() if r.group == group and r.claimable(now)),
                                    key=lambda r: (r.ready_at, r.position))
                if not candidates:
                    return None
                row = claimed_row(candidates[0], owner, ttl, now)
                self._work[row.key] = row
                self._last_claimed[group] = number
                after = (candidates[1].ready_at, candidates[1].position) if len(candidates) > 1 else None
                return work_claim_of(row, number), after

            return claims_up_to(count, QueueCensus(live, oldest, dict(self._last_claimed)), order, claim_from)

    def _list_work(self, group: str | None, status: str | None) -> tuple[list[WorkRow], float]:
        with self._lock:
            rows = [r for r in self._work.values()
                    if (group is None or r.group == group) and (status is None or r.status == status)]
            return sorted(rows, key=lambda r: (r.ready_at, r.position)), self.now()

    def _get_work(self, key: str) -> tuple[WorkRow | None, float]:
        with self._lock:
            return self._work.get(key), self.now()


__all__ = ["MemoryStore"]

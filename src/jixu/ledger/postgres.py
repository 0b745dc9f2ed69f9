"""The PostgreSQL store: one ledger shared by many worker processes on many machines.

Same contract and same tables as the SQLite store (``data`` and ``meta`` are
TEXT holding the canonical JSON, never ``jsonb``: verification is byte-exact).
What differs is how concurrency is settled:

- **Appends** are one statement, ``SELECT * FROM jixu_append_v4(...)`` (a
  PL/pgSQL function, migration 4; migration 3's ``jixu_append`` stays for
  workers of schema 3 still running), run in autocommit: one round trip, one
  commit. In its READ COMMITTED transaction it locks the stream's head row
  ``FOR UPDATE`` first, so every later read sees what the previous holder
  committed; then it checks the fence and the head, seals the batch
  with the database clock (``sha256()`` over the same bytes
  :func:`~jixu.ledger.event.seal` hashes) and inserts it. A new stream has no
  row to lock: its head row is inserted ``ON CONFLICT DO NOTHING`` and, when
  another appender created it first, the checks run again under that row's
  lock. So two appenders at the same ``expected_seq`` end with exactly one
  winner and one :class:`~jixu.errors.ConcurrencyError` (or a no-op, when the
  loser was a retry of the winner's batch) and never a raw unique violation.
  A batch with an id already stored (a retry, or a reused id) is decided by
  the older several-statement transaction, with
  :func:`~jixu.ledger.store.decide_append` like every other store: the
  function finds it by the ids' unique index when it inserts (the statement
  fails and undoes everything) or, when it refuses the fence or the head, by
  looking the ids up first, so a retry is a no-op whatever moved since.
  A group commit's appends (:meth:`PostgresStore.append_many`) are one
  statement too, ``SELECT * FROM jixu_append_many_v6(...)`` (migration 6):
  ``jixu_append_v4`` for each, in stream order, in one transaction, each
  answered on its own; when the database aborts the statement (a stored id),
  each append is then made on its own.
- **Fences** lock the lease row ``FOR UPDATE`` in the append's transaction
  and judge expiry by the *database* clock (``clock_timestamp()``, read after
  the locks are held), so no worker's clock skew can extend a lease. The
  function returns the lease row, the head and the clock of a refusal;
  Python words it with :func:`~jixu.ledger.store.judge_append`, the checks
  of the one decision every store makes.
- **Verification** reads the head record and the events in one REPEATABLE
  READ, READ ONLY transaction: one snapshot, whatever appends run meanwhile.
- **Work claims** take a transaction-level advisory lock first, so claimers
  take turns and the live-claim count they check stays true until commit;
  the item itself is selected ``FOR UPDATE SKIP LOCKED`` (passing over rows a
  finisher or enqueuer holds). Renewals take the same lock in shared mode.
- **Migrations** are versioned in ``jixu_schema`` and run on open in one
  transaction holding ``pg_advisory_xact_lock`` (keyed by the schema), so
  processes opening a fresh database at once migrate it exactly once. A
  database at a newer version than this code fails closed.

Tables live in the connection's current schema (the first existing schema on
``search_path``); other tables in the same database are left alone.
"""

from __future__ import annotations

import functools
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    InvalidInput,
    JixuError,
    MissingExtra,
    NotFound,
    OutcomeUnknown,
    SchemaTooNew,
    StoreError,
    StoreLocked,
    StoreNotDurable,
    StoreNotFound,
    StoreReadOnly,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import TupleRow
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as error:  # without the extra: say what to install
    raise MissingExtra.needed("postgres", "a PostgreSQL store", error) from error

from jixu.ledger.chain import VerifyReport, verify_rows
from jixu.ledger.event import GENESIS_HASH, Event, PreparedEvent, StoredRow
from jixu.ledger.store import (
    SESSION_RETENTION,
    AlreadyStored,
    AppendRequest,
    Checkpoint,
    ClaimOrder,
    Fence,
    Lease,
    LeaseChange,
    QueueCensus,
    Session,
    Store,
    StreamInfo,
    WorkChange,
    WorkClaim,
    WorkItem,
    WorkRow,
    claimed_row,
    claims_up_to,
    decide_append,
    each_change,
    judge_append,
    renewal_answers,
    served_groups,
    work_claim_of,
)
from jixu.ledger.urls import postgres_dsn_and_options

_T = TypeVar("_T")
_Conn = psycopg.Connection[TupleRow]

_CHUNK = 4096
_ATTEMPTS = 6  # tries of one transaction that the database aborted for a conflict
_ROW_COLUMNS = "id, stream, seq, type, data, meta, recorded_at, prev_hash, hash"
_LEASE_COLUMNS = "key, owner, epoch, expires_at, heartbeat_at, released"
_LEASES_UNNEST = ("unnest(%s::text[], %s::text[], %s::bigint[], %s::float8[], %s::float8[], %s::boolean[]) "
                  "AS u (key, owner, epoch, expires_at, heartbeat_at, released)")
_UPDATE_LEASES_SQL = ("UPDATE jixu_leases AS l SET owner = u.owner, epoch = u.epoch, expires_at = u.expires_at, "
                      f"heartbeat_at = u.heartbeat_at, released = u.released FROM {_LEASES_UNNEST} "
                      "WHERE l.key = u.key RETURNING l.key")
_INSERT_LEASES_SQL = (f"INSERT INTO jixu_leases ({_LEASE_COLUMNS}) SELECT u.* FROM {_LEASES_UNNEST} "
                      "ON CONFLICT (key) DO NOTHING RETURNING key")
_UTC_TEXT = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
_NOW_SQL = "SELECT extract(epoch FROM clock_timestamp())::float8"
_CLOCK_SQL = (f"SELECT extract(epoch FROM t)::float8, {_UTC_TEXT.format('t')} "
              "FROM (SELECT clock_timestamp() AS t) AS clock")
_MIGRATION_LOCK_SQL = (
    "SELECT pg_advisory_xact_lock(hashtextextended('jixu.migrate:' || coalesce(current_schema(), ''), 0))"
)
_JIXU_TABLES_SQL = (
    "SELECT c.relname FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relname LIKE 'jixu\\_%' "
    "AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.relname"
)
_ID_CONSTRAINT = "jixu_events_id_key"

MIGRATIONS: list[tuple[int, str, tuple[str, ...]]] = [
    (
        1,
        "events, streams, leases, checkpoints; events immutable by trigger",
        (
            """CREATE TABLE jixu_streams (
                stream       text COLLATE "C" PRIMARY KEY,
                head_seq     bigint NOT NULL,
                head_hash    text NOT NULL,
                genesis_hash text NOT NULL,
                created_at   text NOT NULL
            )""",
            """CREATE TABLE jixu_events (
                position    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                id          text COLLATE "C" NOT NULL,
                stream      text COLLATE "C" NOT NULL,
                seq         bigint NOT NULL CHECK (seq >= 1),
                type        text NOT NULL,
                data        text NOT NULL,
                meta        text NOT NULL,
                recorded_at text NOT NULL,
                prev_hash   text NOT NULL,
                hash        text NOT NULL,
                CONSTRAINT jixu_events_id_key UNIQUE (id),
                CONSTRAINT jixu_events_stream_seq_key UNIQUE (stream, seq)
            )""",
            """CREATE FUNCTION jixu_events_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'jixu: events are immutable; % is refused', TG_OP
                    USING HINT = 'the ledger is append-only: append a correcting event instead';
            END
            $$""",
            """CREATE TRIGGER jixu_events_no_update BEFORE UPDATE ON jixu_events
            FOR EACH ROW EXECUTE FUNCTION jixu_events_immutable()""",
            """CREATE TRIGGER jixu_events_no_delete BEFORE DELETE ON jixu_events
            FOR EACH ROW EXECUTE FUNCTION jixu_events_immutable()""",
            """CREATE TRIGGER jixu_events_no_truncate BEFORE TRUNCATE ON jixu_events
            FOR EACH STATEMENT EXECUTE FUNCTION jixu_events_immutable()""",
            """CREATE TABLE jixu_leases (
                key          text COLLATE "C" PRIMARY KEY,
                owner        text,
                epoch        bigint NOT NULL,
                expires_at   double precision NOT NULL,
                heartbeat_at double precision NOT NULL,
                released     boolean NOT NULL
            )""",
            """CREATE TABLE jixu_checkpoints (
                stream          text COLLATE "C" NOT NULL,
                name            text NOT NULL,
                seq             bigint NOT NULL,
                reducer_version bigint NOT NULL,
                head_hash       text NOT NULL,
                state           text NOT NULL,
                digest          text NOT NULL,
                created_at      text NOT NULL,
                PRIMARY KEY (stream, name)
            )""",
        ),
    ),
    (
        2,
        "work queue: durable work items with fenced claims",
        (
            """CREATE TABLE jixu_work (
                position     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                key          text COLLATE "C" NOT NULL,
                project      text COLLATE "C" NOT NULL,
                status       text NOT NULL CHECK (status IN ('pending', 'claimed', 'done')),
                ready_at     double precision NOT NULL,
                enqueued_at  double precision NOT NULL,
                claimed_by   text,
                epoch        bigint NOT NULL,
                expires_at   double precision,
                heartbeat_at double precision,
                rerun        boolean NOT NULL,
                CONSTRAINT jixu_work_key_key UNIQUE (key)
            )""",
            "CREATE INDEX jixu_work_ready ON jixu_work (project, ready_at, position) WHERE status <> 'done'",
            "CREATE INDEX jixu_work_claims ON jixu_work (status, expires_at)",
            """CREATE TABLE jixu_work_projects (
                project         text COLLATE "C" PRIMARY KEY,
                last_claim      bigint NOT NULL,
                last_claimed_at double precision NOT NULL,
                claims          bigint NOT NULL
            )""",
        ),
    ),
]

_APPEND_FUNCTION = """CREATE FUNCTION jixu_append(
    p_stream text, p_expected bigint, p_genesis text,
    p_fence_key text, p_fence_owner text, p_fence_epoch bigint,
    p_ids text[], p_types text[], p_data text[], p_meta text[],
    OUT o_status text, OUT o_head_seq bigint, OUT o_prev_hash text, OUT o_recorded_at text,
    OUT o_hashes text[], OUT o_lease_found boolean, OUT o_lease_owner text, OUT o_lease_epoch bigint,
    OUT o_lease_expires_at double precision, OUT o_lease_heartbeat_at double precision,
    OUT o_lease_released boolean, OUT o_now double precision
) LANGUAGE plpgsql AS $fn$
-- One append in one statement (see PostgresStore._append). Statuses: 'ok' (sealed and inserted),
-- 'conflict' (the head is o_head_seq, not p_expected), 'fenced' (the lease row and clock are returned
-- for the caller to word the refusal), 'existing' (an id is already stored: the caller decides on its
-- slower path), 'busy' (the new stream's head row kept appearing and vanishing).
DECLARE
    v_head_seq  bigint;
    v_head_hash text;
    v_clock     timestamptz;
    v_prev      text;
    v_hash      text;
    v_prevs     text[];
    v_event     record;
BEGIN
    FOR attempt IN 1..3 LOOP
        -- Lock the head first: every later read sees what its last holder committed.
        SELECT s.head_seq, s.head_hash INTO v_head_seq, v_head_hash
          FROM jixu_streams s WHERE s.stream = p_stream FOR UPDATE;
        IF EXISTS (SELECT 1 FROM jixu_events e WHERE e.id = ANY (p_ids)) THEN
            o_status := 'existing';
            RETURN;
        END IF;
        IF p_fence_key IS NOT NULL THEN
            SELECT l.owner, l.epoch, l.expires_at, l.heartbeat_at, l.released
              INTO o_lease_owner, o_lease_epoch, o_lease_expires_at, o_lease_heartbeat_at, o_lease_released
              FROM jixu_leases l WHERE l.key = p_fence_key FOR UPDATE;
            o_lease_found := FOUND;
            o_now := extract(epoch FROM clock_timestamp())::float8;  -- read after the locks are held
            IF NOT o_lease_found OR o_lease_owner IS DISTINCT FROM p_fence_owner
                    OR o_lease_epoch <> p_fence_epoch OR o_lease_released OR o_lease_expires_at <= o_now THEN
                o_status := 'fenced';
                RETURN;
            END IF;
        END IF;
        o_head_seq := coalesce(v_head_seq, 0);
        IF o_head_seq <> p_expected THEN
            o_status := 'conflict';
            RETURN;
        END IF;
        v_clock := clock_timestamp();
        o_recorded_at := __RECORDED_AT__;
        o_prev_hash := coalesce(v_head_hash, p_genesis);
        -- The chain, byte for byte as jixu.ledger.event.seal computes it: sha256 over the domain tag
        -- and the UTF-8 envelope text assembled from the canonical data and meta texts as given.
        v_prev := o_prev_hash;
        v_prevs := '{}';
        o_hashes := '{}';
        FOR v_event IN
            SELECT u.id, u.type, u.data, u.meta, u.n
              FROM unnest(p_ids, p_types, p_data, p_meta) WITH ORDINALITY AS u (id, type, data, meta, n)
             ORDER BY u.n
        LOOP
            v_hash := encode(sha256('\\x6a6978752e6576656e742e763100'::bytea || convert_to(
                '{"data":' || v_event.data || ',"id":"' || v_event.id || '","meta":' || v_event.meta
                || ',"prev_hash":"' || v_prev || '","recorded_at":"' || o_recorded_at
                || '","seq":' || (p_expected + v_event.n)::text || ',"stream":"' || p_stream
                || '","type":"' || v_event.type || '"}', 'UTF8')), 'hex');
            v_prevs := v_prevs || v_prev;
            o_hashes := o_hashes || v_hash;
            v_prev := v_hash;
        END LOOP;
        IF v_head_seq IS NULL THEN
            INSERT INTO jixu_streams (stream, head_seq, head_hash, genesis_hash, created_at)
            VALUES (p_stream, p_expected + cardinality(p_ids), v_prev, p_genesis, o_recorded_at)
            ON CONFLICT (stream) DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;  -- another appender created the stream meanwhile: decide again under its lock
            END IF;
        ELSE
            UPDATE jixu_streams SET head_seq = p_expected + cardinality(p_ids), head_hash = v_prev
             WHERE stream = p_stream;
        END IF;
        INSERT INTO jixu_events (id, stream, seq, type, data, meta, recorded_at, prev_hash, hash)
        SELECT u.id, p_stream, p_expected + u.n, u.type, u.data, u.meta, o_recorded_at, u.prev, u.hash
          FROM unnest(p_ids, p_types, p_data, p_meta, v_prevs, o_hashes) WITH ORDINALITY
               AS u (id, type, data, meta, prev, hash, n)
         ORDER BY u.n;
        o_status := 'ok';
        RETURN;
    END LOOP;
    o_status := 'busy';
    o_hashes := NULL;
END
$fn$""".replace("__RECORDED_AT__", _UTC_TEXT.format("v_clock"))

MIGRATIONS.append((
    3,
    "jixu_append(): an append in one statement (lock, check, seal, insert)",
    (_APPEND_FUNCTION,),
))

_APPEND_FUNCTION_V4 = """CREATE FUNCTION jixu_append_v4(
    p_stream text, p_expected bigint, p_genesis text,
    p_fence_key text, p_fence_owner text, p_fence_epoch bigint,
    p_ids text[], p_types text[], p_data text[], p_meta text[],
    OUT o_status text, OUT o_head_seq bigint, OUT o_prev_hash text, OUT o_recorded_at text,
    OUT o_hashes text[], OUT o_lease_found boolean, OUT o_lease_owner text, OUT o_lease_epoch bigint,
    OUT o_lease_expires_at double precision, OUT o_lease_heartbeat_at double precision,
    OUT o_lease_released boolean, OUT o_now double precision
) LANGUAGE plpgsql AS $fn$
-- jixu_append (migration 3) without its look-up of the batch's ids before every append: that look-up was
-- planned once per session and, planned while jixu_events was still empty, scanned the whole table on
-- every later append. An append that goes through now lets the ids' unique index find a stored id (the
-- statement fails with a unique violation on jixu_events_id_key, and the caller decides on its slower
-- path); an append refused for its fence or its head first looks the ids up, planned for these ids, so
-- a retry of a stored batch still returns 'existing' before any refusal. Statuses as in jixu_append.
DECLARE
    v_head_seq  bigint;
    v_head_hash text;
    v_clock     timestamptz;
    v_prev      text;
    v_hash      text;
    v_prevs     text[];
    v_stored    boolean;
BEGIN
    FOR attempt IN 1..3 LOOP
        -- Lock the head first: every later read sees what its last holder committed.
        SELECT s.head_seq, s.head_hash INTO v_head_seq, v_head_hash
          FROM jixu_streams s WHERE s.stream = p_stream FOR UPDATE;
        IF p_fence_key IS NOT NULL THEN
            SELECT l.owner, l.epoch, l.expires_at, l.heartbeat_at, l.released
              INTO o_lease_owner, o_lease_epoch, o_lease_expires_at, o_lease_heartbeat_at, o_lease_released
              FROM jixu_leases l WHERE l.key = p_fence_key FOR UPDATE;
            o_lease_found := FOUND;
            o_now := extract(epoch FROM clock_timestamp())::float8;  -- read after the locks are held
            IF NOT o_lease_found OR o_lease_owner IS DISTINCT FROM p_fence_owner
                    OR o_lease_epoch <> p_fence_epoch OR o_lease_released OR o_lease_expires_at <= o_now THEN
                o_status := 'fenced';
            END IF;
        END IF;
        o_head_seq := coalesce(v_head_seq, 0);
        IF o_status IS NULL AND o_head_seq <> p_expected THEN
            o_status := 'conflict';
        END IF;
        IF o_status IS NOT NULL THEN
            -- Refused: unless the batch is already stored (a retry), which the caller decides instead.
            -- EXECUTE plans the look-up for these ids each time (see above).
            EXECUTE 'SELECT EXISTS (SELECT 1 FROM jixu_events e WHERE e.id = ANY ($1))' INTO v_stored USING p_ids;
            IF v_stored THEN
                o_status := 'existing';
            END IF;
            RETURN;
        END IF;
        v_clock := clock_timestamp();
        o_recorded_at := __RECORDED_AT__;
        o_prev_hash := coalesce(v_head_hash, p_genesis);
        -- The chain, byte for byte as jixu.ledger.event.seal computes it: sha256 over the domain tag
        -- and the UTF-8 envelope text assembled from the canonical data and meta texts as given.
        v_prev := o_prev_hash;
        v_prevs := '{}';
        o_hashes := '{}';
        FOR i IN 1..cardinality(p_ids) LOOP  -- subscripts, not a query over unnest(): no executor per append
            v_hash := encode(sha256('\\x6a6978752e6576656e742e763100'::bytea || convert_to(
                '{"data":' || p_data[i] || ',"id":"' || p_ids[i] || '","meta":' || p_meta[i]
                || ',"prev_hash":"' || v_prev || '","recorded_at":"' || o_recorded_at
                || '","seq":' || (p_expected + i)::text || ',"stream":"' || p_stream
                || '","type":"' || p_types[i] || '"}', 'UTF8')), 'hex');
            v_prevs[i] := v_prev;
            o_hashes[i] := v_hash;
            v_prev := v_hash;
        END LOOP;
        IF v_head_seq IS NULL THEN
            INSERT INTO jixu_streams (stream, head_seq, head_hash, genesis_hash, created_at)
            VALUES (p_stream, p_expected + cardinality(p_ids), v_prev, p_genesis, o_recorded_at)
            ON CONFLICT (stream) DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;  -- another appender created the stream meanwhile: decide again under its lock
            END IF;
        ELSE
            UPDATE jixu_streams SET head_seq = p_expected + cardinality(p_ids), head_hash = v_prev
             WHERE stream = p_stream;
        END IF;
        -- A stored id fails this insert (unique violation on jixu_events_id_key): the whole append is undone.
        INSERT INTO jixu_events (id, stream, seq, type, data, meta, recorded_at, prev_hash, hash)
        SELECT u.id, p_stream, p_expected + u.n, u.type, u.data, u.meta, o_recorded_at, u.prev, u.hash
          FROM unnest(p_ids, p_types, p_data, p_meta, v_prevs, o_hashes) WITH ORDINALITY
               AS u (id, type, data, meta, prev, hash, n)
         ORDER BY u.n;
        o_status := 'ok';
        RETURN;
    END LOOP;
    o_status := 'busy';
    o_hashes := NULL;
END
$fn$""".replace("__RECORDED_AT__", _UTC_TEXT.format("v_clock"))

MIGRATIONS.append((
    4,
    "jixu_append_v4(): jixu_append without a look-up of the ids before every append",
    (_APPEND_FUNCTION_V4,),
))

_THREAD_PROJECT = "(e.data::json -> 'metadata' -> 'project')"
MIGRATIONS.append((
    5,
    "sessions, credential use, streams indexed by the project their first event names",
    (
        """CREATE TABLE jixu_sessions (
            key        text COLLATE "C" PRIMARY KEY,
            subject    text COLLATE "C" NOT NULL,
            created_at double precision NOT NULL,
            expires_at double precision NOT NULL,
            revoked_at double precision
        )""",
        "CREATE INDEX jixu_sessions_subject ON jixu_sessions (subject)",
        "CREATE INDEX jixu_sessions_expiry ON jixu_sessions (expires_at)",
        """CREATE TABLE jixu_last_used (
            key     text COLLATE "C" PRIMARY KEY,
            used_at double precision NOT NULL
        )""",
        'ALTER TABLE jixu_streams ADD COLUMN project text COLLATE "C"',
        # jixu.ledger.store.group_of_meta in SQL: meta.project of a stream's first event, a string of 1-100.
        """CREATE FUNCTION jixu_project_of(p_meta text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
            SELECT CASE WHEN json_typeof(p_meta::json -> 'project') = 'string'
                             AND char_length(p_meta::json ->> 'project') BETWEEN 1 AND 100
                        THEN p_meta::json ->> 'project' END
        $$""",
        # A new stream's head row is inserted before its events (jixu_append_v4), so its project is set at commit,
        # by a deferred trigger, whichever path (the function, the slower transaction, an older worker) made it.
        """CREATE FUNCTION jixu_streams_project() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            v_project text;
        BEGIN
            SELECT jixu_project_of(e.meta) INTO v_project FROM jixu_events e
             WHERE e.stream = NEW.stream AND e.seq = 1;
            IF v_project IS NOT NULL THEN
                UPDATE jixu_streams SET project = v_project WHERE stream = NEW.stream;
            END IF;
            RETURN NULL;
        END
        $$""",
        """CREATE CONSTRAINT TRIGGER jixu_streams_project AFTER INSERT ON jixu_streams
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION jixu_streams_project()""",
        # Streams made before: the same rule, and for a thread what jixu recorded until now, its metadata's
        # project ("default" when it names none).
        f"""UPDATE jixu_streams s SET project = coalesce(jixu_project_of(e.meta), CASE
                WHEN s.stream NOT LIKE 'thread/%' THEN NULL
                WHEN {_THREAD_PROJECT} IS NULL THEN 'default'
                WHEN json_typeof({_THREAD_PROJECT}) = 'string'
                     AND char_length(e.data::json -> 'metadata' ->> 'project') BETWEEN 1 AND 100
                    THEN e.data::json -> 'metadata' ->> 'project'
            END)
            FROM jixu_events e WHERE e.stream = s.stream AND e.seq = 1""",
        "CREATE INDEX jixu_streams_project ON jixu_streams (project, stream) WHERE project IS NOT NULL",
    ),
))
# A group commit's appends as one statement: jixu_append_v4 for each, in the order given (the caller sorts
# them by stream, so two batches lock the heads they share in one order). Request i's events are the next
# p_counts[i] entries of the event arrays; a slice has subscripts from 1, as jixu_append_v4 expects.
_APPEND_MANY_FUNCTION_V6 = """CREATE FUNCTION jixu_append_many_v6(
    p_streams text[], p_expected bigint[], p_geneses text[],
    p_fence_keys text[], p_fence_owners text[], p_fence_epochs bigint[],
    p_counts integer[], p_ids text[], p_types text[], p_data text[], p_meta text[]
) RETURNS TABLE (
    o_status text, o_head_seq bigint, o_prev_hash text, o_recorded_at text,
    o_hashes text[], o_lease_found boolean, o_lease_owner text, o_lease_epoch bigint,
    o_lease_expires_at double precision, o_lease_heartbeat_at double precision,
    o_lease_released boolean, o_now double precision
) LANGUAGE plpgsql AS $fn$
DECLARE
    v_first integer := 1;
    v_last  integer;
BEGIN
    FOR i IN 1..cardinality(p_streams) LOOP
        v_last := v_first + p_counts[i] - 1;
        SELECT * INTO o_status, o_head_seq, o_prev_hash, o_recorded_at, o_hashes, o_lease_found, o_lease_owner,
                      o_lease_epoch, o_lease_expires_at, o_lease_heartbeat_at, o_lease_released, o_now
          FROM jixu_append_v4(p_streams[i], p_expected[i], p_geneses[i], p_fence_keys[i], p_fence_owners[i],
                              p_fence_epochs[i], p_ids[v_first:v_last], p_types[v_first:v_last],
                              p_data[v_first:v_last], p_meta[v_first:v_last]);
        RETURN NEXT;
        v_first := v_last + 1;
    END LOOP;
END
$fn$"""

MIGRATIONS.append((
    6,
    "jixu_append_many_v6(): a group commit's appends in one statement",
    (_APPEND_MANY_FUNCTION_V6,),
))
SCHEMA_VERSION = MIGRATIONS[-1][0]
_STREAM_COLUMNS = "stream, head_seq, head_hash, genesis_hash, created_at, project"
_SESSION_COLUMNS = "key, subject, created_at, expires_at, revoked_at"
_DURABLE_COMMITS_SQL = ("SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') "
                        "WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, false)")
"""Pins the session's ``synchronous_commit`` to ``on``, keeping only the stronger ``remote_apply`` (decision 0023)."""
_IDLE_CHECK_SECONDS = 5.0
"""A pooled connection idle this long is pinged before use; one used more recently is trusted."""
_CLIENT_CHECK_MS = 10
"""While a statement runs, the server looks this often (ms) whether its client is still connected."""
_IDLE_IN_TRANSACTION_MS = 5000
"""A session of this store that sits this long (ms) inside a transaction is ended by the server. None of the
store's transactions waits on its caller; one that does was frozen (SIGSTOP, a paused VM) while it held row
locks, and every other process would skip the rows it locked (``SKIP LOCKED``) or wait for them for as
long as it stays frozen, whatever the leases' TTL says."""
_APPEND_SQL = ("SELECT * FROM jixu_append_v4(%s::text, %s::bigint, %s::text, %s::text, %s::text, %s::bigint, "
               "%b::text[], %b::text[], %b::text[], %b::text[])")
_APPEND_MANY_SQL = ("SELECT * FROM jixu_append_many_v6(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[], "
                    "%b::bigint[], %b::integer[], %b::text[], %b::text[], %b::text[], %b::text[])")
# The column ``project`` holds an item's group (as in SQLite: renaming it would stop older workers sharing the store).
_WORK_COLUMNS = ("key, project, status, ready_at, enqueued_at, claimed_by, epoch, expires_at, heartbeat_at, "
                 "rerun, position")
_CLAIMABLE = ("((status = 'pending' AND ready_at <= %(now)s) OR "
              "(status = 'claimed' AND expires_at <= %(now)s))")
_UPDATE_WORKS_SQL = ("UPDATE jixu_work AS w SET status = u.status, ready_at = u.ready_at, enqueued_at = u.enqueued_at, "
                     "claimed_by = u.claimed_by, epoch = u.epoch, expires_at = u.expires_at, "
                     "heartbeat_at = u.heartbeat_at, rerun = u.rerun "
                     "FROM unnest(%s::text[], %s::text[], %s::float8[], %s::float8[], %s::text[], %s::bigint[], "
                     "%s::float8[], %s::float8[], %s::boolean[]) "
                     "AS u (key, status, ready_at, enqueued_at, claimed_by, epoch, expires_at, heartbeat_at, rerun) "
                     "WHERE w.key = u.key")
""":data:`_UPDATE_WORK_SQL` of several rows in one statement."""
_UPDATE_WORK_SQL = ("UPDATE jixu_work SET status = %(status)s, ready_at = %(ready_at)s, enqueued_at = %(enqueued_at)s, "
                    "claimed_by = %(claimed_by)s, epoch = %(epoch)s, expires_at = %(expires_at)s, "
                    "heartbeat_at = %(heartbeat_at)s, rerun = %(rerun)s WHERE key = %(key)s")
"""A work item's row written back whole (parameters: :func:`_work_params`)."""
_WORK_LOCK = "hashtextextended('jixu.work:' || coalesce(current_schema(), ''), 0)"
_WORK_LOCK_SQL = f"SELECT pg_advisory_xact_lock({_WORK_LOCK})"
"""Taken by every claimer: counting live claims and claiming one item is one serialised step."""
_WORK_LOCK_SHARED_SQL = f"SELECT pg_advisory_xact_lock_shared({_WORK_LOCK})"
"""Taken by renewals, so a claim cannot be renewed while a claimer counts it as expired."""


def _checkpoint_of(row: Any) -> Checkpoint:
    """A checkpoint from a ``jixu_checkpoints`` row in column order."""
    return Checkpoint(row[0], row[1], int(row[2]), int(row[3]), row[4], row[5], row[6], row[7])


# --- DSN handling: never show a password -------------------------------------------------------------

# libpq's own rules: the user part runs to the first "@" unless a "/" comes first ("#" and "?" are no delimiters
# there, nor is "#" after the "?": a libpq URL has no fragment), and an unquoted key=value value escapes with "\".
_URL_USERINFO = re.compile(r"^(postgres(?:ql)?://)([^@/]*)@", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|(?:\\.|[^\s\\])*)", re.IGNORECASE)


def mask_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (URL or ``key=value`` form)."""
    match = _URL_USERINFO.match(dsn)
    if match or dsn.lower().startswith(("postgresql://", "postgres://")):
        if match and ":" in match.group(2):
            user, _, password = match.group(2).partition(":")
            if password:
                dsn = f"{match.group(1)}{user}:***@{dsn[match.end():]}"
        return _masked_query(dsn)
    return _KV_PASSWORD.sub(r"\1***", dsn)


def _query_passwords(url: str) -> list[tuple[int, int]]:
    """The spans of the values of a URL's ``password`` parameters, however the name is spelt (libpq decodes
    ``passwor%64`` to ``password``)."""
    userinfo = _URL_USERINFO.match(url)
    start = url.find("?", userinfo.end() if userinfo else 0)
    if start < 0:
        return []
    spans, at = [], start + 1
    for piece in url[start + 1:].split("&"):
        name, eq, _value = piece.partition("=")
        if eq and unquote(name).strip().lower() == "password":
            spans.append((at + len(name) + 1, at + len(piece)))
        at += len(piece) + 1
    return spans


def _masked_query(url: str) -> str:
    for begin, end in reversed(_query_passwords(url)):
        url = f"{url[:begin]}***{url[end:]}"
    return url


def _secrets(dsn: str) -> list[str]:
    """Every spelling of the password ``dsn`` carries, longest first (for scrubbing messages)."""
    found: set[str] = set()
    match = _URL_USERINFO.match(dsn)
    if match and ":" in match.group(2):
        found.add(match.group(2).partition(":")[2])
    found.update(dsn[begin:end] for begin, end in _query_passwords(dsn))
    found.update(m.group(2) for m in _KV_PASSWORD.finditer(dsn))
    try:
        parsed = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        parsed = None
    if parsed is not None:
        found.add(str(parsed))
    found |= {unquote(s) for s in found}
    found |= {s.strip("'") for s in found}
    return sorted((s for s in found if s), key=len, reverse=True)


def _describe(dsn: str) -> str:
    """``PostgreSQL database 'x' on host 'y'`` from ``dsn``, without credentials."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "PostgreSQL (malformed DSN)"
    dbname = params.get("dbname") or params.get("user") or "(default)"
    host = params.get("host") or params.get("hostaddr") or "(default host)"
    port = f" port {params['port']}" if params.get("port") else ""
    return f"PostgreSQL database {str(dbname)!r} on host {str(host)!r}{port}"


class _PooledConnection(psycopg.Connection[TupleRow]):
    """A pooled connection that keeps one cursor for the appends.

    ``Connection.execute`` makes a cursor per call, and a new cursor resolves
    the dumper of every parameter again; a cursor that runs the same query
    object again keeps its adapters (psycopg resets them only for another
    query).
    """

    _append_cursor: psycopg.Cursor[TupleRow] | None = None
    last_used: float | None = None
    """``time.monotonic()`` when ``PostgresStore._run`` last gave it back (``_check_idle`` then skips the ping)."""

    def append_cursor(self) -> psycopg.Cursor[TupleRow]:
        if self._append_cursor is None or self._append_cursor.closed:
            self._append_cursor = self.cursor()
        return self._append_cursor


class _Again(Exception):
    """Internal: the transaction must run again from the start (never leaves this module)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _appended(stream: str, batch: list[PreparedEvent], expected_seq: int, fence: Fence | None,
              result: tuple[Any, ...]) -> list[StoredRow] | None:
    """What ``jixu_append_v4``'s answer ``result`` to one append means: the rows it sealed and wrote, the
    refusal it found (raised), or ``None`` when the slow path must decide ('existing', 'busy')."""
    (status, head_seq, prev, recorded_at, hashes, lease_found, owner, epoch, expires_at, heartbeat_at,
     released, now) = result
    if status == "ok":
        rows = []
        for offset, (prepared, digest) in enumerate(zip(batch, hashes, strict=True), start=1):
            rows.append(StoredRow(prepared.id, stream, expected_seq + offset, prepared.type, prepared.data_json,
                                  prepared.meta_json, recorded_at, prev, digest))
            prev = digest
        return rows
    if status in ("conflict", "fenced"):
        # The function refused, having found none of the ids stored: word its refusal as every store does,
        # from the lease, clock and head it read under its locks.
        current = (Lease(fence.key, owner, int(epoch), float(expires_at), float(heartbeat_at), bool(released))
                   if fence is not None and lease_found else None)
        refusal = judge_append(stream, batch, expected_seq, fence, found={}, lease=current,
                               now=float(now) if now is not None else 0.0,
                               head_seq=int(head_seq) if head_seq is not None else 0)
        if isinstance(refusal, FencingError if status == "fenced" else ConcurrencyError):
            raise refusal
    return None  # 'existing' or 'busy' (or a verdict Python does not share): decide slowly


def _work_params(row: WorkRow) -> dict[str, object]:
    """The parameters of :data:`_UPDATE_WORK_SQL` for ``row``."""
    return {"status": row.status, "ready_at": row.ready_at, "enqueued_at": row.enqueued_at,
            "claimed_by": row.claimed_by, "epoch": row.epoch, "expires_at": row.expires_at,
            "heartbeat_at": row.heartbeat_at, "rerun": row.rerun, "key": row.key}


class PostgresStore(Store):
    """The store for many workers: a PostgreSQL database given by a DSN (URL or ``key=value``).

    ``min_size``/``max_size`` bound the connection pool; ``connect_timeout``
    (seconds) bounds connecting and waiting for a pooled connection.
    ``read_only`` refuses every write; ``create=False`` refuses to install the
    schema into a database that has none (:class:`~jixu.errors.StoreNotFound`).

    Commits are durable (decision 0023): every connection runs with
    ``synchronous_commit = on`` (or the stronger ``remote_apply`` when that is
    what the server, database or role set), and a writable store refuses a
    server with ``fsync = off`` (:class:`~jixu.errors.StoreNotDurable`) unless
    ``allow_unsafe_durability`` (keyword, or ``?allow_unsafe_durability=true``
    in a URL) accepts losing commits in a crash. :attr:`durability` says what
    the store runs with.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        max_payload_bytes: int | None = None,
        connect_timeout: float = 10.0,
        read_only: bool = False,
        create: bool = True,
        allow_unsafe_durability: bool | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise InvalidInput("the PostgreSQL DSN must be a non-empty string", field="dsn")
        self.url = mask_dsn(dsn)  # as given, jixu's options included
        self._opened_again = functools.partial(
            PostgresStore, dsn, min_size=0, max_size=1, max_payload_bytes=max_payload_bytes,
            connect_timeout=connect_timeout, read_only=read_only, create=False,
            allow_unsafe_durability=allow_unsafe_durability)
        dsn, url_options = postgres_dsn_and_options(dsn)
        if allow_unsafe_durability is None:  # a keyword wins over the URL, as for SQLite's options
            allow_unsafe_durability = bool(url_options.get("allow_unsafe_durability", False))
        if not isinstance(allow_unsafe_durability, bool):
            raise InvalidInput("allow_unsafe_durability must be true or false", field="allow_unsafe_durability")
        self.allow_unsafe_durability = allow_unsafe_durability
        for name, size in (("min_size", min_size), ("max_size", max_size)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidInput(f"{name} {size!r} must be an integer >= 0", field=name)
        if max_size < max(min_size, 1):
            raise InvalidInput(f"max_size {max_size} must be >= 1 and >= min_size {min_size}", field="max_size")
        if (isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float)
                or not 0 < connect_timeout < 10**6):
            raise InvalidInput(f"connect_timeout {connect_timeout!r} must be a number of seconds > 0",
                               field="connect_timeout")
        self.read_only = read_only
        self.create = create
        self.connect_timeout = float(connect_timeout)
        if max_payload_bytes is not None:
            self.max_payload_bytes = max_payload_bytes
        self._secrets = _secrets(dsn)
        self._where = _describe(dsn)
        self._closed = False
        self._close_lock = threading.Lock()
        self._max_size = max_size
        self._fast_append = True
        connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(self.connect_timeout)),
        }
        if "application_name" not in dsn:
            connect_kwargs["application_name"] = "jixu"  # visible in pg_stat_activity
        try:
            with psycopg.connect(dsn, **connect_kwargs) as conn:
                self._configure(conn)
                self.durability = self._check_durability(conn)
                self._migrate(conn)
                # jixu_append_v4 hashes convert_to(text, 'UTF8') with sha256(): byte-exact only when the database
                # stores UTF-8, and sha256() exists from PostgreSQL 11 on. Elsewhere appends take the slow path.
                self._fast_append = (conn.info.parameter_status("server_encoding") == "UTF8"
                                     and conn.info.server_version >= 110000)
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) is None and not isinstance(exc, psycopg.OperationalError):
                raise self._translate(exc) from None  # a malformed DSN: the driver's error may quote it
            raise self._translate(exc) from exc
        self._pool: ConnectionPool[_PooledConnection] = ConnectionPool(
            dsn,
            connection_class=_PooledConnection,
            kwargs=connect_kwargs,
            min_size=min_size,
            max_size=max_size,
            open=False,
            name="jixu",
            timeout=max(30.0, self.connect_timeout),
            configure=self._configure,
            check=self._check_idle,  # no ``reset``: with one, every return is handed to a pool thread
        )
        try:
            self._pool.open(wait=True, timeout=self.connect_timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            self._pool.close()
            raise self._translate(exc) from exc

    def opened_again(self) -> PostgresStore:
        """The same database through a pool of one connection, with the DSN and options this store was given."""
        return self._opened_again()

    # --- plumbing -------------------------------------------------------------------

    def _configure(self, conn: _Conn) -> None:
        if self.read_only:
            conn.execute("SET default_transaction_read_only = on")
        # Durable commits whatever the server, database or role set: a commit returns once it is flushed.
        conn.execute(_DURABLE_COMMITS_SQL)
        # The statements are written for READ COMMITTED: a claim counts the live claims after it waited for the
        # claimers' lock (under a REPEATABLE READ default its snapshot predates the wait: limits were exceeded).
        conn.execute("SET default_transaction_isolation = 'read committed'")
        # A frozen holder of row locks must not outlast the leases: the server ends its transaction.
        conn.execute(f"SET idle_in_transaction_session_timeout = {_IDLE_IN_TRANSACTION_MS}")
        if conn.info.server_version >= 140000:
            # An append is one statement that commits by itself: should its process die while the statement
            # runs (a SIGKILL, a crash), the server aborts it at the next check instead of committing it on
            # behalf of a caller that is gone, as it did when the client never sent COMMIT.
            conn.execute(f"SET client_connection_check_interval = {_CLIENT_CHECK_MS}")

    def _check_durability(self, conn: _Conn) -> str:
        """The durability this store's commits get (see :attr:`durability`); refuse ``fsync = off`` unless allowed."""
        row = conn.execute("SELECT current_setting('synchronous_commit'), current_setting('fsync')").fetchone()
        assert row is not None
        synchronous_commit, fsync = str(row[0]), str(row[1])
        if fsync == "on":
            return f"synchronous_commit={synchronous_commit}, fsync=on"
        if self.read_only:  # it commits nothing
            return f"synchronous_commit={synchronous_commit}, fsync={fsync} (unsafe; the store is read-only)"
        if not self.allow_unsafe_durability:
            raise StoreNotDurable(
                f"{self._where}: the server runs with fsync = {fsync}, so a crash or power failure can lose or "
                "corrupt committed events; jixu refuses to write to it. Turn fsync on, or accept the risk with "
                "allow_unsafe_durability=True (in a URL: ?allow_unsafe_durability=true)")
        return f"synchronous_commit={synchronous_commit}, fsync={fsync} (unsafe: allowed by allow_unsafe_durability)"

    @staticmethod
    def _check_idle(conn: _PooledConnection) -> None:
        """Pool ``check`` callback: ping only a connection idle for :data:`_IDLE_CHECK_SECONDS` or more.

        Pinging every checkout cost a round trip per operation. A connection
        the server dropped in the last seconds still fails on first use;
        :meth:`_run` then runs again an operation that is safe to repeat.
        """
        if conn.last_used is None or time.monotonic() - conn.last_used >= _IDLE_CHECK_SECONDS:
            ConnectionPool.check_connection(conn)

    def _scrub(self, text: str) -> str:
        # Only where the password stands as a token of its own: a short one ("p") must not eat the "p" of "port".
        for secret in self._secrets:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", "***", text)
        return text

    def _translate(self, exc: BaseException) -> JixuError:
        """The typed jixu error for a psycopg or pool error (the password never appears)."""
        text = self._scrub(" ".join(str(exc).split()) or type(exc).__name__)
        where = self._where
        if isinstance(exc, PoolClosed):
            return StoreError(f"{where}: the store is closed")
        if isinstance(exc, PoolTimeout):
            return StoreError(f"{where}: no pooled connection became free in time (max_size="
                              f"{self._max_size}); raise max_size or lower the concurrency ({text})")
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            return StoreReadOnly(f"{where}: the database refuses writes (read-only transaction or "
                                 f"standby server): {text}")
        if isinstance(exc, pg_errors.SerializationFailure | pg_errors.DeadlockDetected):
            return ConcurrencyError(f"{where}: the database kept aborting the transaction for a "
                                    f"conflicting one; read again and retry ({text})")
        if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled):
            return StoreLocked(f"{where}: gave up waiting for a lock or a statement ({text}); retry")
        if isinstance(exc, pg_errors.UndefinedTable | pg_errors.UndefinedFunction):
            return StoreError(f"{where}: jixu's tables are missing or damaged ({text}); was the schema "
                              "dropped? Reopen the store to recreate an empty one")
        if isinstance(exc, psycopg.IntegrityError):
            return StoreError(f"{where}: the store's tables disagree ({text}); run `jixu verify`")
        if isinstance(exc, pg_errors.RaiseException):
            return StoreError(f"{where}: refused by the database: {text}")
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return StoreError(f"{where}: permission denied ({text}); the role needs SELECT, INSERT and "
                              "UPDATE on the jixu_* tables (and CREATE for the first open)")
        if isinstance(exc, psycopg.DataError):
            return InvalidInput(f"{where}: the database rejected a value: {text}")
        if isinstance(exc, psycopg.OperationalError) or (
            isinstance(exc, psycopg.ProgrammingError) and not getattr(exc, "sqlstate", None)
        ):
            return StoreError(f"cannot use {where}: {text}")
        return StoreError(f"{where}: {text}")

    def _settled(self, exc: BaseException, in_doubt: bool) -> JixuError:
        """The error to raise for ``exc``: :class:`OutcomeUnknown` once a write's connection broke in flight.

        The server answers every refusal of a transaction, which then commits
        nothing; only a write whose connection broke before the answer came
        may have committed (unless a retry answered for it instead).
        """
        if not in_doubt:
            return self._translate(exc)
        text = self._scrub(" ".join(str(exc).split()) or type(exc).__name__)
        return OutcomeUnknown(f"cannot use {self._where}: the connection broke before this write was answered, "
                              "so whether it was committed is unknown; read it back before going on (appending "
                              f"the same batch again is a no-op if it was stored) ({text})")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self._where}: the store is closed")

    def _run(
        self,
        fn: Callable[[_PooledConnection], _T],
        *,
        write: bool = False,
        transaction: bool = False,
        snapshot: bool = False,
        idempotent: bool | None = None,
    ) -> _T:
        """Run ``fn`` on a pooled connection, in one transaction when asked, translating errors.

        A transaction the database aborts for a conflict (serialization failure,
        deadlock, a concurrent insert of the same event id) runs again, a
        bounded number of times, from the start. So does, once, an
        ``idempotent`` operation (default: every read) whose pooled connection
        turns out broken: the server may have dropped it while it sat idle.
        """
        self._check_open()
        if write and self.read_only:
            raise StoreReadOnly(f"{self._where}: opened read-only; open it writable to change it")
        retry_broken = (not write) if idempotent is None else idempotent
        in_doubt = False  # a write's connection broke before its answer came: it may have committed
        for attempt in range(1, _ATTEMPTS + 1):
            used: _PooledConnection | None = None
            try:
                # getconn/putconn, not pool.connection(): the connections are in autocommit and every transaction
                # is a conn.transaction() block, so the ``with conn`` that pool.connection() adds had nothing to
                # commit or roll back (the pool still rolls back a connection returned inside a transaction).
                conn = used = self._pool.getconn()
                try:
                    if not (transaction or snapshot):
                        return fn(conn)
                    with conn.transaction():
                        if snapshot:
                            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                        return fn(conn)
                finally:
                    # Noted here, not by a pool ``reset`` callback: the pool runs that on a worker thread, so
                    # each return cost a thread hand-off and the next checkout could find no connection.
                    conn.last_used = time.monotonic()
                    self._pool.putconn(conn)
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, _Again) as exc:
                cause = exc.cause if isinstance(exc, _Again) else exc
                if attempt == _ATTEMPTS:
                    raise self._settled(cause, in_doubt) from cause
                time.sleep(random.uniform(0, min(0.2, 0.002 * 2**attempt)))
            except psycopg.OperationalError as exc:
                broken = used is not None and used.broken
                in_doubt = in_doubt or (write and broken)
                if retry_broken and broken and attempt < _ATTEMPTS:
                    retry_broken = False  # once: a second broken connection is news worth reporting
                    continue
                raise self._settled(exc, in_doubt) from exc
            except (psycopg.Error, PoolTimeout) as exc:
                raise self._settled(exc, in_doubt) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _inspect(self, conn: _Conn) -> tuple[list[str], int]:
        """The jixu tables in the current schema and the installed schema version (0 if none)."""
        names = [str(row[0]) for row in conn.execute(_JIXU_TABLES_SQL).fetchall()]
        if "jixu_schema" not in names:
            return names, 0
        row = conn.execute("SELECT coalesce(max(version), 0) FROM jixu_schema").fetchone()
        return names, int(row[0]) if row else 0

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self._where} has jixu schema version {version}, newer than this jixu understands "
                f"({SCHEMA_VERSION}); upgrade jixu to open it",
                found=version,
                supported=SCHEMA_VERSION,
            )

    def _migrate(self, conn: _Conn) -> None:
        names, version = self._inspect(conn)
        self._check_version(version)
        if version == SCHEMA_VERSION:
            return
        if version == 0 and names:
            self._refuse_foreign(names)
        if self.read_only:
            if version == 0:
                raise StoreNotFound(f"{self._where} holds no jixu schema (nothing was created); "
                                    "open it writable once to install it")
            raise StoreReadOnly(f"{self._where} needs a schema migration to version {SCHEMA_VERSION}; "
                                "open it writable once")
        if version == 0 and not self.create:
            raise StoreNotFound(f"{self._where} holds no jixu schema and create=False (nothing was created)")
        with conn.transaction():
            conn.execute(_MIGRATION_LOCK_SQL)
            names, version = self._inspect(conn)  # another process may have migrated meanwhile
            self._check_version(version)
            if version == SCHEMA_VERSION:
                return
            if version == 0:
                if names:
                    self._refuse_foreign(names)
                conn.execute("CREATE TABLE jixu_schema (version integer PRIMARY KEY, "
                             "applied_at text NOT NULL, description text NOT NULL)")
            for number, description, statements in MIGRATIONS:
                if number <= version:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(f"INSERT INTO jixu_schema VALUES (%s, {_UTC_TEXT.format('clock_timestamp()')}, %s)",
                             (number, description))

    def _refuse_foreign(self, names: list[str]) -> None:
        raise StoreError(
            f"{self._where}: the schema holds jixu tables ({', '.join(names)}) but no jixu_schema record; "
            "refusing to touch them. Use another database or schema (search_path)."
        )

    @staticmethod
    def _clock(conn: _Conn) -> tuple[float, str]:
        """The database clock now: epoch seconds and the ``recorded_at`` text."""
        row = conn.execute(_CLOCK_SQL).fetchone()
        assert row is not None
        return float(row[0]), str(row[1])

    def schema_version(self) -> int:
        return self._run(lambda conn: self._inspect(conn)[1])

    def now(self) -> float:
        def clock(conn: _Conn) -> float:
            row = conn.execute(_NOW_SQL).fetchone()
            assert row is not None
            return float(row[0])

        return self._run(clock)

    def close(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._pool.close()

    # --- events ---------------------------------------------------------------------

    def _append(
        self,
        stream: str,
        batch: list[PreparedEvent],
        expected_seq: int,
        fence: Fence | None,
        genesis_hash: str,
    ) -> list[StoredRow]:
        """One statement, one round trip, one commit in the common case; the rare cases decide slowly.

        ``jixu_append_v4`` (migration 4) locks the head, checks fence and
        head, seals the batch with the database clock and inserts it, all in
        the autocommit transaction of one ``SELECT``. A batch whose ids are
        already stored (a retry, or a conflict) goes to :meth:`_append_slowly`,
        which decides with :func:`~jixu.ledger.store.decide_append` in a transaction of its own.
        """
        if self._fast_append:
            rows = self._run(lambda conn: self._append_once(conn, stream, batch, expected_seq, fence, genesis_hash),
                             write=True, idempotent=True)  # given ids: a repeat finds them stored
            if rows is not None:
                return rows
        return self._append_slowly(stream, batch, expected_seq, fence, genesis_hash)

    def append_many(self, requests: Sequence[AppendRequest]) -> list[list[Event] | JixuError]:
        """Commit the appends in one transaction (one WAL flush), each all or nothing with its own answer.

        Each goes through ``jixu_append_v4`` as :meth:`append` does, in stream order (so two processes'
        batches lock the heads they share in one order). A refused append inserted nothing and is answered
        with its refusal; one the function leaves to the slow path (ids already stored, a busy head), or a
        batch the database aborts, is appended on its own after the others, as :meth:`append` would.
        """
        results: list[list[Event] | JixuError | None] = [None] * len(requests)
        queued: list[tuple[int, AppendRequest, list[PreparedEvent]]] = []
        for index, request in enumerate(requests):
            try:
                queued.append((index, request, self._prepare_append(request.stream, request.events,
                                                                    request.expected_seq, request.fence,
                                                                    request.genesis_hash)))
            except JixuError as refused:
                results[index] = refused
        later = queued
        if self._fast_append and len(queued) > 1:
            ordered = sorted(queued, key=lambda item: item[1].stream)

            def together(conn: _PooledConnection) -> list[list[StoredRow] | JixuError | None]:
                return self._append_together(conn, [(request, batch) for _index, request, batch in ordered])

            try:
                answers = self._run(together, write=True, transaction=True, idempotent=True)
            except JixuError:
                # The transaction rolled back, or its outcome is in doubt (a broken connection): each append
                # runs again on its own below; their ids make a committed one found stored, not written twice.
                answers = [None] * len(ordered)
            later = []
            for (index, request, batch), answer in zip(ordered, answers, strict=True):
                if answer is None:
                    later.append((index, request, batch))
                elif isinstance(answer, JixuError):
                    results[index] = answer
                else:
                    results[index] = [row.to_event() for row in answer]
        for index, request, batch in later:
            try:
                results[index] = [row.to_event() for row in self._append(
                    request.stream, batch, request.expected_seq, request.fence,
                    request.genesis_hash or GENESIS_HASH)]
            except JixuError as error:
                results[index] = error
        return [result for result in results if result is not None]

    def _append_once(
        self,
        conn: _PooledConnection,
        stream: str,
        batch: list[PreparedEvent],
        expected_seq: int,
        fence: Fence | None,
        genesis_hash: str,
    ) -> list[StoredRow] | None:
        """The rows ``jixu_append_v4`` sealed and committed, or ``None`` when the slow path must decide."""
        cursor = conn.append_cursor()
        try:
            result = cursor.execute(_APPEND_SQL, (
                stream, expected_seq, genesis_hash,
                fence.key if fence else None, fence.owner if fence else None, fence.epoch if fence else None,
                [p.id for p in batch], [p.type for p in batch], [p.data_json for p in batch],
                [p.meta_json for p in batch],
            )).fetchone()
        except pg_errors.UniqueViolation as exc:
            if exc.diag.constraint_name == _ID_CONSTRAINT:
                return None  # an id of the batch is stored, or was committed meanwhile: decide slowly
            raise
        assert result is not None
        return _appended(stream, batch, expected_seq, fence, result)

    def _append_together(self, conn: _PooledConnection, appends: Sequence[tuple[AppendRequest, list[PreparedEvent]]]
                         ) -> list[list[StoredRow] | JixuError | None]:
        """Each of ``appends`` through ``jixu_append_v4``, all in one statement (``jixu_append_many_v6``),
        answered as :meth:`_append_once` answers one: its rows, its refusal, or ``None`` (decide slowly).

        Inside a transaction of several appends: an error of the statement (a unique violation of a stored
        id) aborts the transaction and is raised."""
        streams, expected, geneses, keys, owners, epochs, counts = [], [], [], [], [], [], []
        ids, types, data, meta = [], [], [], []
        for request, batch in appends:
            fence = request.fence
            streams.append(request.stream)
            expected.append(request.expected_seq)
            geneses.append(request.genesis_hash or GENESIS_HASH)
            keys.append(fence.key if fence else None)
            owners.append(fence.owner if fence else None)
            epochs.append(fence.epoch if fence else None)
            counts.append(len(batch))
            for prepared in batch:
                ids.append(prepared.id)
                types.append(prepared.type)
                data.append(prepared.data_json)
                meta.append(prepared.meta_json)
        results = conn.append_cursor().execute(_APPEND_MANY_SQL, (
            streams, expected, geneses, keys, owners, epochs, counts, ids, types, data, meta)).fetchall()
        if len(results) != len(appends):
            raise StoreError(f"jixu_append_many_v6 answered {len(results)} of {len(appends)} appends")
        answers: list[list[StoredRow] | JixuError | None] = []
        for (request, batch), result in zip(appends, results, strict=True):
            try:
                answers.append(_appended(request.stream, batch, request.expected_seq, request.fence, result))
            except (ConcurrencyError, FencingError) as refused:  # the function wrote nothing for it
                answers.append(refused)
        return answers

    def _append_after(self, stream: str, expected_seq: int, fence: Fence | None,
                      build: Callable[[list[StoredRow], int], list[PreparedEvent]]
                      ) -> tuple[list[StoredRow], list[StoredRow]]:
        def transaction(conn: _PooledConnection) -> tuple[list[StoredRow], list[StoredRow]]:
            # The head row locked first (as every append locks it): nothing is appended to the stream by
            # another transaction between this read and the insert.
            head = conn.execute("SELECT head_seq FROM jixu_streams WHERE stream = %s FOR UPDATE",
                                (stream,)).fetchone()
            if head is None:
                raise NotFound(f"stream {stream!r} has no events", stream=stream)
            rows = [StoredRow(*row) for row in conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE stream = %s AND seq > %s ORDER BY seq",
                (stream, expected_seq))]
            batch = build(rows, int(head[0]))
            if not batch:
                return rows, []
            return rows, self._append_in(conn, stream, batch, int(head[0]), fence, GENESIS_HASH)

        # Given ids: a transaction run again after a broken connection finds a committed batch stored.
        return self._run(transaction, write=True, transaction=True, idempotent=True)

    def _append_slowly(
        self,
        stream: str,
        batch: list[PreparedEvent],
        expected_seq: int,
        fence: Fence | None,
        genesis_hash: str,
    ) -> list[StoredRow]:
        """The append as several statements in one transaction: for batches whose ids are already stored."""
        return self._run(lambda conn: self._append_in(conn, stream, batch, expected_seq, fence, genesis_hash),
                         write=True, transaction=True, idempotent=True)

    def _append_in(self, conn: _Conn, stream: str, batch: list[PreparedEvent], expected_seq: int, fence: Fence | None,
                   genesis_hash: str) -> list[StoredRow]:
        """The slow append's statements inside the open transaction."""
        ids = [p.id for p in batch]
        for _ in range(3):
            # Lock the head first: everything read below then includes what its last holder committed.
            head = conn.execute("SELECT head_seq, head_hash FROM jixu_streams WHERE stream = %s FOR UPDATE",
                                (stream,)).fetchone()
            found = {
                row[0]: StoredRow(*row)
                for row in conn.execute(f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE id = ANY(%s)", (ids,))
            }
            current = self._lease_row(conn, fence.key, lock=True) if fence is not None else None
            now, recorded_at = self._clock(conn)  # read after the locks are held
            verdict = decide_append(stream, batch, expected_seq, fence, found=found, lease=current, now=now,
                                    head=(int(head[0]), str(head[1])) if head else None,
                                    genesis_hash=genesis_hash, recorded_at=recorded_at)
            if isinstance(verdict, JixuError):
                raise verdict
            if isinstance(verdict, AlreadyStored):
                return verdict
            rows = verdict
            if head is None:
                created = conn.execute(
                    "INSERT INTO jixu_streams (stream, head_seq, head_hash, genesis_hash, created_at) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (stream) DO NOTHING RETURNING stream",
                    (stream, rows[-1].seq, rows[-1].hash, genesis_hash, recorded_at),
                ).fetchone()
                if created is None:
                    continue  # another appender created the stream meanwhile: decide again under its lock
            else:
                conn.execute("UPDATE jixu_streams SET head_seq = %s, head_hash = %s WHERE stream = %s",
                             (rows[-1].seq, rows[-1].hash, stream))
            try:
                with conn.cursor() as cursor:
                    cursor.executemany(
                        f"INSERT INTO jixu_events ({_ROW_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        [(r.id, r.stream, r.seq, r.type, r.data_json, r.meta_json, r.recorded_at,
                          r.prev_hash, r.hash) for r in rows],
                    )
            except pg_errors.UniqueViolation as exc:
                if exc.diag.constraint_name == _ID_CONSTRAINT:
                    raise _Again(exc) from exc  # the same id was committed meanwhile: decide again
                raise
            return rows
        raise StoreError(f"{self._where}: the head of stream {stream!r} kept changing; retry")

    def _chunk(self, conn: _Conn, stream: str, start: int, last: int) -> list[StoredRow]:
        return [StoredRow(*row) for row in conn.execute(
            f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE stream = %s AND seq >= %s AND seq <= %s "
            "ORDER BY seq LIMIT %s",
            (stream, start, last, _CHUNK),
        ).fetchall()]

    def _read_rows(self, stream: str, from_seq: int, to_seq: int | None) -> Iterator[StoredRow]:
        last = to_seq if to_seq is not None else 2**62
        start = from_seq
        while start <= last:
            chunk = self._run(lambda conn, start=start: self._chunk(conn, stream, start, last))  # type: ignore[misc]
            yield from chunk
            if len(chunk) < _CHUNK:
                return
            start = chunk[-1].seq + 1

    def _verify_snapshot(self, stream: str) -> VerifyReport:
        def snapshot(conn: _Conn) -> VerifyReport:
            info = conn.execute("SELECT head_seq, head_hash, genesis_hash FROM jixu_streams WHERE stream = %s",
                                (stream,)).fetchone()
            head = (int(info[0]), str(info[1])) if info else (0, GENESIS_HASH)

            def rows() -> Iterator[StoredRow]:
                start = 1
                while True:  # keyset chunks, all inside this transaction's one snapshot
                    chunk = self._chunk(conn, stream, start, 2**62)
                    yield from chunk
                    if len(chunk) < _CHUNK:
                        return
                    start = chunk[-1].seq + 1

            return verify_rows(stream, rows(), genesis_hash=str(info[2]) if info else GENESIS_HASH,
                               recorded_head=head)

        return self._run(snapshot, snapshot=True)

    def _get_row(self, event_id: str) -> StoredRow | None:
        row = self._run(lambda conn: conn.execute(
            f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE id = %s", (event_id,)).fetchone())
        return StoredRow(*row) if row else None

    def _stream_info(self, stream: str) -> StreamInfo | None:
        row = self._run(lambda conn: conn.execute(
            f"SELECT {_STREAM_COLUMNS} FROM jixu_streams WHERE stream = %s", (stream,)).fetchone())
        return StreamInfo(*row) if row else None

    def _list_streams(self, prefix: str, after: str, limit: int) -> list[StreamInfo]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._run(lambda conn: conn.execute(
            f"SELECT {_STREAM_COLUMNS} FROM jixu_streams "
            "WHERE stream LIKE %s ESCAPE '\\' AND stream > %s ORDER BY stream LIMIT %s",
            (escaped + "%", after, limit)).fetchall())
        return [StreamInfo(*row) for row in rows]

    def _list_group_streams(self, prefix: str, after: str, limit: int, groups: list[str]) -> list[StreamInfo]:
        # One index range per project (project, stream > after), each cut at ``limit`` (LATERAL), merged: the rows
        # read are at most limit x projects, whatever else the store holds.
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._run(lambda conn: conn.execute(
            f"SELECT s.{_STREAM_COLUMNS.replace(', ', ', s.')} FROM unnest(%s::text[]) AS p (project) "
            f"CROSS JOIN LATERAL (SELECT {_STREAM_COLUMNS} FROM jixu_streams WHERE project = p.project "
            "AND stream > %s AND stream LIKE %s ESCAPE '\\' ORDER BY stream LIMIT %s) AS s "
            "ORDER BY s.stream LIMIT %s", (groups, max(after, prefix), escaped + "%", limit, limit)).fetchall())
        return [StreamInfo(*row) for row in rows]

    # --- sessions and credential use -------------------------------------------------

    def _create_session(self, key: str, subject: str, ttl: float) -> Session:
        def create(conn: _Conn) -> Session:
            now = self._clock(conn)[0]
            conn.execute("DELETE FROM jixu_sessions WHERE expires_at < %s", (now - SESSION_RETENTION,))
            inserted = conn.execute(
                f"INSERT INTO jixu_sessions ({_SESSION_COLUMNS}) VALUES (%s, %s, %s, %s, NULL) "
                "ON CONFLICT (key) DO NOTHING RETURNING key", (key, subject, now, now + ttl)).fetchone()
            if inserted is None:
                raise InvalidInput(f"session {key!r} exists already", field="key")
            return Session.of_row(key, subject, now, now + ttl, None, now)

        return self._run(create, write=True, transaction=True)

    def _get_session(self, key: str) -> Session | None:
        row = self._run(lambda conn: conn.execute(
            f"SELECT {_SESSION_COLUMNS}, extract(epoch FROM clock_timestamp())::float8 FROM jixu_sessions "
            "WHERE key = %s", (key,)).fetchone())
        return Session.of_row(*row) if row else None

    def _revoke_sessions(self, key: str | None, subject: str | None) -> int:
        column, value = ("key", key) if key is not None else ("subject", subject)

        def revoke(conn: _Conn) -> int:
            cursor = conn.execute(
                "UPDATE jixu_sessions SET revoked_at = now.t FROM (SELECT extract(epoch FROM clock_timestamp())"
                f"::float8 AS t) AS now WHERE {column} = %s AND revoked_at IS NULL AND expires_at > now.t", (value,))
            return int(cursor.rowcount)

        return self._run(revoke, write=True, idempotent=True)  # ending what has ended changes nothing

    def _record_use(self, key: str) -> None:
        self._run(lambda conn: conn.execute(
            "INSERT INTO jixu_last_used VALUES (%s, extract(epoch FROM clock_timestamp())::float8) "
            "ON CONFLICT (key) DO UPDATE SET used_at = excluded.used_at", (key,)), write=True, idempotent=True)

    def _last_used(self, keys: list[str]) -> dict[str, float]:
        rows = self._run(lambda conn: conn.execute(
            "SELECT key, used_at FROM jixu_last_used WHERE key = ANY(%s)", (keys,)).fetchall())
        return {str(key): float(at) for key, at in rows}

    # --- leases ---------------------------------------------------------------------

    @staticmethod
    def _lease_row(conn: _Conn, key: str, *, lock: bool = False) -> Lease | None:
        row = conn.execute(
            f"SELECT {_LEASE_COLUMNS} FROM jixu_leases WHERE key = %s{' FOR UPDATE' if lock else ''}", (key,)
        ).fetchone()
        return Lease(row[0], row[1], int(row[2]), float(row[3]), float(row[4]), bool(row[5])) if row else None

    def _change_lease(self, key: str, change: Callable[[Lease | None, float], Lease]) -> Lease:
        answer = self._change_leases([(key, change)], durable=True, refusals=())[0]  # () : raised, not answered
        assert isinstance(answer, Lease)
        return answer

    def _change_leases(self, changes: list[tuple[str, LeaseChange]], *, durable: bool,
                       refusals: tuple[type[JixuError], ...]) -> list[Lease | JixuError]:
        """The leases' changes in one transaction of three or four statements, however many there are: the
        rows locked in key order (two processes changing overlapping sets cannot deadlock), each change
        decided in that order (two of one key: the second sees the first), one update, one insert."""
        # Every commit here waits for the WAL flush, so ``durable`` changes nothing.
        def apply(conn: _Conn) -> list[Lease | JixuError]:
            now = self._clock(conn)[0]  # one store time for the batch, as SQLite's one transaction has
            keys = sorted({key for key, _change in changes})
            current = {str(row[0]): Lease(str(row[0]), str(row[1]), int(row[2]), float(row[3]), float(row[4]),
                                          bool(row[5])) for row in conn.execute(
                f"SELECT {_LEASE_COLUMNS} FROM jixu_leases WHERE key = ANY(%s) ORDER BY key FOR UPDATE", (keys,))}
            stored = set(current)
            changed: dict[str, Lease] = {}

            def change_one(key: str, change: LeaseChange) -> Lease:
                lease = change(current.get(key), now)
                current[key] = changed[key] = lease
                return lease

            answers = each_change(changes, change_one, refusals)
            for leases, sql in (([lease for key, lease in changed.items() if key in stored], _UPDATE_LEASES_SQL),
                                ([lease for key, lease in changed.items() if key not in stored], _INSERT_LEASES_SQL)):
                if not leases:
                    continue
                written = conn.execute(sql, (
                    [lease.key for lease in leases], [lease.owner for lease in leases],
                    [lease.epoch for lease in leases], [lease.expires_at for lease in leases],
                    [lease.heartbeat_at for lease in leases], [lease.released for lease in leases])).fetchall()
                if len(written) != len(leases):
                    # Another owner created one of the new leases meanwhile: decide them all again, under its lock.
                    raise _Again(StoreError(f"{self._where}: a lease was created meanwhile"))
            return answers

        return self._run(apply, write=True, transaction=True) if changes else []

    def _release_lease(self, fence: Fence) -> None:
        self._run(lambda conn: conn.execute(
            "UPDATE jixu_leases SET released = true WHERE key = %s AND owner = %s AND epoch = %s",
            (fence.key, fence.owner, fence.epoch)), write=True, idempotent=True)

    def _get_lease(self, key: str) -> Lease | None:
        return self._run(lambda conn: self._lease_row(conn, key))

    # --- checkpoints ----------------------------------------------------------------

    def _write_checkpoints(self, checkpoints: list[Checkpoint]) -> None:
        def write(conn: _PooledConnection) -> None:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO jixu_checkpoints (stream, name, seq, reducer_version, head_hash, state, digest, "
                    "created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                    f"coalesce(nullif(%s, ''), {_UTC_TEXT.format('clock_timestamp()')})) "
                    "ON CONFLICT (stream, name) DO UPDATE SET seq = excluded.seq, "
                    "reducer_version = excluded.reducer_version, head_hash = excluded.head_hash, "
                    "state = excluded.state, digest = excluded.digest, created_at = excluded.created_at",
                    [(checkpoint.stream, checkpoint.name, checkpoint.seq, checkpoint.reducer_version,
                      checkpoint.head_hash, checkpoint.state_json, checkpoint.digest, checkpoint.created_at)
                     for checkpoint in checkpoints])

        self._run(write, write=True, transaction=True, idempotent=True)  # upserts of the same rows

    def _read_checkpoints(self, stream: str, names: list[str]) -> dict[str, Checkpoint]:
        rows = self._run(lambda conn: conn.execute(
            "SELECT stream, name, seq, reducer_version, head_hash, state, digest, created_at "
            "FROM jixu_checkpoints WHERE stream = %s AND name = ANY(%s)", (stream, names)).fetchall())
        return {str(row[1]): _checkpoint_of(row) for row in rows}

    def _checkpoints_named(self, name: str, streams: list[str]) -> dict[str, Checkpoint]:
        rows = self._run(lambda conn: conn.execute(
            "SELECT stream, name, seq, reducer_version, head_hash, state, digest, created_at "
            "FROM jixu_checkpoints WHERE name = %s AND stream = ANY(%s)", (name, streams)).fetchall())
        return {str(row[0]): _checkpoint_of(row) for row in rows}

    # --- work queue -----------------------------------------------------------------

    @staticmethod
    def _work_row(row: Any) -> WorkRow:
        key, group, status, ready_at, enqueued_at, claimed_by, epoch, expires_at, heartbeat_at, rerun, pos = row
        return WorkRow(str(key), str(group), str(status), float(ready_at), float(enqueued_at),
                       None if claimed_by is None else str(claimed_by), int(epoch),
                       None if expires_at is None else float(expires_at),
                       None if heartbeat_at is None else float(heartbeat_at), bool(rerun), int(pos))

    @staticmethod
    def _update_work(conn: _Conn, row: WorkRow) -> None:
        conn.execute(_UPDATE_WORK_SQL, _work_params(row))

    def _change_work(self, key: str, change: Callable[[WorkRow | None, float], WorkRow]) -> tuple[WorkItem, WorkRow]:
        return self._run(lambda conn: self._work_in(conn, key, change), write=True, transaction=True)

    def _renew_works(self, changes: list[tuple[str, WorkChange]]) -> list[WorkRow | FencingError]:
        """The renewals in one transaction of four statements, however many there are: the rows locked in key
        order, each renewal decided in that order, one update of the renewed rows."""
        def apply(conn: _Conn) -> list[WorkRow | FencingError]:
            conn.execute(_WORK_LOCK_SHARED_SQL)  # no claimer counts live claims while these are renewed
            now = self._clock(conn)[0]
            keys = sorted({key for key, _change in changes})
            current = {row.key: row for row in map(self._work_row, conn.execute(
                f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE key = ANY(%s) ORDER BY key FOR UPDATE", (keys,)))}
            changed: dict[str, WorkRow] = {}

            def renew_one(key: str, change: WorkChange) -> WorkRow:
                before = current.get(key)
                row = change(before, now)  # a renewal of a missing item is refused (FencingError)
                if row is not before:
                    current[key] = changed[key] = row
                return row

            answers = renewal_answers(each_change(changes, renew_one))
            if changed:
                rows = list(changed.values())
                conn.execute(_UPDATE_WORKS_SQL, (
                    [row.key for row in rows], [row.status for row in rows], [row.ready_at for row in rows],
                    [row.enqueued_at for row in rows], [row.claimed_by for row in rows], [row.epoch for row in rows],
                    [row.expires_at for row in rows], [row.heartbeat_at for row in rows],
                    [row.rerun for row in rows]))
            return answers

        return self._run(apply, write=True, transaction=True) if changes else []

    def _append_and_enqueue(self, stream: str, batch: list[PreparedEvent], expected_seq: int, fence: Fence | None,
                            change: Callable[[WorkRow | None, float], WorkRow], key: str,
                            genesis_hash: str = GENESIS_HASH) -> list[StoredRow]:
        def both(conn: _Conn) -> list[StoredRow]:
            rows = self._append_in(conn, stream, batch, expected_seq, fence, genesis_hash)
            self._work_in(conn, key, change)
            return rows

        return self._run(both, write=True, transaction=True, idempotent=True)

    def _work_in(self, conn: _Conn, key: str, change: Callable[[WorkRow | None, float], WorkRow], *,
                 now: float | None = None) -> tuple[WorkItem, WorkRow]:
        """A work item's change inside the open transaction (at store time ``now`` if given)."""
        for _ in range(3):
            found = conn.execute(f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE key = %s FOR UPDATE",
                                 (key,)).fetchone()
            current = self._work_row(found) if found else None
            if now is None:
                now = self._clock(conn)[0]
            row = change(current, now)
            if row is current:
                return row.item(now), row
            if current is not None:
                self._update_work(conn, row)
                return row.item(now), row
            inserted = conn.execute(
                "INSERT INTO jixu_work (key, project, status, ready_at, enqueued_at, claimed_by, epoch, "
                "expires_at, heartbeat_at, rerun) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (key) DO NOTHING RETURNING position",
                (row.key, row.group, row.status, row.ready_at, row.enqueued_at, row.claimed_by, row.epoch,
                 row.expires_at, row.heartbeat_at, row.rerun)).fetchone()
            if inserted is not None:
                row = WorkRow(row.key, row.group, row.status, row.ready_at, row.enqueued_at, row.claimed_by,
                              row.epoch, row.expires_at, row.heartbeat_at, row.rerun, int(inserted[0]))
                return row.item(now), row
            # another caller created the item meanwhile: decide again under its row lock
        raise StoreError(f"{self._where}: work item {key!r} kept changing; retry")

    def _claim_works(self, owner: str, ttl: float, order: ClaimOrder, count: int) -> list[WorkClaim]:
        def claim(conn: _Conn) -> list[WorkClaim]:
            conn.execute(_WORK_LOCK_SQL)  # claimers take turns: the census below stays true until commit
            now = self._clock(conn)[0]
            live = {str(g): int(n) for g, n in conn.execute(
                "SELECT project, count(*) FROM jixu_work WHERE status = 'claimed' AND expires_at > %s "
                "GROUP BY project", (now,)).fetchall()}
            oldest = {str(g): (float(r), int(pos)) for g, r, pos in conn.execute(
                f"SELECT DISTINCT ON (project) project, ready_at, position FROM jixu_work WHERE {_CLAIMABLE} "
                "ORDER BY project, ready_at, position", {"now": now}).fetchall()}
            served = {str(g): int(n) for g, n in conn.execute(
                "SELECT project, last_claim FROM jixu_work_projects").fetchall()}

            def claim_from(group: str, number: int) -> tuple[WorkClaim, tuple[float, int] | None] | None:
                # SKIP LOCKED: pass over an item a finisher or enqueuer holds right now.
                found = conn.execute(
                    f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE project = %(group)s AND {_CLAIMABLE} "
                    "ORDER BY ready_at, position LIMIT 1 FOR UPDATE SKIP LOCKED",
                    {"group": group, "now": now}).fetchone()
                if not found:
                    return None
                row = claimed_row(self._work_row(found), owner, ttl, now)
                # The claim written and the group's next oldest item read in one round trip: the query beside
                # a data-modifying WITH sees the rows as they were before it, so the claimed item is left out.
                after = conn.execute(
                    f"WITH claimed AS ({_UPDATE_WORK_SQL}) SELECT ready_at, position FROM jixu_work "
                    f"WHERE project = %(group)s AND key <> %(key)s AND {_CLAIMABLE} "
                    "ORDER BY ready_at, position LIMIT 1", {**_work_params(row), "group": group, "now": now}
                ).fetchone()
                return work_claim_of(row, number), (float(after[0]), int(after[1])) if after else None

            made = claims_up_to(count, QueueCensus(live, oldest, served), order, claim_from)
            # Each group's latest claim number and count, once per batch (the census kept them meanwhile).
            for group, (last, claims) in served_groups(made).items():
                conn.execute("INSERT INTO jixu_work_projects (project, last_claim, last_claimed_at, claims) "
                             "VALUES (%s, %s, %s, %s) ON CONFLICT (project) DO UPDATE SET "
                             "last_claim = excluded.last_claim, last_claimed_at = excluded.last_claimed_at, "
                             "claims = jixu_work_projects.claims + excluded.claims",
                             (group, last, now, claims))
            return made

        return self._run(claim, write=True, transaction=True)

    def _list_work(self, group: str | None, status: str | None) -> tuple[list[WorkRow], float]:
        def read(conn: _Conn) -> tuple[list[WorkRow], float]:
            now = self._clock(conn)[0]
            rows = conn.execute(
                f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE (%(group)s::text IS NULL OR project = %(group)s) "
                "AND (%(status)s::text IS NULL OR status = %(status)s) ORDER BY ready_at, position",
                {"group": group, "status": status}).fetchall()
            return [self._work_row(r) for r in rows], now

        return self._run(read, snapshot=True)

    def _get_work(self, key: str) -> tuple[WorkRow | None, float]:
        def read(conn: _Conn) -> tuple[WorkRow | None, float]:
            now = self._clock(conn)[0]
            found = conn.execute(f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE key = %s", (key,)).fetchone()
            return (self._work_row(found) if found else None), now

        return self._run(read)


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresStore", "mask_dsn"]

"""The SQL of metric ingest and reads, per database: PostgreSQL and SQLite differ in parameter
style, LEAST/GREATEST against min/max, and how many roll-up rows one statement merges."""
from __future__ import annotations

import functools
import sqlite3

import numpy as np

from sqlalchemy import text
from sqlalchemy.orm import Session

from paritywatch.backend.store.metric_packing import CHUNK_SHIFT, Rollups, combine_key_stats, combine_rollups
from paritywatch.backend.store.pg_arrays import ByteaArray, bind_column


# Rows one SQLite INSERT takes, within the parameters a statement may have (32,766 since 3.32).
ROWS_PER_STATEMENT = 500
# Keys one SQLite statement looks up or inserts (PostgreSQL takes them all as one array).
KEY_ROWS_PER_STATEMENT = 500
SQLITE_MAX_PARAMETERS = 32_766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


@functools.lru_cache(maxsize=256)  # the driver caches the prepared statement by its text as well
def _multi_row_sql(head: str, tail: str, width: int, rows: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return head + "VALUES " + ", ".join([row] * rows) + tail


def _insert_flat(cur, head: str, tail: str, width: int, flat: list) -> None:
    """SQLite: rows of `width` values, laid end to end in `flat`, as multi-row INSERTs."""
    per_statement = min(ROWS_PER_STATEMENT, SQLITE_MAX_PARAMETERS // width)
    rows = len(flat) // width
    for i in range(0, rows, per_statement):
        part = min(per_statement, rows - i)
        cur.execute(_multi_row_sql(head, tail, width, part), flat[i * width : (i + part) * width])


@functools.lru_cache(maxsize=8)
def _insert_keys_sql(rows: int) -> str:
    return ("INSERT INTO metric_keys (run_id, key, count) VALUES " + ", ".join(["(?, ?, 0)"] * rows)
            + " ON CONFLICT (run_id, key) DO NOTHING RETURNING key, id")


class MetricSql:
    """Ingest statements for one database dialect, for a DB-API cursor."""

    def __init__(self, dialect: str):
        self.pg = pg = dialect == "postgresql"
        self.least, self.greatest = ("LEAST", "GREATEST") if pg else ("min", "max")
        self.param = p = "%s" if pg else "?"
        lo, hi = self.least, self.greatest
        claim = ("INSERT INTO ingest_batches (run_id, client_id, seq, points, component_id, digest, received_at) "
                 f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, CURRENT_TIMESTAMP) "
                 "ON CONFLICT (run_id, client_id, seq) DO NOTHING RETURNING id")
        # The run (not being deleted) and, when the batch names one, its component: one lookup.
        self.target = (
            "SELECT r.created_at, r.deleted_at, c.id AS component_id, r.last_step FROM runs r "
            f"LEFT JOIN components c ON c.id = {p} AND c.run_id = r.id WHERE r.id = {p}"
        )
        # PostgreSQL: the lookup and the claim in one statement (one round trip of the one writer
        # instead of two); the claim is made only where the target exists, so it never fails a
        # foreign key. SQLite runs the two in turn.
        self._claim = claim if not pg else (
            "WITH target AS (" + self.target + "), claim AS ("
            "INSERT INTO ingest_batches (run_id, client_id, seq, points, component_id, digest, received_at) "
            "SELECT %s, %s, %s, %s, %s, %s, CURRENT_TIMESTAMP FROM target "
            "WHERE target.deleted_at IS NULL AND (target.component_id IS NOT NULL OR %s::bigint IS NULL) "
            "ON CONFLICT (run_id, client_id, seq) DO NOTHING RETURNING id) "
            "SELECT target.*, (SELECT id FROM claim) FROM target"
        )
        self.claimed = f"SELECT digest FROM ingest_batches WHERE run_id = {p} AND client_id = {p} AND seq = {p}"
        chunks = "INSERT INTO metric_chunks (series_id, step_min, batch_id, step_max, count, steps, vals, in_level1) "
        # PostgreSQL: a batch's chunks in one statement over arrays (one execution a row cost the
        # server a parse, plan and execution each: 40 a batch of the load bench).
        self.chunks = chunks + (
            "SELECT * FROM unnest(%s::int[], %s::bigint[], %s::bigint[], %s::bigint[], %s::int[], %s::bytea[], "
            "%s::bytea[], %s::bool[])") if pg else None
        upd = (
            "ON CONFLICT (series_id, level, bucket) DO UPDATE SET "
            f"min = {lo}(metric_rollups.min, excluded.min), "
            f"max = {hi}(metric_rollups.max, excluded.max), "
            "last_value = CASE WHEN excluded.last_step >= metric_rollups.last_step "
            "THEN excluded.last_value ELSE metric_rollups.last_value END, "
            f"last_step = {hi}(metric_rollups.last_step, excluded.last_step), "
            "count = metric_rollups.count + excluded.count"
        )
        cols = "INSERT INTO metric_rollups (series_id, level, bucket, min, max, last_step, last_value, count) "
        # PostgreSQL: one statement for all rows, in the sorted order of the arrays (lock order).
        # SQLite builds its multi-row statements from the parts (_insert_multi_row).
        self.rollups = (
            cols + "SELECT * FROM unnest(%s::int[], %s::int[], %s::bigint[], %s::float8[], %s::float8[], "
            "%s::bigint[], %s::float8[], %s::bigint[]) " + upd
        ) if pg else None
        self._chunks_head, self._rollups_head, self._rollups_merge = chunks, cols, upd
        self.stats = (
            f"UPDATE metric_keys SET count = count + {p}, "
            f"first_step = CASE WHEN first_step IS NULL THEN {p} ELSE {lo}(first_step, {p}) END, "
            f"last_value = CASE WHEN last_step IS NULL OR {p} >= last_step THEN {p} ELSE last_value END, "
            f"last_step = CASE WHEN last_step IS NULL THEN {p} ELSE {hi}(last_step, {p}) END "
            f"WHERE id = {p}"
        )
        self.run = f"UPDATE runs SET last_step = {p} WHERE id = {p} AND (last_step IS NULL OR last_step < {p})"
        self.job = ("INSERT INTO detect_jobs (run_id, kind, payload, created_at) "
                    f"VALUES ({p}, 'metrics', {p}, CURRENT_TIMESTAMP) RETURNING id")

    def claim_statement(self, run_id: int, client_id: str, seq: int, points: int, component_id: int | None,
                        digest: str) -> tuple[str, tuple]:
        """PostgreSQL: the statement that looks the target up and claims the batch; its row is
        read by `claim_result`."""
        return self._claim, (component_id, run_id, run_id, client_id, seq, points, component_id, digest, component_id)

    @staticmethod
    def claim_result(row: tuple | None) -> tuple[tuple | None, int | None]:
        """(the target row, as `target` selects it, or None: no such run; the ledger id of the
        claimed (run, client, seq), or None: a replay, or nothing claimed because the run is
        being deleted or has no such component)."""
        return (row[:4], row[4]) if row is not None else (None, None)

    def claim(self, cur, run_id: int, client_id: str, seq: int, points: int, component_id: int | None,
              digest: str) -> tuple[tuple | None, int | None]:
        """`claim_result` of the batch's claim, made now. Either way the claim is made only for a
        run (and component) the statement sees, so it never fails a foreign key."""
        if self.pg:
            cur.execute(*self.claim_statement(run_id, client_id, seq, points, component_id, digest))
            return self.claim_result(cur.fetchone())
        cur.execute(self.target, (component_id, run_id))
        target = cur.fetchone()
        if target is None or target[1] is not None or (component_id is not None and target[2] is None):
            return target, None
        cur.execute(self._claim, (run_id, client_id, seq, points, component_id, digest))
        row = cur.fetchone()
        return target, row[0] if row is not None else None

    def insert_chunks(self, cur, rows: list[tuple]) -> None:
        """Insert chunk rows (series_id, step_min, batch_id, step_max, count, steps, vals, in_level1)."""
        if not self.pg:
            self._insert_multi_row(cur, self._chunks_head, "", rows)
        elif rows:
            sid, step_min, batch_id, step_max, count, steps, vals, in_level1 = zip(*rows)
            cur.execute(self.chunks, [*(bind_column(np.array(c, dtype=np.int64))
                                        for c in (sid, step_min, batch_id, step_max, count)),
                                      ByteaArray(steps), ByteaArray(vals), bind_column(np.array(in_level1, dtype=bool))])

    def merge_rollups(self, cur, parts: list[Rollups]) -> None:
        """Merge roll-up rows into the stored ones, combined first (one row per bucket).
        PostgreSQL: one statement over arrays, sorted (lock order)."""
        rollups = combine_rollups(parts)
        if not self.pg:
            self._insert_multi_columns(cur, self._rollups_head, " " + self._rollups_merge, rollups.lists())
        elif len(rollups):
            cur.execute(self.rollups, [bind_column(c) for c in rollups.columns()])

    def merge_key_stats(self, cur, rows: list[tuple]) -> None:
        """Add per-series stats (series_id, count, first_step, last_step, last_value) to the
        stored ones, combined first (one UPDATE per series, in series order)."""
        cur.executemany(self.stats, [(n, first, first, last_step, last_value, last_step, last_step, sid)
                                     for sid, n, first, last_step, last_value in combine_key_stats(rows)])

    def advance_runs(self, cur, rows: list[tuple]) -> None:
        """Raise each run's last step to the highest of its (run_id, last_step) rows."""
        last: dict[int, int] = {}
        for run_id, step in rows:
            last[run_id] = max(step, last.get(run_id, step))
        cur.executemany(self.run, [(step, run_id, step) for run_id, step in sorted(last.items())])

    @staticmethod
    def _insert_multi_row(cur, head: str, tail: str, rows: list[tuple]) -> None:
        """SQLite: `rows` as multi-row INSERTs of up to ROWS_PER_STATEMENT rows, not one execution
        each: each execution hands the GIL over and back around SQLite's work, and beside a busy
        event loop each hand-back waits (a batch's 80 rows cost 80 waits)."""
        if rows:
            _insert_flat(cur, head, tail, len(rows[0]), [v for row in rows for v in row])

    @staticmethod
    def _insert_multi_columns(cur, head: str, tail: str, columns: list[list]) -> None:
        """`_insert_multi_row` of rows given column-wise (no tuple made per row)."""
        if columns and columns[0]:
            width = len(columns)
            flat: list = [None] * (len(columns[0]) * width)
            for j, column in enumerate(columns):
                flat[j::width] = column
            _insert_flat(cur, head, tail, width, flat)

    def lookup_keys(self, cur, run_id: int, keys: list[str]) -> dict[str, int]:
        """{key: series id} of those of `keys` the run has. PostgreSQL: one statement over an
        array; SQLite: IN lists of KEY_ROWS_PER_STATEMENT keys (both index lookups, linear)."""
        if self.pg:
            cur.execute("SELECT key, id FROM metric_keys WHERE run_id = %s AND key = ANY(%s)", (run_id, keys))
            return dict(cur.fetchall())
        out: dict[str, int] = {}
        for i in range(0, len(keys), KEY_ROWS_PER_STATEMENT):
            part = keys[i : i + KEY_ROWS_PER_STATEMENT]
            cur.execute(f"SELECT key, id FROM metric_keys WHERE run_id = ? AND key IN ({', '.join('?' * len(part))})",
                        (run_id, *part))
            out.update(cur.fetchall())
        return out

    def create_keys(self, cur, run_id: int, keys: list[str]) -> dict[str, int]:
        """{key: series id} of every one of `keys`, creating the run's missing ones: a bulk
        INSERT .. ON CONFLICT DO NOTHING RETURNING, then a lookup of the ones it did not insert
        (created meanwhile by another writer). Sorted first: two writers insert in one order."""
        keys = sorted(keys)
        if self.pg:
            cur.execute("INSERT INTO metric_keys (run_id, key, count) SELECT %s, k, 0 FROM unnest(%s::text[]) AS k "
                        "ON CONFLICT (run_id, key) DO NOTHING RETURNING key, id", (run_id, keys))
            ids = dict(cur.fetchall())
        else:
            ids = {}
            for i in range(0, len(keys), KEY_ROWS_PER_STATEMENT):
                part = keys[i : i + KEY_ROWS_PER_STATEMENT]
                cur.execute(_insert_keys_sql(len(part)), [v for k in part for v in (run_id, k)])
                ids.update(cur.fetchall())
        rest = [k for k in keys if k not in ids]
        if rest:
            ids.update(self.lookup_keys(cur, run_id, rest))
        return ids

    def count_keys(self, cur, run_id: int) -> int:
        cur.execute(f"SELECT count(*) FROM metric_keys WHERE run_id = {self.param}", (run_id,))
        return int(cur.fetchone()[0])


def chunks_where(series_id: int, a: int, b: int | None, dense_only: bool, table: str = "") -> tuple[str, dict]:
    """WHERE clause (and its parameters) of the chunks that may hold steps in [a, b); `dense_only`:
    just the chunks whose points are not in level-1 roll-ups; `table`: the chunks' alias in a join."""
    t = f"{table}." if table else ""
    window = (max(a, 0) >> CHUNK_SHIFT) << CHUNK_SHIFT
    sql = f"WHERE {t}series_id = :sid AND {t}step_min >= :w AND {t}step_max >= :a"
    params = {"sid": series_id, "w": window, "a": a}
    if b is not None:
        sql += f" AND {t}step_min < :b"
        params["b"] = b
    if dense_only:
        sql += f" AND {t}in_level1 = :in_level1"
        params["in_level1"] = False
    return sql, params


def chunk_point_count(s: Session, where: str, params: dict) -> int:
    return int(s.execute(text(f"SELECT coalesce(sum(count), 0) FROM metric_chunks {where}"), params).scalar())


def chunk_rows(s: Session, where: str, params: dict):
    """(steps, vals) blobs of the chunks, in the order their batches were written."""
    return s.execute(text(f"SELECT steps, vals FROM metric_chunks {where} ORDER BY batch_id"), params)


# Roll-up rows grouped into the read's wider buckets. Each bucket's last value is the value of
# its row with the highest last_step, picked by ROW_NUMBER (SQLite and PostgreSQL alike; a bare
# column next to several min/max aggregates would be an arbitrary row's in SQLite). Rows of one
# level cover disjoint steps, so last_step never ties between them; bucket DESC makes the order
# total anyway. Equal steps inside one roll-up row were settled at ingest: the later write wins.
ROLLUP_BUCKETS = text(
    "SELECT tb, min(mn), max(mx), max(last_step), max(CASE WHEN rn = 1 THEN last_value END), sum(n) "
    "FROM (SELECT (bucket * :bw - :o) / :w AS tb, min AS mn, max AS mx, last_step, last_value, count AS n, "
    "ROW_NUMBER() OVER (PARTITION BY (bucket * :bw - :o) / :w ORDER BY last_step DESC, bucket DESC) AS rn "
    "FROM metric_rollups WHERE series_id = :sid AND level = :lvl AND bucket >= :ba AND bucket < :bb) r "
    "GROUP BY tb"
)


def is_fk_violation(exc: Exception) -> bool:
    name = type(exc).__name__
    if name == "ForeignKeyViolation":  # psycopg
        return True
    return name == "IntegrityError" and "FOREIGN KEY" in str(exc)  # sqlite3

"""The analysts' copy of the warehouse, kept current in a private staging file.

Analysts hold sessions on the analytics snapshot for hours, and DuckDB lets
one process write a file or many read it, never both: so they never open the
pipeline's file. The snapshot is republished as a new file each time (see
`rastro_assets.analytics.publish`); what makes that cheap is this module,
which keeps a staging file equal to the analyst tables by applying only what
changed since its last refresh:

- spend and site sums: the account-days of every `meta_sync_runs` row the
  staging file has not seen finish (each sync writes only inside its range),
  plus whole accounts that were purged or re-created, and whole site links
  that came or went;
- the catalog and thumbnails: the rows that differ (thumbnails compared by
  `ad_id`, `sha256` and `fetched_at`, never by their bytes);
- the small tables and the per-account sync status: replaced whole.

Each refresh ends by comparing row counts and spend totals with the pipeline;
a difference (a writer this module does not know of) rebuilds that table
whole, so the snapshot heals itself rather than drifting. Nothing sealed is
ever copied: `meta_connections` is read only for its status columns.

This module reads a DuckDB warehouse attached beside the staging file; from a
PostgreSQL one, `rastro_assets.analytics.staging_pg` applies the same rules to
the same staging file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import duckdb
import pyarrow as pa

from rastro_assets.analytics import pg_reader
from rastro_assets.analytics.tables import (
    ANALYST_TABLES,
    COPIED_COLUMNS,
    ORDER_BY,
    PRIMARY_KEYS,
    TOTALS_COMPARED,
)
from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import register_arrow, transaction

STAGE = "rastro_stage"
"""The name the staging file is attached under, inside a pipeline connection."""

BOOKKEEPING = "publisher"
"""The staging file's own schema (its format and the syncs it has taken in); publishes drop
it from their copy, analysts never see it."""

FORMAT_VERSION = 2
"""Bumped whenever the snapshot's tables change shape: a staging file of another version
is rebuilt whole."""

_RUN_HASH = "hash(run_id, ad_account_id, finished_at, outcome)"

_FINGERPRINT = """
    SELECT md5(concat_ws('|',
        (SELECT concat_ws(',', count(*), count(finished_at), max(started_at), max(finished_at))
           FROM meta_sync_runs),
        (SELECT concat_ws(',', count(*), max(linked_at)) FROM site_ad_accounts),
        (SELECT concat_ws(',', count(*), max(created_at), max(sync_requested_at))
           FROM meta_ad_accounts),
        (SELECT concat_ws(',', count(*), max(created_at), sum(hash(site_id, name))) FROM sites),
        (SELECT concat_ws(',', count(*), max(updated_at), max(invalid_since))
           FROM meta_connections),
        (SELECT concat_ws(',', count(*), max(updated_at)) FROM ad_catalog),
        (SELECT concat_ws(',', count(*), max(fetched_at)) FROM ad_thumbnails)
    ))
"""


@dataclass(frozen=True)
class RefreshReport:
    """What one refresh of the staging file did."""

    rebuilt: tuple[str, ...]
    """Tables copied whole (all of them on a new staging file)."""
    changed_account_days: int
    rows: dict[str, int]
    fingerprint: str
    oldest_change_at: datetime | None
    """When the oldest sync this refresh took in finished: how long changes waited."""
    healed: tuple[str, ...] = field(default=())
    """Tables rebuilt because the delta left them different from the pipeline."""


def fingerprint(con: duckdb.DuckDBPyConnection) -> str:
    """A cheap digest of the pipeline's state; it changes whenever anything analysts see may
    have changed (a sync started or ended, a link, a catalog or token change)."""
    if dialect.is_postgres(con):
        return con.execute(pg_reader.FINGERPRINT).fetchone()[0]
    return con.execute(_FINGERPRINT).fetchone()[0]


def refresh(
    con: duckdb.DuckDBPyConnection,
    status: pa.Table,
    published_at: datetime,
) -> RefreshReport:
    """Bring the staging file attached as `STAGE` on `con` up to the pipeline's state.

    One transaction: a refresh that dies leaves the staging file as it was.
    `status` is the `account_sync_status` table (`STATUS_SCHEMA`).
    """
    with transaction(con):
        fresh = _stage_version(con) != FORMAT_VERSION or stage_engine(con) != dialect.DUCKDB
        if fresh:
            _create_stage(con)
        report = _apply(con, status, published_at, rebuild_all=fresh)
    return report


def _stage_version(con: duckdb.DuckDBPyConnection) -> int | None:
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name ="
        " 'publisher' AND table_name = 'format'",
        [STAGE],
    ).fetchone()[0]
    if not exists:
        return None
    row = con.execute(f"SELECT max(version) FROM {STAGE}.publisher.format").fetchone()
    return row[0] if row else None


def stage_engine(con: duckdb.DuckDBPyConnection) -> str:
    """The warehouse engine the staging file was filled from: its run bookkeeping means
    nothing to the other engine. Files made before PostgreSQL existed name none: DuckDB."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name ="
        " 'publisher' AND table_name = 'source'",
        [STAGE],
    ).fetchone()[0]
    if not exists:
        return dialect.DUCKDB
    return con.execute(f"SELECT max(engine) FROM {STAGE}.publisher.source").fetchone()[0]


def _create_stage(con: duckdb.DuckDBPyConnection) -> None:
    for table in ANALYST_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {STAGE}.main.{table}")
    con.execute(f"DROP SCHEMA IF EXISTS {STAGE}.publisher CASCADE")
    con.execute(f"CREATE SCHEMA {STAGE}.publisher")
    con.execute(f"CREATE TABLE {STAGE}.publisher.format (version INTEGER)")
    con.execute(f"INSERT INTO {STAGE}.publisher.format VALUES (?)", [FORMAT_VERSION])
    # One hash per finished sync whose writes the staging file holds.
    con.execute(f"CREATE TABLE {STAGE}.publisher.applied_runs (h UBIGINT)")
    # The copied tables themselves are built whole by the first `_apply` (`_rebuild`).
    con.execute(
        f"CREATE TABLE {STAGE}.main.snapshot_info"
        " (published_at TIMESTAMPTZ, format_version INTEGER, note VARCHAR)"
    )


def _apply(
    con: duckdb.DuckDBPyConnection,
    status: pa.Table,
    published_at: datetime,
    *,
    rebuild_all: bool,
) -> RefreshReport:
    digest = fingerprint(con)
    oldest = _collect_new_runs(con)
    if rebuild_all:
        for table in COPIED_COLUMNS:
            _rebuild(con, table)
        rebuilt, changed_days = list(COPIED_COLUMNS), 0
    else:
        rebuilt, changed_days = [], _apply_changes(con)
    _record_applied_runs(con)
    _replace_status(con, status)
    _replace_info(con, published_at)
    healed = [] if rebuild_all else _heal(con)
    return RefreshReport(
        rebuilt=tuple(rebuilt) + tuple(healed),
        changed_account_days=changed_days,
        rows=_row_counts(con),
        fingerprint=digest,
        oldest_change_at=oldest,
        healed=tuple(healed),
    )


def _collect_new_runs(
    con: duckdb.DuckDBPyConnection, runs: str = "main.meta_sync_runs"
) -> datetime | None:
    """Gather the sync runs of `runs` whose writes the staging file does not hold yet
    (`snapshot_new_runs`); returns when the oldest of them finished."""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_new_runs AS
            SELECT r.run_id, r.ad_account_id, r.since, r.until, r.finished_at, r.h
            FROM (SELECT run_id, ad_account_id, since, until, finished_at, {_RUN_HASH} AS h
                  FROM {runs}) r
            ANTI JOIN {STAGE}.publisher.applied_runs a
              ON a.h = r.h AND r.finished_at IS NOT NULL"""
    )
    return con.execute("SELECT min(finished_at) FROM snapshot_new_runs").fetchone()[0]


def _apply_changes(con: duckdb.DuckDBPyConnection) -> int:
    """Apply what changed since the last refresh; returns the account-days replaced."""
    changed_days = _apply_spend(con)
    _apply_rows_that_differ(con, "ad_catalog")
    _apply_thumbnails(con)
    for table in ("sites", "site_ad_accounts", "meta_ad_accounts"):
        _replace(con, table)
    return changed_days


def _record_applied_runs(con: duckdb.DuckDBPyConnection) -> None:
    s = STAGE
    con.execute(
        f"INSERT INTO {s}.publisher.applied_runs"
        " SELECT h FROM snapshot_new_runs WHERE finished_at IS NOT NULL"
    )
    applied, finished = con.execute(
        f"SELECT (SELECT count(*) FROM {s}.publisher.applied_runs),"
        " (SELECT count(finished_at) FROM main.meta_sync_runs)"
    ).fetchone()
    if applied != finished:  # runs pruned, or changed after they finished: start again
        con.execute(f"DELETE FROM {s}.publisher.applied_runs")
        con.execute(
            f"INSERT INTO {s}.publisher.applied_runs SELECT DISTINCT {_RUN_HASH}"
            " FROM main.meta_sync_runs WHERE finished_at IS NOT NULL"
        )


def _replace_status(con: duckdb.DuckDBPyConnection, status: pa.Table) -> None:
    register_arrow(con, "snapshot_status_rows", status)
    try:
        con.execute(f"DROP TABLE IF EXISTS {STAGE}.main.account_sync_status")
        con.execute(
            f"CREATE TABLE {STAGE}.main.account_sync_status AS"
            " SELECT * FROM snapshot_status_rows ORDER BY ad_account_id"
        )
    finally:
        con.unregister("snapshot_status_rows")


def _replace_info(con: duckdb.DuckDBPyConnection, published_at: datetime) -> None:
    con.execute(f"DELETE FROM {STAGE}.main.snapshot_info")
    con.execute(
        f"INSERT INTO {STAGE}.main.snapshot_info VALUES (?, ?, ?)",
        [
            published_at,
            FORMAT_VERSION,
            "A read-only copy of the rastro warehouse, replaced whole at each publish.",
        ],
    )


def _row_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return {
        table: con.execute(f"SELECT count(*) FROM {STAGE}.main.{table}").fetchone()[0]
        for table in ANALYST_TABLES
    }


def _rebuild(con: duckdb.DuckDBPyConnection, table: str) -> None:
    con.execute(f"DROP TABLE IF EXISTS {STAGE}.main.{table}")
    con.execute(
        f"CREATE TABLE {STAGE}.main.{table} AS"
        f" SELECT {COPIED_COLUMNS[table]} FROM main.{table}{ORDER_BY.get(table, '')}"
    )


def _replace(con: duckdb.DuckDBPyConnection, table: str) -> None:
    con.execute(f"DELETE FROM {STAGE}.main.{table}")
    con.execute(
        f"INSERT INTO {STAGE}.main.{table}"
        f" SELECT {COPIED_COLUMNS[table]} FROM main.{table}{ORDER_BY.get(table, '')}"
    )


def _apply_spend(con: duckdb.DuckDBPyConnection) -> int:
    """Replace the account-days that syncs may have changed, and drop what left the pipeline.

    Returns how many account-days were replaced.
    """
    _drop_gone_accounts(con)
    changed_days = _replace_changed_days(con)
    _replace_changed_links(con)
    return changed_days


def _drop_gone_accounts(con: duckdb.DuckDBPyConnection) -> None:
    """An account purged (its last link went), or purged and linked again: its rows go whole
    (`snapshot_gone_accounts` names them)."""
    s = STAGE
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_gone_accounts AS
            SELECT ad_account_id, created_at FROM {s}.main.meta_ad_accounts
            EXCEPT SELECT ad_account_id, created_at FROM main.meta_ad_accounts"""
    )
    for table in ("ad_spend_daily", "site_spend_daily"):
        con.execute(
            f"DELETE FROM {s}.main.{table} WHERE ad_account_id IN"
            " (SELECT ad_account_id FROM snapshot_gone_accounts)"
        )


def _replace_changed_days(con: duckdb.DuckDBPyConnection) -> int:
    """The account-days of the new runs, and every day of a re-created account (its history
    is all new), copied again in both spend tables; returns how many account-days."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE snapshot_changed_days AS
           SELECT DISTINCT ad_account_id, unnest(generate_series(since, until,
                  INTERVAL 1 DAY))::DATE AS day
           FROM snapshot_new_runs WHERE since IS NOT NULL AND until IS NOT NULL AND since <= until
           UNION
           SELECT DISTINCT ad_account_id, day FROM main.ad_spend_daily
           WHERE ad_account_id IN (SELECT ad_account_id FROM snapshot_gone_accounts)"""
    )
    low, high, count = con.execute(
        "SELECT min(day), max(day), count(*) FROM snapshot_changed_days"
    ).fetchone()
    if not count:
        return count
    for table in ("ad_spend_daily", "site_spend_daily"):
        # The day range lets the delete and the copy skip every row group outside it.
        con.execute(
            f"""DELETE FROM {STAGE}.main.{table} t USING snapshot_changed_days c
                WHERE t.day BETWEEN ? AND ?
                  AND t.ad_account_id = c.ad_account_id AND t.day = c.day""",
            [low, high],
        )
        con.execute(
            f"""INSERT INTO {STAGE}.main.{table}
                SELECT {_qualified(COPIED_COLUMNS[table], "t")}
                FROM main.{table} t JOIN snapshot_changed_days c
                  ON t.ad_account_id = c.ad_account_id AND t.day = c.day
                WHERE t.day BETWEEN ? AND ?
                ORDER BY t.day""",
            [low, high],
        )
    return count


def _replace_changed_links(con: duckdb.DuckDBPyConnection) -> None:
    """A site linked or unlinked: that site's sums for the account, whole."""
    s = STAGE
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_changed_links AS
            (SELECT site_id, ad_account_id FROM {s}.main.site_ad_accounts
             EXCEPT SELECT site_id, ad_account_id FROM main.site_ad_accounts)
            UNION
            (SELECT site_id, ad_account_id FROM main.site_ad_accounts
             EXCEPT SELECT site_id, ad_account_id FROM {s}.main.site_ad_accounts)"""
    )
    if not con.execute("SELECT count(*) FROM snapshot_changed_links").fetchone()[0]:
        return
    con.execute(
        f"""DELETE FROM {s}.main.site_spend_daily t USING snapshot_changed_links l
            WHERE t.site_id = l.site_id AND t.ad_account_id = l.ad_account_id"""
    )
    con.execute(
        f"""INSERT INTO {s}.main.site_spend_daily
            SELECT {_qualified(COPIED_COLUMNS["site_spend_daily"], "t")}
            FROM main.site_spend_daily t JOIN snapshot_changed_links l
              ON t.site_id = l.site_id AND t.ad_account_id = l.ad_account_id
            ORDER BY t.day"""
    )


def _qualified(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


def _apply_rows_that_differ(con: duckdb.DuckDBPyConnection, table: str) -> None:
    s, key, columns = STAGE, PRIMARY_KEYS[table], COPIED_COLUMNS[table]
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_changed_keys AS
            SELECT {key} FROM (SELECT {columns} FROM main.{table}
                               EXCEPT SELECT {columns} FROM {s}.main.{table})
            UNION
            SELECT {key} FROM (SELECT {columns} FROM {s}.main.{table}
                               EXCEPT SELECT {columns} FROM main.{table})"""
    )
    _replace_keys(con, table, key, columns)


def _apply_thumbnails(con: duckdb.DuckDBPyConnection) -> None:
    # Images are compared by their hash and fetch time: reading every blob twice would cost
    # more than copying the file.
    s, compared = STAGE, "ad_id, sha256, content_type, fetched_at"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_changed_keys AS
            SELECT ad_id FROM (SELECT {compared} FROM main.ad_thumbnails
                               EXCEPT SELECT {compared} FROM {s}.main.ad_thumbnails)
            UNION
            SELECT ad_id FROM (SELECT {compared} FROM {s}.main.ad_thumbnails
                               EXCEPT SELECT {compared} FROM main.ad_thumbnails)"""
    )
    _replace_keys(con, "ad_thumbnails", "ad_id", COPIED_COLUMNS["ad_thumbnails"])


def _replace_keys(con: duckdb.DuckDBPyConnection, table: str, key: str, columns: str) -> None:
    if not con.execute("SELECT count(*) FROM snapshot_changed_keys").fetchone()[0]:
        return
    s = STAGE
    con.execute(
        f"DELETE FROM {s}.main.{table} WHERE ({key}) IN (SELECT ({key}) FROM snapshot_changed_keys)"
    )
    con.execute(
        f"""INSERT INTO {s}.main.{table} SELECT {columns} FROM main.{table}
            WHERE ({key}) IN (SELECT ({key}) FROM snapshot_changed_keys)"""
    )


def _heal(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Repair any table whose counts or totals differ from the pipeline's.

    Spend tables are repaired account by account (the accounts whose totals
    differ); the others, small or compared row by row already, are copied whole.
    """
    healed = []
    for table, totals in TOTALS_COMPARED.items():
        ours = con.execute(f"SELECT {totals} FROM {STAGE}.main.{table}").fetchone()
        theirs = con.execute(f"SELECT {totals} FROM main.{table}").fetchone()
        if ours == theirs:
            continue
        if table in ("ad_spend_daily", "site_spend_daily"):
            _heal_accounts(con, table, totals)
        else:
            _rebuild(con, table)
        healed.append(table)
    return healed


def _heal_accounts(con: duckdb.DuckDBPyConnection, table: str, totals: str) -> None:
    s = STAGE
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_changed_keys AS
            SELECT ad_account_id FROM (
                SELECT ad_account_id, {totals} FROM main.{table} GROUP BY ad_account_id
                EXCEPT
                SELECT ad_account_id, {totals} FROM {s}.main.{table} GROUP BY ad_account_id)
            UNION
            SELECT ad_account_id FROM (
                SELECT ad_account_id, {totals} FROM {s}.main.{table} GROUP BY ad_account_id
                EXCEPT
                SELECT ad_account_id, {totals} FROM main.{table} GROUP BY ad_account_id)"""
    )
    _replace_keys(con, table, "ad_account_id", COPIED_COLUMNS[table])

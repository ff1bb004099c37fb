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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import duckdb
import pyarrow as pa

from rastro_assets.warehouse.connection import register_arrow, transaction

STAGE = "rastro_stage"
"""The name the staging file is attached under, inside a pipeline connection."""

BOOKKEEPING = "publisher"
"""The staging file's own schema (its format and the syncs it has taken in); publishes drop
it from their copy, analysts never see it."""

FORMAT_VERSION = 2
"""Bumped whenever the snapshot's tables change shape: a staging file of another version
is rebuilt whole."""

STATUS_SCHEMA = pa.schema(
    [
        ("ad_account_id", pa.string()),
        ("sites", pa.list_(pa.string())),
        ("state", pa.string()),
        ("last_sync_at", pa.timestamp("us", tz="UTC")),
        ("next_sync_at", pa.timestamp("us", tz="UTC")),
        ("backfill_done_days", pa.int64()),
        ("backfill_total_days", pa.int64()),
        ("last_error", pa.string()),
        ("local_today", pa.date32()),
        ("today_synced_at", pa.timestamp("us", tz="UTC")),
    ]
)
"""`account_sync_status`: the planner's view of each linked account when the snapshot
was published (see `rastro_assets.analytics.status`)."""

# Columns copied, per table. Every contract column, and nothing sealed.
_COPIED: dict[str, str] = {
    "sites": "site_id, name, created_at",
    "site_ad_accounts": "site_id, ad_account_id, linked_at",
    "meta_ad_accounts": "ad_account_id, connection_id, timezone, currency, name, created_at",
    "ad_spend_daily": (
        "ad_account_id, ad_id, day, spend, impressions, clicks, conversations, synced_at"
    ),
    "site_spend_daily": "site_id, ad_account_id, day, spend, impressions, clicks, conversations",
    "ad_catalog": (
        "ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name,"
        " ad_status, creative_type, creative_id, updated_at"
    ),
    "ad_thumbnails": "ad_id, content_type, image, sha256, fetched_at",
}
ANALYST_TABLES: tuple[str, ...] = (*_COPIED, "account_sync_status", "snapshot_info")

# Day-ordered spend lets a refresh's deletes skip every row group outside the days synced.
_ORDER = {
    "ad_spend_daily": " ORDER BY day, ad_account_id, ad_id",
    "site_spend_daily": " ORDER BY day, site_id, ad_account_id",
    "ad_catalog": " ORDER BY ad_account_id, ad_id",
}

_RUN_HASH = "hash(run_id, ad_account_id, finished_at, outcome)"

_PRIMARY_KEYS = {
    "sites": "site_id",
    "site_ad_accounts": "site_id, ad_account_id",
    "meta_ad_accounts": "ad_account_id",
    "ad_catalog": "ad_id",
    "ad_thumbnails": "ad_id",
}

_FINGERPRINT = """
    SELECT md5(concat_ws('|',
        (SELECT concat_ws(',', count(*), count(finished_at), max(started_at), max(finished_at))
           FROM meta_sync_runs),
        (SELECT concat_ws(',', count(*), max(linked_at)) FROM site_ad_accounts),
        (SELECT concat_ws(',', count(*), max(created_at), max(sync_requested_at))
           FROM meta_ad_accounts),
        (SELECT concat_ws(',', count(*), max(created_at)) FROM sites),
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
        fresh = _stage_version(con) != FORMAT_VERSION
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
    s = STAGE
    digest = fingerprint(con)
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_new_runs AS
            SELECT r.run_id, r.ad_account_id, r.since, r.until, r.finished_at, r.h
            FROM (SELECT run_id, ad_account_id, since, until, finished_at, {_RUN_HASH} AS h
                  FROM main.meta_sync_runs) r
            ANTI JOIN {s}.publisher.applied_runs a
              ON a.h = r.h AND r.finished_at IS NOT NULL"""
    )
    oldest = con.execute("SELECT min(finished_at) FROM snapshot_new_runs").fetchone()[0]
    rebuilt: list[str] = []
    changed_days = 0
    if rebuild_all:
        for table in _COPIED:
            _rebuild(con, table)
            rebuilt.append(table)
    else:
        changed_days = _apply_spend(con)
        _apply_rows_that_differ(con, "ad_catalog")
        _apply_thumbnails(con)
        for table in ("sites", "site_ad_accounts", "meta_ad_accounts"):
            _replace(con, table)
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
    register_arrow(con, "snapshot_status_rows", status)
    try:
        con.execute(f"DROP TABLE IF EXISTS {s}.main.account_sync_status")
        con.execute(
            f"CREATE TABLE {s}.main.account_sync_status AS"
            " SELECT * FROM snapshot_status_rows ORDER BY ad_account_id"
        )
    finally:
        con.unregister("snapshot_status_rows")
    con.execute(f"DELETE FROM {s}.main.snapshot_info")
    con.execute(
        f"INSERT INTO {s}.main.snapshot_info VALUES (?, ?, ?)",
        [
            published_at,
            FORMAT_VERSION,
            "A read-only copy of the rastro warehouse, replaced whole at each publish.",
        ],
    )
    healed = [] if rebuild_all else _heal(con)
    rows = {
        table: con.execute(f"SELECT count(*) FROM {s}.main.{table}").fetchone()[0]
        for table in ANALYST_TABLES
    }
    return RefreshReport(
        rebuilt=tuple(rebuilt) + tuple(healed),
        changed_account_days=changed_days,
        rows=rows,
        fingerprint=digest,
        oldest_change_at=oldest,
        healed=tuple(healed),
    )


def _rebuild(con: duckdb.DuckDBPyConnection, table: str) -> None:
    con.execute(f"DROP TABLE IF EXISTS {STAGE}.main.{table}")
    con.execute(
        f"CREATE TABLE {STAGE}.main.{table} AS"
        f" SELECT {_COPIED[table]} FROM main.{table}{_ORDER.get(table, '')}"
    )


def _replace(con: duckdb.DuckDBPyConnection, table: str) -> None:
    con.execute(f"DELETE FROM {STAGE}.main.{table}")
    con.execute(
        f"INSERT INTO {STAGE}.main.{table}"
        f" SELECT {_COPIED[table]} FROM main.{table}{_ORDER.get(table, '')}"
    )


def _apply_spend(con: duckdb.DuckDBPyConnection) -> int:
    """Replace the account-days that syncs may have changed, and drop what left the pipeline.

    Returns how many account-days were replaced.
    """
    s = STAGE
    # An account purged (its last link went) or purged and linked again: its rows go whole.
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_gone_accounts AS
            SELECT ad_account_id, created_at FROM {s}.main.meta_ad_accounts
            EXCEPT SELECT ad_account_id, created_at FROM main.meta_ad_accounts"""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_changed_links AS
            (SELECT site_id, ad_account_id FROM {s}.main.site_ad_accounts
             EXCEPT SELECT site_id, ad_account_id FROM main.site_ad_accounts)
            UNION
            (SELECT site_id, ad_account_id FROM main.site_ad_accounts
             EXCEPT SELECT site_id, ad_account_id FROM {s}.main.site_ad_accounts)"""
    )
    for table in ("ad_spend_daily", "site_spend_daily"):
        con.execute(
            f"DELETE FROM {s}.main.{table} WHERE ad_account_id IN"
            " (SELECT ad_account_id FROM snapshot_gone_accounts)"
        )
    # A re-created account's history is all new: every day it has counts as changed.
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
    if count:
        for table, columns in (
            ("ad_spend_daily", _COPIED["ad_spend_daily"]),
            ("site_spend_daily", _COPIED["site_spend_daily"]),
        ):
            con.execute(
                f"""DELETE FROM {s}.main.{table} t USING snapshot_changed_days c
                    WHERE t.day BETWEEN ? AND ?
                      AND t.ad_account_id = c.ad_account_id AND t.day = c.day""",
                [low, high],
            )
            con.execute(
                f"""INSERT INTO {s}.main.{table}
                    SELECT {", ".join("t." + c.strip() for c in columns.split(","))}
                    FROM main.{table} t JOIN snapshot_changed_days c
                      ON t.ad_account_id = c.ad_account_id AND t.day = c.day
                    WHERE t.day BETWEEN ? AND ?
                    ORDER BY t.day""",
                [low, high],
            )
    # A site linked or unlinked: that site's sums for the account, whole.
    if con.execute("SELECT count(*) FROM snapshot_changed_links").fetchone()[0]:
        con.execute(
            f"""DELETE FROM {s}.main.site_spend_daily t USING snapshot_changed_links l
                WHERE t.site_id = l.site_id AND t.ad_account_id = l.ad_account_id"""
        )
        con.execute(
            f"""INSERT INTO {s}.main.site_spend_daily
                SELECT t.site_id, t.ad_account_id, t.day, t.spend, t.impressions, t.clicks,
                       t.conversations
                FROM main.site_spend_daily t JOIN snapshot_changed_links l
                  ON t.site_id = l.site_id AND t.ad_account_id = l.ad_account_id
                ORDER BY t.day"""
        )
    return count


def _apply_rows_that_differ(con: duckdb.DuckDBPyConnection, table: str) -> None:
    s, key, columns = STAGE, _PRIMARY_KEYS[table], _COPIED[table]
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
    _replace_keys(con, "ad_thumbnails", "ad_id", _COPIED["ad_thumbnails"])


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


_CHECKS: dict[str, str] = {
    "ad_spend_daily": "count(*), sum(spend), sum(impressions), sum(clicks), sum(conversations)",
    "site_spend_daily": "count(*), sum(spend), sum(impressions), sum(clicks), sum(conversations)",
    "ad_catalog": "count(*)",
    "ad_thumbnails": "count(*)",
    "sites": "count(*)",
    "site_ad_accounts": "count(*)",
    "meta_ad_accounts": "count(*)",
}


def _heal(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Repair any table whose counts or totals differ from the pipeline's.

    Spend tables are repaired account by account (the accounts whose totals
    differ); the others, small or compared row by row already, are copied whole.
    """
    healed = []
    for table, totals in _CHECKS.items():
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
    _replace_keys(con, table, "ad_account_id", _COPIED[table])

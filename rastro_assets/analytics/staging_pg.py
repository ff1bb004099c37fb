"""The staging file kept current from a PostgreSQL warehouse, by the same rules as from DuckDB.

`staging.refresh` reads the pipeline's DuckDB file in the same connection as the staging
file. A PostgreSQL warehouse cannot be attached, so here the staging file is the only
database DuckDB opens, and what changed comes over as Arrow tables
(`rastro_assets.analytics.pg_reader`), read in one consistent snapshot of the warehouse:

- spend and site sums: the account-days of the `meta_sync_runs` rows the staging file has
  not seen finish, accounts purged or re-created (whole), site links that came or went;
- the catalog whole and the thumbnails' hashes and fetch times, compared here; only the
  images that differ are read;
- the small tables and the per-account sync status: replaced whole;
- the same self-check of counts and spend totals, which repairs a table (spend: the
  accounts whose totals differ) rather than let it drift.

Only the runs that finished recently are read (`RUN_MARGIN` before the newest finish the
staging file has seen, and every run still going): the runs table keeps weeks of history,
and reading it whole at every publish would cost more than the changes themselves.

A new staging file, one of another format or one filled from the DuckDB engine is rebuilt
whole, each table streamed in batches.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pyarrow as pa

from rastro_assets.analytics import staging
from rastro_assets.analytics.pg_reader import PostgresReader, comparable
from rastro_assets.analytics.staging import STAGE, RefreshReport
from rastro_assets.analytics.tables import COPIED_COLUMNS, ORDER_BY, PRIMARY_KEYS, TOTALS_COMPARED
from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import register_arrow, transaction

RUN_MARGIN = timedelta(hours=6)
"""How long after a run's `finished_at` its commit may still land and be picked up; also
covers clocks of different hosts that disagree by less than this."""

_SMALL_TABLES = ("sites", "site_ad_accounts", "meta_ad_accounts")
_SPEND_TABLES = ("ad_spend_daily", "site_spend_daily")


def refresh(
    con: duckdb.DuckDBPyConnection,
    source: PostgresReader,
    status: pa.Table,
    published_at: datetime,
) -> RefreshReport:
    """Bring the staging file attached as `STAGE` on `con` up to the warehouse `source`
    reads. One transaction on the staging file: a refresh that dies leaves it as it was."""
    with transaction(con):
        fresh = (
            staging._stage_version(con) != staging.FORMAT_VERSION
            or staging.stage_engine(con) != dialect.POSTGRES
        )
        if fresh:
            staging._create_stage(con)
            con.execute(
                f"CREATE TABLE {STAGE}.publisher.source"
                " (engine VARCHAR, runs_watermark TIMESTAMPTZ)"
            )
            con.execute(
                f"INSERT INTO {STAGE}.publisher.source VALUES (?, NULL)", [dialect.POSTGRES]
            )
        return _apply(con, source, status, published_at, rebuild_all=fresh)


def _apply(
    con: duckdb.DuckDBPyConnection,
    source: PostgresReader,
    status: pa.Table,
    published_at: datetime,
    *,
    rebuild_all: bool,
) -> RefreshReport:
    digest = source.fingerprint()
    oldest = _collect_new_runs(con, source, rebuild_all=rebuild_all)
    if rebuild_all:
        for table in COPIED_COLUMNS:
            _rebuild(con, source, table)
        rebuilt, changed_days = list(COPIED_COLUMNS), 0
    else:
        rebuilt, changed_days = [], _apply_changes(con, source)
    _record_applied_runs(con)
    staging._replace_status(con, status)
    staging._replace_info(con, published_at)
    healed = [] if rebuild_all else _heal(con, source)
    return RefreshReport(
        rebuilt=tuple(rebuilt) + tuple(healed),
        changed_account_days=changed_days,
        rows=staging._row_counts(con),
        fingerprint=digest,
        oldest_change_at=oldest,
        healed=tuple(healed),
    )


def _collect_new_runs(
    con: duckdb.DuckDBPyConnection, source: PostgresReader, *, rebuild_all: bool
) -> datetime | None:
    """`snapshot_new_runs`, as `staging._collect_new_runs` makes it, from the recent runs;
    `snapshot_recent_runs` keeps what was read for the bookkeeping."""
    if rebuild_all:
        watermark = source.latest_finish()
    else:
        watermark = con.execute(
            f"SELECT max(runs_watermark) FROM {STAGE}.publisher.source"
        ).fetchone()[0]
    runs = source.runs(None if watermark is None else watermark - RUN_MARGIN)
    register_arrow(con, "snapshot_run_rows", runs)
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE snapshot_recent_runs AS SELECT * FROM snapshot_run_rows"
        )
    finally:
        con.unregister("snapshot_run_rows")
    return staging._collect_new_runs(con, runs="snapshot_recent_runs")


def _record_applied_runs(con: duckdb.DuckDBPyConnection) -> None:
    """The finished runs read this time are the ones the next refresh compares with: older
    ones fall out of its window and need no memory."""
    s = STAGE
    con.execute(f"DELETE FROM {s}.publisher.applied_runs")
    con.execute(
        f"INSERT INTO {s}.publisher.applied_runs SELECT DISTINCT {staging._RUN_HASH}"
        " FROM snapshot_recent_runs WHERE finished_at IS NOT NULL"
    )
    # greatest() passes over a null: the first finish seen sets it, none keeps it.
    con.execute(
        f"""UPDATE {s}.publisher.source SET runs_watermark = greatest(runs_watermark,
                (SELECT max(finished_at) FROM snapshot_recent_runs))"""
    )


def _apply_changes(con: duckdb.DuckDBPyConnection, source: PostgresReader) -> int:
    """Apply what changed since the last refresh; returns the account-days replaced."""
    for table in _SMALL_TABLES:
        _hold(con, f"snapshot_pg_{table}", source.whole(table))
    changed_days = _apply_spend(con, source)
    _apply_catalog(con, source)
    _apply_thumbnails(con, source)
    for table in _SMALL_TABLES:
        con.execute(f"DELETE FROM {STAGE}.main.{table}")
        con.execute(
            f"INSERT INTO {STAGE}.main.{table} SELECT {COPIED_COLUMNS[table]}"
            f" FROM snapshot_pg_{table}{ORDER_BY.get(table, '')}"
        )
    return changed_days


def _apply_spend(con: duckdb.DuckDBPyConnection, source: PostgresReader) -> int:
    gone = _drop_gone_accounts(con)
    changed_days = _replace_changed_days(con, source, gone)
    _replace_changed_links(con, source)
    return changed_days


def _drop_gone_accounts(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Accounts purged, or purged and linked again: their staged rows go whole; returns
    them."""
    gone = [
        account
        for (account,) in con.execute(
            f"""SELECT ad_account_id FROM (
                    SELECT ad_account_id, created_at FROM {STAGE}.main.meta_ad_accounts
                    EXCEPT SELECT ad_account_id, created_at FROM snapshot_pg_meta_ad_accounts)
                ORDER BY 1"""
        ).fetchall()
    ]
    if gone:
        for table in _SPEND_TABLES:
            con.execute(
                f"DELETE FROM {STAGE}.main.{table} WHERE ad_account_id = ANY(?::VARCHAR[])",
                [gone],
            )
    return gone


def _replace_changed_days(
    con: duckdb.DuckDBPyConnection, source: PostgresReader, gone: list[str]
) -> int:
    """The account-days of the new runs, and every day of a re-created account, copied
    again in both spend tables; returns how many account-days."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE snapshot_changed_days AS
           SELECT DISTINCT ad_account_id, unnest(generate_series(since, until,
                  INTERVAL 1 DAY))::DATE AS day
           FROM snapshot_new_runs
           WHERE since IS NOT NULL AND until IS NOT NULL AND since <= until"""
    )
    pairs = con.execute("SELECT ad_account_id, day FROM snapshot_changed_days").fetchall()
    if not pairs and not gone:
        return 0
    for table in _SPEND_TABLES:
        parts = []
        if pairs:
            accounts, days = zip(*pairs, strict=True)
            parts.append(source.spend_of_days(table, accounts, days, leaving_out=gone))
        if gone:
            parts.append(source.rows_of_keys(table, "ad_account_id", gone))
        _hold(con, f"snapshot_pg_{table}", pa.concat_tables(parts))
    con.execute(
        """INSERT INTO snapshot_changed_days
           SELECT DISTINCT ad_account_id, day FROM snapshot_pg_ad_spend_daily
           WHERE ad_account_id = ANY(?::VARCHAR[])
           EXCEPT SELECT ad_account_id, day FROM snapshot_changed_days""",
        [gone],
    )
    low, high, count = con.execute(
        "SELECT min(day), max(day), count(*) FROM snapshot_changed_days"
    ).fetchone()
    if not count:
        return 0
    for table in _SPEND_TABLES:
        # The day range lets the delete skip every row group outside it.
        con.execute(
            f"""DELETE FROM {STAGE}.main.{table} t USING snapshot_changed_days c
                WHERE t.day BETWEEN ? AND ?
                  AND t.ad_account_id = c.ad_account_id AND t.day = c.day""",
            [low, high],
        )
        con.execute(
            f"INSERT INTO {STAGE}.main.{table} SELECT {COPIED_COLUMNS[table]}"
            f" FROM snapshot_pg_{table} ORDER BY day"
        )
    return count


def _replace_changed_links(con: duckdb.DuckDBPyConnection, source: PostgresReader) -> None:
    """A site linked or unlinked: that site's sums for the account, whole."""
    s = STAGE
    links = con.execute(
        f"""(SELECT site_id, ad_account_id FROM {s}.main.site_ad_accounts
             EXCEPT SELECT site_id, ad_account_id FROM snapshot_pg_site_ad_accounts)
            UNION
            (SELECT site_id, ad_account_id FROM snapshot_pg_site_ad_accounts
             EXCEPT SELECT site_id, ad_account_id FROM {s}.main.site_ad_accounts)"""
    ).fetchall()
    if not links:
        return
    sites, accounts = zip(*links, strict=True)
    _hold(con, "snapshot_changed_links", pa.table({"site_id": sites, "ad_account_id": accounts}))
    con.execute(
        f"""DELETE FROM {s}.main.site_spend_daily t USING snapshot_changed_links l
            WHERE t.site_id = l.site_id AND t.ad_account_id = l.ad_account_id"""
    )
    _hold(con, "snapshot_pg_link_days", source.site_spend_of_links(sites, accounts))
    con.execute(
        f"INSERT INTO {s}.main.site_spend_daily"
        f" SELECT {COPIED_COLUMNS['site_spend_daily']} FROM snapshot_pg_link_days ORDER BY day"
    )


def _apply_catalog(con: duckdb.DuckDBPyConnection, source: PostgresReader) -> None:
    s, key, columns = STAGE, PRIMARY_KEYS["ad_catalog"], COPIED_COLUMNS["ad_catalog"]
    _hold(con, "snapshot_pg_ad_catalog", source.whole("ad_catalog"))
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE snapshot_changed_keys AS
            SELECT {key} FROM (SELECT {columns} FROM snapshot_pg_ad_catalog
                               EXCEPT SELECT {columns} FROM {s}.main.ad_catalog)
            UNION
            SELECT {key} FROM (SELECT {columns} FROM {s}.main.ad_catalog
                               EXCEPT SELECT {columns} FROM snapshot_pg_ad_catalog)"""
    )
    if not con.execute("SELECT count(*) FROM snapshot_changed_keys").fetchone()[0]:
        return
    con.execute(
        f"DELETE FROM {s}.main.ad_catalog WHERE {key} IN (SELECT {key} FROM snapshot_changed_keys)"
    )
    con.execute(
        f"""INSERT INTO {s}.main.ad_catalog SELECT {columns} FROM snapshot_pg_ad_catalog
            WHERE {key} IN (SELECT {key} FROM snapshot_changed_keys)"""
    )


def _apply_thumbnails(con: duckdb.DuckDBPyConnection, source: PostgresReader) -> None:
    # Images are compared by their hash and fetch time: only the ones that differ are read.
    s, compared = STAGE, "ad_id, sha256, content_type, fetched_at"
    _hold(con, "snapshot_pg_thumbnail_versions", source.thumbnail_versions())
    changed = [
        ad_id
        for (ad_id,) in con.execute(
            f"""SELECT ad_id FROM (SELECT {compared} FROM snapshot_pg_thumbnail_versions
                                   EXCEPT SELECT {compared} FROM {s}.main.ad_thumbnails)
                UNION
                SELECT ad_id FROM (SELECT {compared} FROM {s}.main.ad_thumbnails
                                   EXCEPT SELECT {compared} FROM snapshot_pg_thumbnail_versions)
                ORDER BY 1"""
        ).fetchall()
    ]
    if not changed:
        return
    _replace_rows_of(con, source, "ad_thumbnails", "ad_id", changed)


def _replace_rows_of(
    con: duckdb.DuckDBPyConnection,
    source: PostgresReader,
    table: str,
    key: str,
    values: list[str],
) -> None:
    """The staged rows of `table` whose `key` is one of `values`, read again."""
    con.execute(f"DELETE FROM {STAGE}.main.{table} WHERE {key} = ANY(?::VARCHAR[])", [values])
    _hold(con, "snapshot_pg_rows", source.rows_of_keys(table, key, values))
    con.execute(
        f"INSERT INTO {STAGE}.main.{table} SELECT {COPIED_COLUMNS[table]}"
        f" FROM snapshot_pg_rows{ORDER_BY.get(table, '')}"
    )


def _rebuild(con: duckdb.DuckDBPyConnection, source: PostgresReader, table: str) -> None:
    con.execute(f"DROP TABLE IF EXISTS {STAGE}.main.{table}")
    register_arrow(con, "snapshot_pg_stream", source.stream(table))
    try:
        con.execute(
            f"CREATE TABLE {STAGE}.main.{table} AS SELECT {COPIED_COLUMNS[table]}"
            f" FROM snapshot_pg_stream{ORDER_BY.get(table, '')}"
        )
    finally:
        con.unregister("snapshot_pg_stream")


def _heal(con: duckdb.DuckDBPyConnection, source: PostgresReader) -> list[str]:
    """Repair any table whose counts or totals differ from the warehouse's (as
    `staging._heal`)."""
    healed = []
    for table, totals in TOTALS_COMPARED.items():
        ours = comparable(con.execute(f"SELECT {totals} FROM {STAGE}.main.{table}").fetchone())
        if ours == source.totals(table):
            continue
        if table in _SPEND_TABLES:
            theirs = source.account_totals(table)
            mine = {
                account: comparable(figures)
                for account, *figures in con.execute(
                    f"SELECT ad_account_id, {totals} FROM {STAGE}.main.{table}"
                    " GROUP BY ad_account_id"
                ).fetchall()
            }
            differ = sorted(
                account for account in mine.keys() | theirs.keys()
                if mine.get(account) != theirs.get(account)
            )
            _replace_rows_of(con, source, table, "ad_account_id", differ)
        else:
            _rebuild(con, source, table)
        healed.append(table)
    return healed


def _hold(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """`table` as a temporary table `name` for the rest of this refresh."""
    register_arrow(con, f"{name}_arrow", table)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {name}_arrow")
    finally:
        con.unregister(f"{name}_arrow")

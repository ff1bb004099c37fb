"""The warehouse schema, as an ordered list of migrations.

`schema_version` records every migration applied. A migration is never
edited once shipped: a change is a new entry at the end of `MIGRATIONS`.
Column names of the contract's tables are stable; extra columns are ours.
"""

from __future__ import annotations

import re
import time
from contextlib import suppress
from dataclasses import dataclass

import duckdb

from rastro_assets.spend_schema import COUNT_SQL, SPEND_SQL
from rastro_assets.warehouse import dialect


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


_V1 = (
    """
    CREATE TABLE IF NOT EXISTS sites (
        site_id VARCHAR PRIMARY KEY,
        name VARCHAR,
        created_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS meta_connections (
        connection_id VARCHAR PRIMARY KEY,
        status VARCHAR NOT NULL DEFAULT 'active',
        invalid_since TIMESTAMPTZ,
        last_error VARCHAR,
        sealed_token BLOB,
        sealed_at TIMESTAMPTZ,
        created_at TIMESTAMPTZ,
        updated_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS meta_ad_accounts (
        ad_account_id VARCHAR PRIMARY KEY,
        connection_id VARCHAR NOT NULL,
        timezone VARCHAR NOT NULL,
        currency VARCHAR NOT NULL,
        name VARCHAR,
        created_at TIMESTAMPTZ,
        sync_requested_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS site_ad_accounts (
        site_id VARCHAR NOT NULL,
        ad_account_id VARCHAR NOT NULL,
        linked_at TIMESTAMPTZ,
        PRIMARY KEY (site_id, ad_account_id)
    )
    """,
    f"""
    CREATE TABLE IF NOT EXISTS ad_spend_daily (
        ad_account_id VARCHAR NOT NULL,
        ad_id VARCHAR NOT NULL,
        day DATE NOT NULL,
        spend {SPEND_SQL} NOT NULL,
        impressions {COUNT_SQL} NOT NULL,
        clicks {COUNT_SQL} NOT NULL,
        conversations {COUNT_SQL} NOT NULL,
        synced_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (ad_account_id, ad_id, day)
    )
    """,
    f"""
    CREATE TABLE IF NOT EXISTS site_spend_daily (
        site_id VARCHAR NOT NULL,
        ad_account_id VARCHAR NOT NULL,
        day DATE NOT NULL,
        spend {SPEND_SQL} NOT NULL,
        impressions {COUNT_SQL} NOT NULL,
        clicks {COUNT_SQL} NOT NULL,
        conversations {COUNT_SQL} NOT NULL,
        ad_rows BIGINT,
        PRIMARY KEY (site_id, ad_account_id, day)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS ad_catalog (
        ad_id VARCHAR PRIMARY KEY,
        ad_account_id VARCHAR,
        ad_name VARCHAR,
        adset_id VARCHAR,
        adset_name VARCHAR,
        campaign_id VARCHAR,
        campaign_name VARCHAR,
        ad_status VARCHAR,
        creative_type VARCHAR,
        creative_id VARCHAR,
        thumbnail_url VARCHAR,
        updated_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS ad_thumbnails (
        ad_id VARCHAR PRIMARY KEY,
        content_type VARCHAR,
        image BLOB,
        sha256 VARCHAR,
        creative_id VARCHAR,
        fetched_at TIMESTAMPTZ
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS meta_sync_runs (
        run_id VARCHAR NOT NULL,
        ad_account_id VARCHAR NOT NULL,
        kind VARCHAR,
        since DATE,
        until DATE,
        started_at TIMESTAMPTZ,
        finished_at TIMESTAMPTZ,
        outcome VARCHAR,
        rows_written BIGINT,
        rows_deleted BIGINT,
        api_calls BIGINT,
        error VARCHAR,
        catalog BOOLEAN,
        usage_pct DOUBLE,
        regain_at TIMESTAMPTZ,
        incomplete_days VARCHAR,
        token_sealed_at TIMESTAMPTZ,
        PRIMARY KEY (run_id, ad_account_id)
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS meta_sync_runs_account_started
        ON meta_sync_runs (ad_account_id, started_at)
    """,
    """
    CREATE TABLE IF NOT EXISTS lead_daily_rollups (
        site_id VARCHAR,
        ad_id VARCHAR,
        day DATE,
        leads BIGINT
    )
    """,
)

_V2 = (
    # What the analytics snapshot at each path last carried: the publisher and its sensor
    # compare the fingerprint with the pipeline's to know whether a publish is owed.
    """
    CREATE TABLE IF NOT EXISTS analytics_snapshot_state (
        target VARCHAR PRIMARY KEY,
        fingerprint VARCHAR,
        published_at TIMESTAMPTZ,
        bytes BIGINT,
        duration_ms BIGINT
    )
    """,
)

_V3 = (
    # The account's shard: which spend asset pair holds its partitions in Dagster. Set at
    # link time and changed only by `rastro shard move`. A table of its own, not a column
    # of `meta_ad_accounts`, whose columns analysts and scripts read with `SELECT *`; an
    # account without a row (linked before shards existed) is in shard 0, the pair every
    # install has.
    """
    CREATE TABLE IF NOT EXISTS ad_account_shards (
        ad_account_id VARCHAR PRIMARY KEY,
        shard INTEGER NOT NULL DEFAULT 0
    )
    """,
)

_V4 = (
    # A backfill run reads an account's owed days in several blocks, each its own sync
    # with its own row: a run and an account no longer name one row, the block's first
    # day does. DuckDB cannot alter a primary key, so the table is rebuilt; its index
    # depends on it and is made again.
    "DROP INDEX IF EXISTS meta_sync_runs_account_started",
    """
    CREATE TABLE meta_sync_runs_by_block (
        run_id VARCHAR NOT NULL,
        ad_account_id VARCHAR NOT NULL,
        kind VARCHAR,
        since DATE NOT NULL,
        until DATE,
        started_at TIMESTAMPTZ,
        finished_at TIMESTAMPTZ,
        outcome VARCHAR,
        rows_written BIGINT,
        rows_deleted BIGINT,
        api_calls BIGINT,
        error VARCHAR,
        catalog BOOLEAN,
        usage_pct DOUBLE,
        regain_at TIMESTAMPTZ,
        incomplete_days VARCHAR,
        token_sealed_at TIMESTAMPTZ,
        PRIMARY KEY (run_id, ad_account_id, since)
    )
    """,
    """
    INSERT INTO meta_sync_runs_by_block
    SELECT run_id, ad_account_id, kind, coalesce(since, started_at::DATE, DATE '1970-01-01'),
           until, started_at, finished_at, outcome, rows_written, rows_deleted, api_calls,
           error, catalog, usage_pct, regain_at, incomplete_days, token_sealed_at
    FROM meta_sync_runs
    """,
    "DROP TABLE meta_sync_runs",
    "ALTER TABLE meta_sync_runs_by_block RENAME TO meta_sync_runs",
    """
    CREATE INDEX IF NOT EXISTS meta_sync_runs_account_started
        ON meta_sync_runs (ad_account_id, started_at)
    """,
)

_V5 = (
    # The incidents the daemon found, so a restart neither forgets an open one nor says it
    # again. A cause found again after it cleared is a new incident: its own row.
    """
    CREATE TABLE IF NOT EXISTS alert_incidents (
        incident_key VARCHAR NOT NULL,
        opened_at TIMESTAMPTZ NOT NULL,
        kind VARCHAR NOT NULL,
        summary VARCHAR NOT NULL,
        detail VARCHAR,
        fix VARCHAR,
        accounts VARCHAR[],
        last_seen_at TIMESTAMPTZ NOT NULL,
        notified_at TIMESTAMPTZ,
        resolved_at TIMESTAMPTZ,
        PRIMARY KEY (incident_key, opened_at)
    )
    """,
    # Each notice to each channel, kept until delivered or given up: a channel that is down
    # is tried again, with back-off, by the next checks. `channel_id` is a digest, never the
    # channel's URL (a secret).
    """
    CREATE TABLE IF NOT EXISTS alert_notices (
        incident_key VARCHAR NOT NULL,
        opened_at TIMESTAMPTZ NOT NULL,
        event VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        channel_id VARCHAR NOT NULL,
        subject VARCHAR NOT NULL,
        body VARCHAR NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at TIMESTAMPTZ NOT NULL,
        delivered_at TIMESTAMPTZ,
        abandoned_at TIMESTAMPTZ,
        last_error VARCHAR,
        PRIMARY KEY (incident_key, opened_at, event, created_at, channel_id)
    )
    """,
    # When the daemon last checked: `rastro status --check` tells a stopped daemon from a
    # quiet one by it.
    """
    CREATE TABLE IF NOT EXISTS alert_checks (
        checker VARCHAR PRIMARY KEY,
        checked_at TIMESTAMPTZ NOT NULL
    )
    """,
)

_V6 = (
    # Which of Meta's limits held the account (`meta.limits.RateLimit`), and the account's
    # own peak share of its limits: `usage_pct` mixes in the app's share, which is every
    # token's together and never a reason to hold one account.
    "ALTER TABLE meta_sync_runs ADD COLUMN rate_limit VARCHAR",
    "ALTER TABLE meta_sync_runs ADD COLUMN account_usage_pct DOUBLE",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sites, connections, accounts, links, spend, catalog, thumbnails, runs", _V1),
    Migration(2, "analytics snapshot publish state", _V2),
    Migration(3, "the Dagster shard of each ad account", _V3),
    Migration(4, "one sync row per run, account and block", _V4),
    Migration(5, "incidents, their notices and the daemon's last check", _V5),
    Migration(6, "the rate limit that held a sync and the account's own usage", _V6),
)

LATEST_VERSION = MIGRATIONS[-1].version
MIGRATION_ATTEMPTS = 6
MIGRATION_LOCK_KEY = 0x7261_7374_726F
"""The advisory lock PostgreSQL migrations take turns on (the bytes of "rastro")."""

_VERSION_TABLE = """
    CREATE TABLE IF NOT EXISTS schema_version (
        version INTEGER PRIMARY KEY,
        description VARCHAR,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The highest migration applied; 0 for a file that has none."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables"
        " WHERE table_schema = current_schema() AND table_name = 'schema_version'"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply every missing migration, each in its own transaction; the version reached.

    Another process cannot hold the file read-write meanwhile (DuckDB's file
    lock), but another connection of this process can: the version is read
    again inside the transaction, and a commit that loses a race to such a
    connection is rolled back and re-checked rather than applied twice. On
    PostgreSQL many processes start at once: each migration transaction first
    takes one advisory lock, so they apply it one after another, and only the
    first finds it missing.
    """
    if current_version(con) >= LATEST_VERSION:
        return LATEST_VERSION
    for migration in MIGRATIONS:
        for attempt in range(MIGRATION_ATTEMPTS):
            if attempt:
                time.sleep(0.05 * 2**attempt)
            con.execute("BEGIN TRANSACTION")
            try:
                if dialect.is_postgres(con):
                    con.execute("SELECT pg_advisory_xact_lock(?)", [MIGRATION_LOCK_KEY])
                con.execute(_VERSION_TABLE)
                if current_version(con) >= migration.version:
                    con.execute("ROLLBACK")
                    break
                for statement in migration.statements:
                    con.execute(_for_engine(con, statement))
                con.execute(
                    "INSERT INTO schema_version (version, description) VALUES (?, ?)",
                    [migration.version, migration.description],
                )
                con.execute("COMMIT")
                break
            except (*dialect.Conflict, *dialect.ConstraintViolated):
                _rollback_quietly(con)
            except BaseException:
                _rollback_quietly(con)
                raise
        else:
            raise RuntimeError(f"could not apply warehouse migration {migration.version}")
    return current_version(con)


def _rollback_quietly(con: duckdb.DuckDBPyConnection) -> None:
    # A failed COMMIT has already ended the transaction; ROLLBACK then refuses.
    with suppress(*dialect.TransactionEnded):
        con.execute("ROLLBACK")


_PG_TYPES = ((re.compile(r"\bBLOB\b"), "BYTEA"), (re.compile(r"\bDOUBLE\b"), "DOUBLE PRECISION"))


def _for_engine(con: object, statement: str) -> str:
    """A migration's statement as `con`'s engine spells it: only two type names differ."""
    if not dialect.is_postgres(con):
        return statement
    for pattern, name in _PG_TYPES:
        statement = pattern.sub(name, statement)
    return statement


def table_columns() -> dict[str, list[tuple[str, str, bool]]]:
    """Each table's (column, type, nullable), read from the migrations applied to an empty
    database: what the tables are, whatever file is at hand."""
    with duckdb.connect(":memory:") as con:
        migrate(con)
        rows = con.execute(
            """
            SELECT table_name, column_name, data_type, is_nullable = 'YES'
            FROM information_schema.columns WHERE table_schema = 'main'
            ORDER BY table_name, ordinal_position
            """
        ).fetchall()
    columns: dict[str, list[tuple[str, str, bool]]] = {}
    for table, column, data_type, nullable in rows:
        columns.setdefault(table, []).append((column, data_type, nullable))
    return columns

"""The statements on `ad_spend_daily`: replace accounts' days, keep `site_spend_daily` in step.

The table's layer; the sync's write step (`sync.spend_write`) calls it.
`write_spend_many` serves one account or hundreds: a batch is one
transaction and one set of set-based statements over the reads' Arrow
tables. Rows missing from a day read completely are deleted (a partial day
is only upserted: nothing can be inferred from what a truncated read left
out), and `site_spend_daily` for every site linking an account is rebuilt
for the touched days from the exact sums (`site_spend.py`). Money is
`decimal128(18, 4)` into `DECIMAL(18, 4)`: no float anywhere. `write_spend`
is the one-account face: a batch of one that raises its refusal.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

import duckdb
import pyarrow as pa

from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import in_transaction, register_arrow, transaction
from rastro_assets.warehouse.errors import (
    AccountTakenOver,
    SpendInputError,
    WriteRefusal,
    not_linked,
)
from rastro_assets.warehouse.site_spend import SCOPE, DaySummary, replace_site_spend
from rastro_assets.warehouse.spend_input import SPEND_COLUMNS, first_duplicate, incoming_table

__all__ = [
    "SPEND_COLUMNS",
    "DaySummary",
    "SpendInputError",
    "SpendWrite",
    "SpendWriteResult",
    "lock_accounts",
    "spend_by_day",
    "write_spend",
    "write_spend_many",
]

ZERO_SPEND = Decimal("0.0000")

# The name the reads' Arrow table is registered under, spelled out in the SQL below.
_INCOMING = "incoming_spend"


@dataclass(frozen=True)
class SpendWriteResult:
    rows_written: int  # inserted, or existing with a changed figure
    rows_deleted: int  # removed from complete days because the read no longer has them
    rows_unchanged: int  # re-read with identical figures: only synced_at moved
    days: dict[date, DaySummary]  # final state of every day written, rows or not


@dataclass(frozen=True)
class SpendWrite:
    """One account's read.

    Attributes:
        days: every account-local day this read covered; each row's day is one.
        rows: the ad-days read, at most one per (ad_id, day): an Arrow table
            with `SPEND_COLUMNS` (an `InsightsChunk.table`, say; other columns
            are ignored).
        complete_days: the days read completely (a subset of `days`): their
            stored rows absent from `rows` are deleted.
    """

    ad_account_id: str
    days: Collection[date]
    rows: pa.Table
    complete_days: Collection[date]
    run_id: str | None = None
    """The Dagster run writing: its own later syncs of the account do not fence it off."""


def write_spend(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    *,
    days: Collection[date],
    rows: pa.Table,
    complete_days: Collection[date],
    synced_at: datetime,
) -> SpendWriteResult:
    """Replace `days` of one account with `rows`: `write_spend_many` for a batch of one.

    Joins a transaction open on `con` (the backfill writes the names in the
    same one); a refusal raises, and the caller's transaction rolls back.

    Raises:
        SpendInputError: the read is inconsistent or a spend does not fit
            DECIMAL(18,4) exactly.
        AccountNotLinked: no site links the account.
    """
    write = SpendWrite(ad_account_id, days, rows, complete_days)
    [answer] = write_spend_many(con, [write], synced_at=synced_at)
    if isinstance(answer, SpendWriteResult):
        return answer
    raise answer


def write_spend_many(
    con: duckdb.DuckDBPyConnection, writes: Sequence[SpendWrite], *, synced_at: datetime
) -> list[SpendWriteResult | WriteRefusal]:
    """Write several accounts' reads at once: one transaction, one set of statements.

    A live wave writes a few dozen rows for each of hundreds of accounts; a
    statement costs about as much for one account as for fifty, so a batch
    costs a fraction of writing them one by one. The answer is per write, in
    order: a refused read gets its error and nothing of it is written, while
    the others are. Should the batch fail as a whole (a site-day whose sums
    overflow), each write is retried on its own so the failure stays with
    its account; that needs the batch to own its transaction, so a batch of
    more than one write must not run inside a transaction the caller opened.
    """
    if synced_at.tzinfo is None:
        raise SpendInputError("synced_at must be an aware datetime")
    accounts = [write.ad_account_id for write in writes]
    if len(set(accounts)) < len(accounts):
        # The same account twice would match its own rows twice: write one at a time.
        return [_write_alone(con, write, synced_at) for write in writes]
    answers: list[SpendWriteResult | WriteRefusal | None] = [None] * len(
        writes
    )
    batch: dict[str, _Read] = {}
    for index, write in enumerate(writes):
        day_list, complete_list = sorted(set(write.days)), sorted(set(write.complete_days))
        try:
            table = incoming_table(day_list, complete_list, write.rows)
        except SpendInputError as exc:
            answers[index] = exc
            continue
        if not day_list:
            answers[index] = SpendWriteResult(0, 0, 0, {})
        else:
            batch[write.ad_account_id] = _Read(index, day_list, complete_list, table, write.run_id)
    if batch:
        try:
            with transaction(con):
                for account, outcome in _write_batch(con, batch, synced_at).items():
                    answers[batch[account].index] = outcome
        except SpendInputError as exc:
            if len(batch) == 1:
                [read] = batch.values()
                answers[read.index] = exc
            else:
                for read in batch.values():
                    answers[read.index] = _write_alone(con, writes[read.index], synced_at)
    return answers  # type: ignore[return-value]


@dataclass(frozen=True)
class _Read:
    """A checked write of the batch: its place among the writes, days sorted, its table."""

    index: int
    days: list[date]
    complete_days: list[date]
    table: pa.Table
    run_id: str | None = None


def _write_alone(
    con: duckdb.DuckDBPyConnection, write: SpendWrite, synced_at: datetime
) -> SpendWriteResult | WriteRefusal:
    [answer] = write_spend_many(con, [write], synced_at=synced_at)
    return answer


def _write_batch(
    con: duckdb.DuckDBPyConnection, batch: dict[str, _Read], synced_at: datetime
) -> dict[str, SpendWriteResult | WriteRefusal]:
    """The batch's statements, inside the caller's transaction."""
    answers: dict[str, SpendWriteResult | WriteRefusal] = {}
    lock_accounts(con, batch)
    _register(con, batch)
    try:
        refused, stored = _check_batch(con, batch, synced_at, answers)
        if refused:
            batch = {account: read for account, read in batch.items() if account not in refused}
            if not batch:
                return answers
            _register(con, batch)
        params = _bounds(batch)
        if stored:
            counts = _apply(con, batch, params, synced_at)
        else:
            # Nothing stored for these days yet (a first backfill): every row is new.
            con.execute(_INSERT, {"synced_at": synced_at})
            counts = {account: {"new": read.table.num_rows} for account, read in batch.items()}
        summaries = replace_site_spend(con, params["accounts"], params["first"], params["last"])
    finally:
        # After a failed statement the transaction is aborted and refuses even this; the
        # rollback that follows drops the tables with it.
        with suppress(*dialect.TransactionAborted):
            con.unregister(_INCOMING)
            con.unregister(SCOPE)
    for account, read in batch.items():
        found = summaries.get(account, {})
        account_counts = counts[account]
        answers[account] = SpendWriteResult(
            rows_written=account_counts.get("new", 0) + account_counts.get("changed", 0),
            rows_deleted=account_counts.get("gone", 0),
            rows_unchanged=account_counts.get("same", 0),
            days={day: found.get(day, DaySummary(ZERO_SPEND, 0)) for day in read.days},
        )
    return answers


def lock_accounts(con: duckdb.DuckDBPyConnection, ad_account_ids: Collection[str]) -> None:
    """Hold each account's `meta_ad_accounts` row until the open transaction ends.

    The lease's order on PostgreSQL: a spend write takes it before it checks whether a
    newer sync holds the account, and so does whatever opens a sync's lease, so two
    writers of one account (or a writer and a newer sync's start) run one after the other
    and the later one sees what the earlier committed. Rows are locked in the order of
    their ids, the same in every caller: two batches sharing accounts never deadlock.
    DuckDB has one writing process, whose transactions on the same rows conflict instead.

    Raises:
        ValueError: no transaction is open on `con`, so a lock would end at once.
    """
    if not dialect.is_postgres(con) or not ad_account_ids:
        return
    if not in_transaction(con):
        raise ValueError("lock_accounts holds its rows only inside a transaction")
    con.execute(
        "SELECT ad_account_id FROM meta_ad_accounts WHERE ad_account_id = ANY(?::VARCHAR[])"
        " ORDER BY ad_account_id FOR UPDATE",
        [sorted(set(ad_account_ids))],
    ).fetchall()


def _check_batch(
    con: duckdb.DuckDBPyConnection,
    batch: dict[str, _Read],
    synced_at: datetime,
    answers: dict[str, SpendWriteResult | WriteRefusal],
) -> tuple[set[str], int]:
    """The accounts of the batch refused (each with its refusal in `answers`): taken over
    by a newer sync, a repeated ad-day, no site linking it; and the rows already stored for
    the days the others write."""
    refused = set()
    stored = 0
    for account, sites, repeated, rows_stored, newer in con.execute(
        _CHECKS,
        {
            **_bounds(batch),
            "synced_at": synced_at,
            "own_runs": sorted({read.run_id for read in batch.values() if read.run_id}),
        },
    ).fetchall():
        if newer:
            answers[account] = AccountTakenOver(
                f"{account}: a sync that started after this run's holds the account now; "
                "nothing of this run was written"
            )
            refused.add(account)
        elif repeated:
            answers[account] = SpendInputError(
                f"the read repeats an ad-day: {first_duplicate(batch[account].table)}"
            )
            refused.add(account)
        elif not sites:
            answers[account] = not_linked(account)
            refused.add(account)
        else:
            stored += rows_stored
    return refused, stored


def _apply(
    con: duckdb.DuckDBPyConnection,
    batch: dict[str, _Read],
    params: dict[str, object],
    synced_at: datetime,
) -> dict[str, dict[str, int]]:
    """Delete, update and insert as classified; per account, the rows of each change.

    The classification is a temporary table keyed like `ad_spend_daily`, so each statement
    after it finds its rows by the primary key on either engine. On PostgreSQL it is
    analyzed first: the planner then knows how few rows are gone or changed and looks
    each up by the key's index, where a guess had it scan the read once per stored row.
    """
    con.execute(dialect.pick(con, duckdb=_CLASSIFY_DUCKDB, postgres=_CLASSIFY_POSTGRES), params)
    try:
        if dialect.is_postgres(con):
            con.execute("ANALYZE spend_changes")
        counts: dict[str, dict[str, int]] = {account: {} for account in batch}
        for account, change, count in con.execute(
            "SELECT ad_account_id, change, count(*) FROM spend_changes"
            " GROUP BY ad_account_id, change"
        ).fetchall():
            counts[account][change] = int(count)
        totals = {change: sum(c.get(change, 0) for c in counts.values())
                  for change in ("new", "changed", "same", "gone")}
        stamped = {"synced_at": synced_at}
        if totals["gone"]:
            con.execute(_DELETE_GONE)
        if totals["changed"]:
            con.execute(_UPDATE_CHANGED, stamped)
        if totals["new"]:
            con.execute(_INSERT_NEW, stamped)
        if totals["same"]:
            con.execute(_STAMP_COMPLETE_DAYS, {**params, **stamped})
            if any(len(read.complete_days) < len(read.days) for read in batch.values()):
                con.execute(_STAMP_PARTIAL_DAYS, stamped)
    finally:
        with suppress(*dialect.TransactionAborted):  # an aborted transaction drops it
            con.execute("DROP TABLE IF EXISTS spend_changes")
    return counts


def _register(con: duckdb.DuckDBPyConnection, batch: dict[str, _Read]) -> None:
    """Register the batch's rows with their account, and its (account, day, complete) scope."""
    parts, scope_accounts, scope_days, scope_complete = [], [], [], []
    for account, read in batch.items():
        table = read.table
        parts.append(
            table.add_column(
                0, "ad_account_id", pa.repeat(pa.scalar(account, pa.string()), table.num_rows)
            )
        )
        complete = set(read.complete_days)
        for day in read.days:
            scope_accounts.append(account)
            scope_days.append(day)
            scope_complete.append(day in complete)
    scope = pa.table(
        {
            "ad_account_id": pa.array(scope_accounts, pa.string()),
            "day": pa.array(scope_days, pa.date32()),
            "complete": pa.array(scope_complete, pa.bool_()),
        }
    )
    register_arrow(con, _INCOMING, pa.concat_tables(parts))
    register_arrow(con, SCOPE, scope)


def _bounds(batch: dict[str, _Read]) -> dict[str, object]:
    """The batch's accounts and day bounds: they let DuckDB skip row groups."""
    return {
        "accounts": sorted(batch),
        "first": min(read.days[0] for read in batch.values()),
        "last": max(read.days[-1] for read in batch.values()),
    }


# Per account: the sites linking it, the ad-days its read repeats, the rows
# already stored between the batch's first and last day (none: the writer only
# inserts; counting over the bounds rather than the scope's days is cheaper and
# can only miss that shortcut, never take it wrongly), and the syncs of it that
# started after this write's run (`synced_at` is its run's start) in another run: any,
# and the account is no longer this run's to write. A run that reads an account in
# several blocks starts each block's sync when it reaches it, after its own start.
_CHECKS = """
    WITH links AS (
        SELECT ad_account_id, array_agg(site_id ORDER BY site_id) AS sites
        FROM site_ad_accounts
        WHERE ad_account_id = ANY($accounts::VARCHAR[])
        GROUP BY ad_account_id
    ), repeats AS (
        SELECT ad_account_id, count(*) AS n
        FROM (SELECT ad_account_id FROM incoming_spend
              GROUP BY ad_account_id, ad_id, day HAVING count(*) > 1) repeated
        GROUP BY ad_account_id
    ), stored AS (
        SELECT ad_account_id, count(*) AS n
        FROM ad_spend_daily
        WHERE ad_account_id = ANY($accounts::VARCHAR[]) AND day BETWEEN $first AND $last
        GROUP BY ad_account_id
    ), newer AS (
        SELECT ad_account_id, count(*) AS n
        FROM meta_sync_runs
        WHERE started_at > $synced_at AND ad_account_id = ANY($accounts::VARCHAR[])
          AND NOT run_id = ANY($own_runs::VARCHAR[])
        GROUP BY ad_account_id
    )
    SELECT a.ad_account_id, l.sites, coalesce(r.n, 0), coalesce(s.n, 0), coalesce(w.n, 0)
    FROM (SELECT unnest($accounts::VARCHAR[]) AS ad_account_id) a
    LEFT JOIN links l USING (ad_account_id)
    LEFT JOIN repeats r USING (ad_account_id)
    LEFT JOIN stored s USING (ad_account_id)
    LEFT JOIN newer w USING (ad_account_id)
"""

_INSERT = """
    INSERT INTO ad_spend_daily
        (ad_account_id, ad_id, day, spend, impressions, clicks, conversations, synced_at)
    SELECT ad_account_id, ad_id, day, spend, impressions, clicks, conversations, $synced_at
    FROM incoming_spend
"""

# A stored row and its classified match `c`, by the primary key.
_MATCH = """ad_spend_daily.ad_account_id = c.ad_account_id
          AND ad_spend_daily.ad_id = c.ad_id AND ad_spend_daily.day = c.day"""

# What a write does with an incoming row `i` and its stored match `d`.
_CHANGE = """CASE
               WHEN i.ad_id IS NULL THEN 'gone'
               WHEN d.ad_id IS NULL THEN 'new'
               WHEN d.spend <> i.spend OR d.impressions <> i.impressions
                    OR d.clicks <> i.clicks OR d.conversations <> i.conversations
               THEN 'changed'
               ELSE 'same'
           END"""

# Every incoming row and every stored row of the scope's account-days, matched once by the
# key: `change` says what the write does with it. A stored row no read has is 'gone' only
# on a complete day.
_CLASSIFICATION = f"""
    SELECT coalesce(i.ad_account_id, d.ad_account_id) AS ad_account_id,
           coalesce(i.ad_id, d.ad_id) AS ad_id, coalesce(i.day, d.day) AS day,
           i.spend, i.impressions, i.clicks, i.conversations,
           {_CHANGE} AS change
    FROM incoming_spend i
    FULL JOIN (
        SELECT s.ad_account_id, s.ad_id, s.day, s.spend, s.impressions, s.clicks,
               s.conversations, scope.complete
        FROM ad_spend_daily s
        JOIN spend_scope scope ON scope.ad_account_id = s.ad_account_id AND scope.day = s.day
        WHERE s.ad_account_id = ANY($accounts::VARCHAR[])
          AND s.day BETWEEN $first AND $last
    ) d ON d.ad_account_id = i.ad_account_id AND d.ad_id = i.ad_id AND d.day = i.day
    WHERE i.ad_id IS NOT NULL OR d.complete
"""
_CLASSIFY_DUCKDB = f"CREATE OR REPLACE TEMP TABLE spend_changes AS {_CLASSIFICATION}"
_CLASSIFY_POSTGRES = f"CREATE TEMP TABLE spend_changes AS {_CLASSIFICATION}"

_DELETE_GONE = f"""
    DELETE FROM ad_spend_daily USING spend_changes c
    WHERE {_MATCH} AND c.change = 'gone'
"""

_UPDATE_CHANGED = f"""
    UPDATE ad_spend_daily SET
        spend = c.spend, impressions = c.impressions, clicks = c.clicks,
        conversations = c.conversations, synced_at = $synced_at
    FROM spend_changes c
    WHERE {_MATCH} AND c.change = 'changed'
"""

# Most of a re-read: only the stamp moves, and on a complete day every row left after the
# deletes is one the read brought, so those days are stamped by the scope alone, without
# matching the rows. A partial day's rows are stamped only where the read had them. No
# indexed column changes, so PostgreSQL may keep the new row version on its page (a HOT
# update); a row already stamped (changed or new) is left be.
_STAMP_COMPLETE_DAYS = """
    UPDATE ad_spend_daily SET synced_at = $synced_at
    FROM spend_scope scope
    WHERE ad_spend_daily.ad_account_id = scope.ad_account_id
      AND ad_spend_daily.day = scope.day AND scope.complete
      AND ad_spend_daily.ad_account_id = ANY($accounts::VARCHAR[])
      AND ad_spend_daily.day BETWEEN $first AND $last
      AND ad_spend_daily.synced_at IS DISTINCT FROM $synced_at
"""
_STAMP_PARTIAL_DAYS = f"""
    UPDATE ad_spend_daily SET synced_at = $synced_at
    FROM spend_changes c
    JOIN spend_scope scope ON scope.ad_account_id = c.ad_account_id AND scope.day = c.day
    WHERE {_MATCH} AND c.change = 'same' AND NOT scope.complete
      AND ad_spend_daily.synced_at IS DISTINCT FROM $synced_at
"""

_INSERT_NEW = """
    INSERT INTO ad_spend_daily
        (ad_account_id, ad_id, day, spend, impressions, clicks, conversations, synced_at)
    SELECT ad_account_id, ad_id, day, spend, impressions, clicks, conversations, $synced_at
    FROM spend_changes WHERE change = 'new'
"""


def spend_by_day(
    con: duckdb.DuckDBPyConnection, ad_account_id: str, since: date, until: date
) -> dict[date, DaySummary]:
    """Spend and row count of every day from `since` to `until`, zero for empty days."""
    if until < since:
        return {}
    days = [since + timedelta(days=offset) for offset in range((until - since).days + 1)]
    rows = con.execute(
        """
        SELECT day, sum(spend), count(*) FROM ad_spend_daily
        WHERE ad_account_id = ? AND day BETWEEN ? AND ?
        GROUP BY day
        """,
        [ad_account_id, since, until],
    ).fetchall()
    found = {day: DaySummary(spend, int(count)) for day, spend, count in rows}
    return {day: found.get(day, DaySummary(ZERO_SPEND, 0)) for day in days}

"""The spend writer: replace an account's days in `ad_spend_daily`, keep sites in step.

One call is one transaction: the read's rows are upserted through an Arrow
table with set-based SQL, rows missing from a day read completely are
deleted (a partial day is only upserted: nothing can be inferred from what
a truncated read left out), and `site_spend_daily` for every site linking the
account is rebuilt for the touched days from the exact sums. Money is
`decimal128(18, 4)` (or `Decimal` in `InsightRow`s) into `DECIMAL(18, 4)`:
no float anywhere.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from operator import attrgetter

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from rastro_assets.meta.models import (
    INSIGHT_SCHEMA,
    SPEND_LIMIT,
    InsightRow,
    first_unrepresentable,
)
from rastro_assets.warehouse.connection import register_arrow, transaction

ZERO_SPEND = Decimal("0.0000")
# The columns the writer reads, with the types it takes them in.
SPEND_COLUMNS = pa.schema(INSIGHT_SCHEMA.field(name) for name in (
    "ad_id", "day", "spend", "impressions", "clicks", "conversations"
))

# The name the read's Arrow table is registered under, spelled out in the SQL below.
_INCOMING = "incoming_spend"


@dataclass(frozen=True)
class DaySummary:
    spend: Decimal
    rows: int


@dataclass(frozen=True)
class SpendWriteResult:
    rows_written: int  # inserted, or existing with a changed figure
    rows_deleted: int  # removed from complete days because the read no longer has them
    rows_unchanged: int  # re-read with identical figures: only synced_at moved
    days: dict[date, DaySummary]  # final state of every day written, rows or not


class AccountNotLinked(Exception):
    """No site links the account (any more): nothing was written."""


class SpendInputError(ValueError):
    """The read itself is inconsistent or not representable: nothing was written."""


def write_spend(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    *,
    days: Collection[date],
    rows: pa.Table | Sequence[InsightRow],
    complete_days: Collection[date],
    synced_at: datetime,
) -> SpendWriteResult:
    """Replace `days` of the account with `rows`, in one transaction.

    Args:
        days: every account-local day this read covered; each row's day is one.
        rows: the ad-days read, at most one per (ad_id, day): an Arrow table
            with `SPEND_COLUMNS` (an `InsightsChunk.table`, say; other
            columns are ignored), or `InsightRow`s.
        complete_days: the days read completely (a subset of `days`): their
            stored rows absent from `rows` are deleted.
        synced_at: stamped on every row written, changed or not.

    Raises:
        SpendInputError: the read is inconsistent or a spend does not fit
            DECIMAL(18,4) exactly.
        AccountNotLinked: no site links the account.
    """
    if synced_at.tzinfo is None:
        raise SpendInputError("synced_at must be an aware datetime")
    day_list = sorted(set(days))
    complete_list = sorted(set(complete_days))
    incoming = _incoming_table(day_list, complete_list, rows)
    if not day_list:
        return SpendWriteResult(0, 0, 0, {})

    with transaction(con):
        register_arrow(con, _INCOMING, incoming)
        try:
            days_sql, days_params = _among(day_list, "day")
            sites, repeated, stored = con.execute(
                _CHECKS.format(days=days_sql),
                [ad_account_id, ad_account_id, day_list[0], day_list[-1], *days_params],
            ).fetchall()[0]
            if repeated:
                raise SpendInputError(
                    f"the read repeats an ad-day: {_first_duplicate(incoming)}"
                )
            if not sites:
                raise AccountNotLinked(
                    f"{ad_account_id} is not linked to any site (any more): nothing written"
                )
            if stored:
                inserted, changed, unchanged, doomed = _apply(
                    con, ad_account_id, day_list, complete_list, synced_at
                )
            else:
                # Nothing stored for these days yet (a first backfill): every row is new.
                if incoming.num_rows:
                    con.execute(_INSERT.format(source=_INCOMING), [ad_account_id, synced_at])
                inserted, changed, unchanged, doomed = incoming.num_rows, 0, 0, 0
        finally:
            con.unregister(_INCOMING)
        summary = _replace_site_spend(con, ad_account_id, day_list, list(sites))

    return SpendWriteResult(
        rows_written=inserted + changed,
        rows_deleted=doomed,
        rows_unchanged=unchanged,
        days={day: summary.get(day, DaySummary(ZERO_SPEND, 0)) for day in day_list},
    )


_CHECKS = """
    SELECT
        (SELECT list(site_id ORDER BY site_id) FROM site_ad_accounts WHERE ad_account_id = ?),
        (SELECT count(*) FROM (
            SELECT 1 FROM incoming_spend GROUP BY ad_id, day HAVING count(*) > 1)),
        (SELECT count(*) FROM ad_spend_daily
         WHERE ad_account_id = ? AND day BETWEEN ? AND ? {days})
"""

_INSERT = """
    INSERT INTO ad_spend_daily
        (ad_account_id, ad_id, day, spend, impressions, clicks, conversations, synced_at)
    SELECT ?, ad_id, day, spend, impressions, clicks, conversations, ?
    FROM {source}
"""

# What a write does with an incoming row `i` and its stored match `d`.
_CHANGE = """CASE
               WHEN i.ad_id IS NULL THEN 'gone'
               WHEN d.rid IS NULL THEN 'new'
               WHEN d.spend <> i.spend OR d.impressions <> i.impressions
                    OR d.clicks <> i.clicks OR d.conversations <> i.conversations
               THEN 'changed'
               ELSE 'same'
           END"""

# Every incoming row and every stored row of the days written, matched once:
# `change` says what the write does with it. Stored rows are addressed by
# rowid afterwards, so the key join runs once.
_CHANGES = f"""
    CREATE OR REPLACE TEMP TABLE spend_changes AS
    SELECT i.ad_id, i.day, i.spend, i.impressions, i.clicks, i.conversations, d.rid,
           {_CHANGE} AS change
    FROM incoming_spend i
    FULL JOIN (
        SELECT rowid AS rid, ad_id, day, spend, impressions, clicks, conversations
        FROM ad_spend_daily
        WHERE ad_account_id = ? AND day BETWEEN ? AND ? {{days}}
    ) d ON d.ad_id = i.ad_id AND d.day = i.day
    WHERE i.ad_id IS NOT NULL OR ({{complete}})
"""


def _apply(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    day_list: list[date],
    complete_list: list[date],
    synced_at: datetime,
) -> tuple[int, int, int, int]:
    """Insert, update and delete in the open transaction; (inserted, changed, same, deleted)."""
    days_sql, days_params = _among(day_list, "day")
    if complete_list == day_list:
        complete_sql, complete_params = "TRUE", []
    elif not complete_list:
        complete_sql, complete_params = "FALSE", []
    else:
        complete_sql, complete_params = "list_contains(?::DATE[], d.day)", [complete_list]
    con.execute(
        _CHANGES.format(days=days_sql, complete=complete_sql),
        [ad_account_id, day_list[0], day_list[-1], *days_params, *complete_params],
    )
    try:
        counts = dict(
            con.execute("SELECT change, count(*) FROM spend_changes GROUP BY change").fetchall()
        )
        inserted, changed = counts.get("new", 0), counts.get("changed", 0)
        unchanged, doomed = counts.get("same", 0), counts.get("gone", 0)
        if doomed:
            con.execute(
                "DELETE FROM ad_spend_daily"
                " WHERE rowid IN (SELECT rid FROM spend_changes WHERE change = 'gone')"
            )
        if changed:
            con.execute(
                """
                UPDATE ad_spend_daily SET
                    spend = c.spend, impressions = c.impressions, clicks = c.clicks,
                    conversations = c.conversations, synced_at = ?
                FROM spend_changes c
                WHERE ad_spend_daily.rowid = c.rid AND c.change = 'changed'
                """,
                [synced_at],
            )
        if unchanged:
            con.execute(
                """
                UPDATE ad_spend_daily SET synced_at = ?
                FROM spend_changes c
                WHERE ad_spend_daily.rowid = c.rid AND c.change = 'same'
                """,
                [synced_at],
            )
        if inserted:
            con.execute(
                _INSERT.format(source="spend_changes WHERE change = 'new'"),
                [ad_account_id, synced_at],
            )
    finally:
        with suppress(duckdb.TransactionException):  # an aborted transaction drops it
            con.execute("DROP TABLE IF EXISTS spend_changes")
    return int(inserted), int(changed), int(unchanged), int(doomed)


def _among(days: list[date], column: str) -> tuple[str, list[object]]:
    """SQL narrowing a `BETWEEN first AND last` to `days` (nothing when they are every day)."""
    if (days[-1] - days[0]).days + 1 == len(days):
        return "", []
    return f"AND list_contains(?::DATE[], {column})", [days]


def rebuild_site_spend(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    days: Iterable[date] | None = None,
    *,
    site_ids: Iterable[str] | None = None,
) -> None:
    """Bring `site_spend_daily` back to the exact sums of `ad_spend_daily`.

    Covers every site linking the account (or only those of `site_ids` that
    link it) on `days` (every day either table has for the account when
    None). A site-day with no ad rows ends with no row.
    """
    with transaction(con):
        if days is None:
            found = con.execute(
                """
                SELECT DISTINCT day FROM ad_spend_daily WHERE ad_account_id = ?
                UNION SELECT DISTINCT day FROM site_spend_daily WHERE ad_account_id = ?
                """,
                [ad_account_id, ad_account_id],
            ).fetchall()
            days = [row[0] for row in found]
        linked = con.execute(
            "SELECT site_id FROM site_ad_accounts WHERE ad_account_id = ? ORDER BY site_id",
            [ad_account_id],
        ).fetchall()
        sites = [row[0] for row in linked]
        if site_ids is not None:
            wanted = set(site_ids)
            sites = [site for site in sites if site in wanted]
        day_list = sorted(set(days))
        if day_list and sites:
            _replace_site_spend(con, ad_account_id, day_list, sites)


def _replace_site_spend(
    con: duckdb.DuckDBPyConnection, ad_account_id: str, days: list[date], sites: list[str]
) -> dict[date, DaySummary]:
    """Delete then re-insert the sites' rows for `days`; the per-day totals inserted.

    Runs inside the caller's transaction. The totals come back through
    RETURNING (`ad_rows` counts the ad rows summed), which spares the writer
    a separate query for its per-day summary.
    """
    days_sql, days_params = _among(days, "day")
    con.execute(
        f"""
        DELETE FROM site_spend_daily
        WHERE ad_account_id = ? AND day BETWEEN ? AND ? {days_sql}
          AND list_contains(?::VARCHAR[], site_id)
        """,
        [ad_account_id, days[0], days[-1], *days_params, sites],
    )
    inserted = _insert_site_sums(
        con,
        f"""
        INSERT INTO site_spend_daily
            (site_id, ad_account_id, day, spend, impressions, clicks, conversations, ad_rows)
        SELECT unnest(?::VARCHAR[]), *
        FROM (
            SELECT {_SITE_SUMS}
            FROM ad_spend_daily
            WHERE ad_account_id = ? AND day BETWEEN ? AND ? {days_sql}
            GROUP BY ad_account_id, day
        )
        RETURNING site_id, day, spend, ad_rows
        """,
        [sites, ad_account_id, days[0], days[-1], *days_params],
    )
    first = sites[0]
    return {
        day: DaySummary(spend, int(ad_rows))
        for site_id, day, spend, ad_rows in inserted
        if site_id == first
    }


# DuckDB sums DECIMAL(18,4) as DECIMAL(38,4) and BIGINT as HUGEINT, so a day of
# rows that each fit can still sum past `site_spend_daily`'s types. The check
# rides in the insert itself: `error()` names the day and the figure, where
# the cast would only say "out of range".
_OVERFLOW_MARK = "site sum overflow: "
_SPEND_SUM_RANGE = "-99999999999999.9999::DECIMAL(38,4) AND 99999999999999.9999::DECIMAL(38,4)"
_COUNT_SUM_RANGE = "-9223372036854775808::HUGEINT AND 9223372036854775807::HUGEINT"


def _insert_site_sums(con: duckdb.DuckDBPyConnection, sql: str, params: object) -> list[tuple]:
    """Run a site-sum insert; a sum past its column's type is the read's error."""
    try:
        return con.execute(sql, params).fetchall()
    except duckdb.InvalidInputException as exc:
        message = str(exc)
        if _OVERFLOW_MARK not in message:
            raise
        raise SpendInputError(message.split(_OVERFLOW_MARK, 1)[1]) from None


def _checked_sum(column: str, allowed: str) -> str:
    return (
        f"CASE WHEN sum({column}) NOT BETWEEN {allowed}"
        f" THEN error('{_OVERFLOW_MARK}' || ad_account_id || ' on ' || day::VARCHAR"
        f" || ': the {column} of its ads sums to ' || sum({column})::VARCHAR"
        f" || ', more than site_spend_daily.{column} holds')"
        f" ELSE sum({column}) END"
    )


# A day's sums for `site_spend_daily`, each checked against its column's type.
_SITE_SUMS = ", ".join([
    "ad_account_id, day",
    _checked_sum("spend", _SPEND_SUM_RANGE),
    *(_checked_sum(name, _COUNT_SUM_RANGE) for name in ("impressions", "clicks", "conversations")),
    "count(*)",
])


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


def _incoming_table(
    days: list[date], complete_days: list[date], rows: pa.Table | Sequence[InsightRow]
) -> pa.Table:
    """The read as `SPEND_COLUMNS`, checked; SpendInputError when it is wrong.

    Repeated ad-days are counted by DuckDB in the writer's first query.
    """
    day_set = set(days)
    stray = [day for day in complete_days if day not in day_set]
    if stray:
        raise SpendInputError(f"complete day {stray[0].isoformat()} is not one of the days written")
    if isinstance(rows, pa.Table):
        table = read_columns(rows, SPEND_COLUMNS)
        given = None
    else:
        table = _table_of(rows, day_set)
        given = rows
    if not table.num_rows:
        return table
    ad_id, day = table["ad_id"], table["day"]
    written = pc.is_in(day, value_set=pa.array(days, pa.date32()))
    if not pc.all(written).as_py():
        outside = pc.index(written, False).as_py()
        raise SpendInputError(
            f"ad {ad_id[outside].as_py()} has a row for {day[outside].as_py()}, which is not"
            " one of the days written"
        )
    if ad_id.null_count or pc.any(pc.equal(ad_id, "")).as_py():
        raise SpendInputError("the read has a row without an ad id")
    if any(column.null_count for column in table.columns):
        problem = _first_unrepresentable(table, given)
        raise SpendInputError(problem or "the read has an empty figure")
    # decimal128(18, 4) promises 18 digits, but an array built unchecked may hold more.
    extremes = pc.min_max(table["spend"])
    if extremes["min"].as_py() <= -SPEND_LIMIT or extremes["max"].as_py() >= SPEND_LIMIT:
        raise SpendInputError(_first_unrepresentable(table, given) or "a spend is out of range")
    return table


def read_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` narrowed to `schema`'s columns, which it must have with their types."""
    columns = []
    for name, type_ in zip(schema.names, schema.types, strict=True):
        if name not in table.column_names:
            raise SpendInputError(f"the read has no {name!r} column")
        column = table[name]
        if column.type != type_:
            raise SpendInputError(f"the read's {name!r} column is {column.type}, not {type_}")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _table_of(rows: Sequence[InsightRow], day_set: set[date]) -> pa.Table:
    """`rows` as `SPEND_COLUMNS`; SpendInputError naming the first row that does not fit.

    The checks on the table follow; when the conversion itself fails, the
    refusal is the one they would have given first.
    """
    try:
        return pa.Table.from_arrays(
            [pa.array(list(map(attrgetter(field.name), rows)), field.type)
             for field in SPEND_COLUMNS],
            schema=SPEND_COLUMNS,
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        failure = exc
    outside = next((row for row in rows if row.day not in day_set), None)
    if outside is not None:
        raise SpendInputError(
            f"ad {outside.ad_id} has a row for {outside.day}, which is not one of the days written"
        )
    if not all(row.ad_id for row in rows):
        raise SpendInputError("the read has a row without an ad id")
    raise SpendInputError(first_unrepresentable(rows) or f"the read is malformed: {failure}")


def _rows_of(table: pa.Table) -> list[InsightRow]:
    """The spend columns as `InsightRow`s, to word a refusal."""
    columns = [table[field.name].to_pylist() for field in SPEND_COLUMNS]
    return list(map(InsightRow, *columns))


def _first_unrepresentable(table: pa.Table, given: Sequence[InsightRow] | None) -> str | None:
    """The refusal naming the first row that does not fit, from the rows as given if any."""
    return first_unrepresentable(_rows_of(table) if given is None else given)


def _first_duplicate(table: pa.Table) -> str:
    seen: set[tuple[str, date]] = set()
    for ad_id, day in zip(table["ad_id"].to_pylist(), table["day"].to_pylist(), strict=True):
        if (ad_id, day) in seen:
            return f"ad {ad_id} on {day.isoformat()}"
        seen.add((ad_id, day))
    return "unknown"


@dataclass(frozen=True)
class SpendWrite:
    """One account's read, for `write_spend_many`; the fields are `write_spend`'s."""

    ad_account_id: str
    days: Collection[date]
    rows: pa.Table | Sequence[InsightRow]
    complete_days: Collection[date]


def write_spend_many(
    con: duckdb.DuckDBPyConnection, writes: Sequence[SpendWrite], *, synced_at: datetime
) -> list[SpendWriteResult | SpendInputError | AccountNotLinked]:
    """`write_spend` for several accounts at once: one transaction, one set of statements.

    A live wave writes a few dozen rows for each of hundreds of accounts; a
    statement costs about as much for one account as for fifty, so a batch
    costs a fraction of writing them one by one. The answer is per write, in
    order: a refused read gets its error and nothing of it is written, while
    the others are. Should the batch fail as a whole (a site-day whose sums
    overflow), each write is retried on its own so the failure stays with
    its account.
    """
    if synced_at.tzinfo is None:
        raise SpendInputError("synced_at must be an aware datetime")
    answers: list[SpendWriteResult | SpendInputError | AccountNotLinked | None] = [None] * len(
        writes
    )
    accounts = [write.ad_account_id for write in writes]
    if len(set(accounts)) < len(accounts):
        # The same account twice would match its own rows twice: write one at a time.
        return [_write_alone(con, write, synced_at) for write in writes]
    batch: dict[str, tuple[int, list[date], list[date], pa.Table]] = {}
    for index, write in enumerate(writes):
        day_list, complete_list = sorted(set(write.days)), sorted(set(write.complete_days))
        if not day_list:
            answers[index] = SpendWriteResult(0, 0, 0, {})
            continue
        try:
            table = _incoming_table(day_list, complete_list, write.rows)
        except SpendInputError as exc:
            answers[index] = exc
            continue
        batch[write.ad_account_id] = (index, day_list, complete_list, table)
    if batch:
        try:
            with transaction(con):
                for account, outcome in _write_batch(con, batch, synced_at).items():
                    answers[batch[account][0]] = outcome
        except SpendInputError:
            for index, *_ in batch.values():
                answers[index] = _write_alone(con, writes[index], synced_at)
    return answers  # type: ignore[return-value]


def _write_alone(
    con: duckdb.DuckDBPyConnection, write: SpendWrite, synced_at: datetime
) -> SpendWriteResult | SpendInputError | AccountNotLinked:
    try:
        return write_spend(
            con,
            write.ad_account_id,
            days=write.days,
            rows=write.rows,
            complete_days=write.complete_days,
            synced_at=synced_at,
        )
    except (SpendInputError, AccountNotLinked) as exc:
        return exc


def _write_batch(
    con: duckdb.DuckDBPyConnection,
    batch: dict[str, tuple[int, list[date], list[date], pa.Table]],
    synced_at: datetime,
) -> dict[str, SpendWriteResult | SpendInputError | AccountNotLinked]:
    """The batch's statements, inside the caller's transaction."""
    answers: dict[str, SpendWriteResult | SpendInputError | AccountNotLinked] = {}
    incoming, scope = _batch_tables(batch)
    register_arrow(con, _INCOMING, incoming)
    register_arrow(con, "spend_scope", scope)
    try:
        checks = con.execute(_BATCH_CHECKS).fetchall()
        refused = set()
        for account, sites, repeated in checks:
            if repeated:
                table = batch[account][3]
                answers[account] = SpendInputError(
                    f"the read repeats an ad-day: {_first_duplicate(table)}"
                )
                refused.add(account)
            elif not sites:
                answers[account] = AccountNotLinked(
                    f"{account} is not linked to any site (any more): nothing written"
                )
                refused.add(account)
        if refused:
            batch = {account: item for account, item in batch.items() if account not in refused}
            if not batch:
                return answers
            incoming, scope = _batch_tables(batch)
            con.unregister(_INCOMING)
            con.unregister("spend_scope")
            register_arrow(con, _INCOMING, incoming)
            register_arrow(con, "spend_scope", scope)
        first_day = min(item[1][0] for item in batch.values())
        last_day = max(item[1][-1] for item in batch.values())
        params = {"accounts": sorted(batch), "first": first_day, "last": last_day}
        con.execute(_BATCH_CHANGES, params)
        try:
            counts: dict[str, dict[str, int]] = {account: {} for account in batch}
            for account, change, count in con.execute(
                "SELECT ad_account_id, change, count(*) FROM spend_changes GROUP BY ALL"
            ).fetchall():
                counts[account][change] = int(count)
            totals = {change: sum(c.get(change, 0) for c in counts.values())
                      for change in ("new", "changed", "same", "gone")}
            if totals["gone"]:
                con.execute(
                    "DELETE FROM ad_spend_daily"
                    " WHERE rowid IN (SELECT rid FROM spend_changes WHERE change = 'gone')"
                )
            if totals["changed"] or totals["same"]:
                # Unchanged rows get their own figures back: one statement for both.
                con.execute(
                    """
                    UPDATE ad_spend_daily SET
                        spend = c.spend, impressions = c.impressions, clicks = c.clicks,
                        conversations = c.conversations, synced_at = $synced_at
                    FROM spend_changes c
                    WHERE ad_spend_daily.rowid = c.rid AND c.change IN ('changed', 'same')
                    """,
                    {"synced_at": synced_at},
                )
            if totals["new"]:
                con.execute(
                    """
                    INSERT INTO ad_spend_daily (ad_account_id, ad_id, day, spend, impressions,
                                                clicks, conversations, synced_at)
                    SELECT ad_account_id, ad_id, day, spend, impressions, clicks, conversations,
                           $synced_at
                    FROM spend_changes WHERE change = 'new'
                    """,
                    {"synced_at": synced_at},
                )
        finally:
            with suppress(duckdb.TransactionException):  # an aborted transaction drops it
                con.execute("DROP TABLE IF EXISTS spend_changes")
        summaries = _replace_batch_site_spend(con, params)
    finally:
        # After a failed statement the transaction is aborted and DuckDB refuses even
        # this; the rollback that follows drops the views with it.
        with suppress(duckdb.TransactionException):
            con.unregister(_INCOMING)
            con.unregister("spend_scope")
    for account, (_, day_list, _, _) in batch.items():
        found = summaries.get(account, {})
        account_counts = counts[account]
        answers[account] = SpendWriteResult(
            rows_written=account_counts.get("new", 0) + account_counts.get("changed", 0),
            rows_deleted=account_counts.get("gone", 0),
            rows_unchanged=account_counts.get("same", 0),
            days={day: found.get(day, DaySummary(ZERO_SPEND, 0)) for day in day_list},
        )
    return answers


def _batch_tables(
    batch: dict[str, tuple[int, list[date], list[date], pa.Table]],
) -> tuple[pa.Table, pa.Table]:
    """The batch's rows with their account, and its (account, day, complete) scope."""
    parts, scope_accounts, scope_days, scope_complete = [], [], [], []
    for account, (_, day_list, complete_list, table) in batch.items():
        parts.append(
            table.add_column(0, "ad_account_id", pa.array([account] * table.num_rows, pa.string()))
        )
        complete = set(complete_list)
        for day in day_list:
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
    return pa.concat_tables(parts), scope


_BATCH_CHECKS = """
    SELECT a.ad_account_id,
           (SELECT list(l.site_id ORDER BY l.site_id) FROM site_ad_accounts l
            WHERE l.ad_account_id = a.ad_account_id),
           (SELECT count(*) FROM (
               SELECT 1 FROM incoming_spend i WHERE i.ad_account_id = a.ad_account_id
               GROUP BY i.ad_id, i.day HAVING count(*) > 1))
    FROM (SELECT DISTINCT ad_account_id FROM spend_scope) a
"""

# As `_CHANGES`, for many accounts: stored rows are those of the scope's
# account-days; the account list and day bounds let DuckDB skip row groups.
_BATCH_CHANGES = f"""
    CREATE OR REPLACE TEMP TABLE spend_changes AS
    SELECT coalesce(i.ad_account_id, d.ad_account_id) AS ad_account_id,
           i.ad_id, i.day, i.spend, i.impressions, i.clicks, i.conversations, d.rid,
           {_CHANGE} AS change
    FROM incoming_spend i
    FULL JOIN (
        SELECT s.rowid AS rid, s.ad_account_id, s.ad_id, s.day, s.spend, s.impressions,
               s.clicks, s.conversations, scope.complete
        FROM ad_spend_daily s
        JOIN spend_scope scope USING (ad_account_id, day)
        WHERE list_contains($accounts::VARCHAR[], s.ad_account_id)
          AND s.day BETWEEN $first AND $last
    ) d ON d.ad_account_id = i.ad_account_id AND d.ad_id = i.ad_id AND d.day = i.day
    WHERE i.ad_id IS NOT NULL OR d.complete
"""


def _replace_batch_site_spend(
    con: duckdb.DuckDBPyConnection, params: dict[str, object]
) -> dict[str, dict[date, DaySummary]]:
    """`_replace_site_spend` for every account-day of the scope; per account, the day totals."""
    con.execute(
        """
        DELETE FROM site_spend_daily USING spend_scope s
        WHERE site_spend_daily.ad_account_id = s.ad_account_id AND site_spend_daily.day = s.day
          AND list_contains($accounts::VARCHAR[], site_spend_daily.ad_account_id)
          AND site_spend_daily.day BETWEEN $first AND $last
        """,
        params,
    )
    inserted = _insert_site_sums(
        con,
        f"""
            INSERT INTO site_spend_daily (site_id, ad_account_id, day, spend, impressions,
                                          clicks, conversations, ad_rows)
            SELECT l.site_id, sums.*
            FROM (
                SELECT {_SITE_SUMS}
                FROM ad_spend_daily
                JOIN spend_scope USING (ad_account_id, day)
                WHERE list_contains($accounts::VARCHAR[], ad_account_id)
                  AND day BETWEEN $first AND $last
                GROUP BY ad_account_id, day
            ) sums
            JOIN site_ad_accounts l USING (ad_account_id)
            RETURNING site_id, ad_account_id, day, spend, ad_rows
            """,
        params,
    )
    first_site: dict[str, str] = {}
    for site_id, account, _, _, _ in inserted:
        if site_id < first_site.get(account, "\uffff"):
            first_site[account] = site_id
    summaries: dict[str, dict[date, DaySummary]] = {}
    for site_id, account, day, spend, ad_rows in inserted:
        if site_id == first_site[account]:
            summaries.setdefault(account, {})[day] = DaySummary(spend, int(ad_rows))
    return summaries

"""What the snapshot's publisher reads from a PostgreSQL warehouse: Arrow tables over ADBC.

DuckDB cannot attach a PostgreSQL database here, so a publish from PostgreSQL reads what it
needs as Arrow (`adbc_driver_postgresql`, which reads with binary `COPY`) and writes it into
the local staging file itself (`rastro_assets.analytics.staging_pg`). Every statement that
publish sends to the warehouse is in this module.

All reads of one publish share one `REPEATABLE READ` transaction: the runs, the rows and the
fingerprint the publish records are one consistent state of the warehouse, however many
syncs commit meanwhile. Nothing is written, and the connection keeps no session state.

ADBC hands `numeric` over as text; every money column becomes an exact Arrow
`decimal128` of the column's own precision and scale here, never a float.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import adbc_driver_manager
import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
import pyarrow.compute as pc

from rastro_assets.analytics.tables import COPIED_COLUMNS, TOTALS_COMPARED
from rastro_assets.warehouse.postgres import redacted

FINGERPRINT = """
    SELECT md5(concat_ws('|',
        (SELECT concat_ws(',', count(*), count(finished_at), extract(epoch FROM max(started_at)),
                          extract(epoch FROM max(finished_at)))
           FROM meta_sync_runs),
        (SELECT concat_ws(',', count(*), extract(epoch FROM max(linked_at)))
           FROM site_ad_accounts),
        (SELECT concat_ws(',', count(*), extract(epoch FROM max(created_at)),
                          extract(epoch FROM max(sync_requested_at)))
           FROM meta_ad_accounts),
        (SELECT concat_ws(',', count(*), extract(epoch FROM max(created_at)),
                          md5(string_agg(site_id || '|' || coalesce(name, ''), ','
                                         ORDER BY site_id)))
           FROM sites),
        (SELECT concat_ws(',', count(*), extract(epoch FROM max(updated_at)),
                          extract(epoch FROM max(invalid_since)))
           FROM meta_connections),
        (SELECT concat_ws(',', count(*), extract(epoch FROM max(updated_at))) FROM ad_catalog),
        (SELECT concat_ws(',', count(*), extract(epoch FROM max(fetched_at))) FROM ad_thumbnails)
    ))
"""
"""The PostgreSQL twin of `staging.fingerprint`'s digest. Times enter as epoch seconds, so
the digest is the same whatever time zone the session that computes it is in."""

RUN_COLUMNS = "run_id, ad_account_id, since, until, finished_at, outcome"

_NUMERIC = "numeric"
_SPEND_TABLES = ("ad_spend_daily", "site_spend_daily")


class SourceFailed(Exception):
    """Reading the PostgreSQL warehouse failed; the message names it without its password."""


class PostgresReader:
    """One read-only transaction on the warehouse at `url`, for the body of `open_reader`."""

    def __init__(self, connection: Any, url: str) -> None:
        self._connection = connection
        self._cursor = connection.cursor()
        self._url = url

    def fingerprint(self) -> str:
        return self._scalar(FINGERPRINT)

    def runs(self, finished_after: datetime | None) -> pa.Table:
        """`meta_sync_runs` rows still running or finished at or after `finished_after`
        (all of them when None)."""
        if finished_after is None:
            return self._table(f"SELECT {RUN_COLUMNS} FROM meta_sync_runs")
        return self._table(
            f"SELECT {RUN_COLUMNS} FROM meta_sync_runs"
            " WHERE finished_at IS NULL OR finished_at >= $1",
            [finished_after],
        )

    def latest_finish(self) -> datetime | None:
        return self._table("SELECT max(finished_at) AS m FROM meta_sync_runs").column(0)[
            0
        ].as_py()

    def whole(self, table: str) -> pa.Table:
        """Every row of an analyst table, its copied columns."""
        return self._table(f"SELECT {COPIED_COLUMNS[table]} FROM {table}")

    def stream(self, table: str) -> pa.RecordBatchReader:
        """Every row of an analyst table, as batches: the full rebuild never holds a big
        table whole in memory."""
        self._execute(f"SELECT {COPIED_COLUMNS[table]} FROM {table}")
        return _exact_batches(self._cursor.fetch_record_batch())

    def thumbnail_versions(self) -> pa.Table:
        """What tells one stored image from another, without its bytes."""
        return self._table("SELECT ad_id, sha256, content_type, fetched_at FROM ad_thumbnails")

    def rows_of_keys(self, table: str, key: str, values: Sequence[str]) -> pa.Table:
        """The rows of `table` whose single-column `key` is one of `values`."""
        return self._table(
            f"SELECT {COPIED_COLUMNS[table]} FROM {table} WHERE {key} = ANY($1::text[])",
            [_text_array(values)],
        )

    def spend_of_days(
        self,
        table: str,
        accounts: Sequence[str],
        days: Sequence[date],
        *,
        leaving_out: Sequence[str] = (),
    ) -> pa.Table:
        """The rows of a spend table on the given account-days (pairs, in step), except
        those of the accounts in `leaving_out`."""
        low, high = min(days), max(days)
        return self._table(
            f"""SELECT {_qualified(COPIED_COLUMNS[table], "t")}
                FROM {table} t
                JOIN unnest($1::text[], $2::date[]) AS c(ad_account_id, day)
                  ON t.ad_account_id = c.ad_account_id AND t.day = c.day
                WHERE t.day BETWEEN $3 AND $4 AND NOT t.ad_account_id = ANY($5::text[])""",
            [_text_array(accounts), _text_array(map(str, days)), low, high,
             _text_array(leaving_out)],
        )

    def site_spend_of_links(self, sites: Sequence[str], accounts: Sequence[str]) -> pa.Table:
        """Every day of the site sums of the given site-account pairs (in step)."""
        return self._table(
            f"""SELECT {_qualified(COPIED_COLUMNS["site_spend_daily"], "t")}
                FROM site_spend_daily t
                JOIN unnest($1::text[], $2::text[]) AS l(site_id, ad_account_id)
                  ON t.site_id = l.site_id AND t.ad_account_id = l.ad_account_id""",
            [_text_array(sites), _text_array(accounts)],
        )

    def totals(self, table: str) -> tuple:
        """`TOTALS_COMPARED` for `table`, each figure as an exact `Decimal` (None if null)."""
        [row] = _rows(self._table(f"SELECT {TOTALS_COMPARED[table]} FROM {table}"))
        return comparable(row)

    def account_totals(self, table: str) -> dict[str, tuple]:
        """`TOTALS_COMPARED` for a spend table, per account."""
        rows = _rows(
            self._table(
                f"SELECT ad_account_id, {TOTALS_COMPARED[table]} FROM {table}"
                " GROUP BY ad_account_id"
            )
        )
        return {account: comparable(figures) for account, *figures in rows}

    def _scalar(self, statement: str) -> Any:
        return self._table(statement).column(0)[0].as_py()

    def _table(self, statement: str, parameters: Sequence[Any] | None = None) -> pa.Table:
        self._execute(statement, parameters)
        try:
            table = self._cursor.fetch_arrow_table()
        except adbc_driver_manager.Error as exc:
            raise SourceFailed(_message(exc, self._url)) from None
        return _exact(table)

    def _execute(self, statement: str, parameters: Sequence[Any] | None = None) -> None:
        try:
            self._cursor.execute(statement, parameters)
        except adbc_driver_manager.Error as exc:
            raise SourceFailed(_message(exc, self._url)) from None


@contextmanager
def open_reader(url: str) -> Iterator[PostgresReader]:
    """A reader on the warehouse at `url`, in one read-only snapshot of it."""
    try:
        connection = adbc.connect(url)
    except adbc_driver_manager.Error as exc:
        raise SourceFailed(_message(exc, url)) from None
    try:
        reader = PostgresReader(connection, url)
        reader._execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield reader
    finally:
        with suppress(adbc_driver_manager.Error):
            connection.rollback()
        with suppress(adbc_driver_manager.Error):
            connection.close()


def comparable(values: Sequence[Any] | Any) -> tuple:
    """Totals from either engine as exact Decimals, so `12.5` and `12.5000` agree."""
    return tuple(None if value is None else Decimal(str(value)) for value in values)


def _rows(table: pa.Table) -> list[tuple]:
    """The rows as tuples: the totals' columns share names, so no dict would do."""
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


def _message(exc: BaseException, url: str) -> str:
    """The driver's words with the password and the full URL taken out, on one line."""
    text = " ".join(str(exc).split())
    password = urlsplit(url).password
    for secret in filter(None, (url, password)):
        text = text.replace(secret, redacted(url) if secret == url else "***")
    return f"reading the warehouse {redacted(url)} failed: {text}"


def _text_array(values: Sequence[str] | Iterator[str]) -> str:
    """A PostgreSQL array literal: every element quoted, so no value is read as syntax."""
    quoted = (
        '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values
    )
    return "{" + ",".join(quoted) + "}"


def _qualified(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


def _exact(table: pa.Table) -> pa.Table:
    if not any(_is_numeric(field) for field in table.schema):
        return table
    return pa.Table.from_batches(
        [_exact_batch(batch) for batch in table.to_batches()], schema=_exact_schema(table.schema)
    )


def _exact_batches(reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
    schema = _exact_schema(reader.schema)
    return pa.RecordBatchReader.from_batches(schema, (_exact_batch(b) for b in reader))


def _exact_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            pa.field(field.name, _decimal_of(field), nullable=True) if _is_numeric(field)
            else field
            for field in schema
        ]
    )


def _exact_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if _is_numeric(field):
            # The text of each value, parsed into the column's own decimal: exact.
            column = pc.cast(column.storage, _decimal_of(field))
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=_exact_schema(batch.schema))


def _is_numeric(field: pa.Field) -> bool:
    return (field.metadata or {}).get(b"POSTGRESQL:type") == _NUMERIC.encode()


def _decimal_of(field: pa.Field) -> pa.DataType:
    """`numeric(p, s)` as Arrow's decimal128(p, s); an unconstrained numeric (a sum) as
    decimal128(38, 4), which holds every total of four-place amounts and counts."""
    typmod = int((field.metadata or {}).get(b"POSTGRESQL:typmod", b"-1"))
    if typmod < 4:
        return pa.decimal128(38, 4)
    packed = typmod - 4
    return pa.decimal128(packed >> 16, packed & 0xFFFF)

"""Copying the DuckDB warehouse into a PostgreSQL one: every table, exactly, all or nothing.

Every table the migrations make (not `schema_version`, which each side keeps for itself) is
read from DuckDB as Arrow batches and written with `COPY`, all in one transaction on the
target. The target's tables are locked first, so nothing writes into them meanwhile; the copy
is counted and summed on both sides before the commit, and a difference rolls it all back.
A copy that fails or is killed leaves the target as it was, so running it again is enough.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from decimal import Decimal

import duckdb
import pyarrow as pa
from psycopg import sql

from rastro_assets.warehouse import schema
from rastro_assets.warehouse.postgres import PostgresConnection, copy_into

BATCH_ROWS = 50_000
"""Rows read from DuckDB at a time: the copy's memory stays flat whatever the table's size."""

KEPT_BY_EACH_SIDE = frozenset({"schema_version"})
"""Tables not copied: each warehouse records the migrations it applied itself."""

_SUMMED_TYPES = ("DECIMAL", "BIGINT", "INTEGER", "SMALLINT", "HUGEINT")
"""Column types whose sums are exact on both engines; a float's sum depends on row order."""
_MEASURED_TYPES = ("BLOB",)
"""Column types whose bytes are counted (`octet_length`), pictures above all."""


@dataclass(frozen=True)
class CopiedTable:
    """A table to copy: its name and columns, and which of them the tally sums."""

    name: str
    columns: tuple[str, ...]
    summed: tuple[str, ...]
    measured: tuple[str, ...]


@dataclass(frozen=True)
class Tally:
    """What one side holds in one table: its rows, the exact columns' sums, the blobs' bytes."""

    table: str
    rows: int
    sums: tuple[tuple[str, Decimal | int | None], ...]

    def same_as(self, other: Tally) -> bool:
        return self.rows == other.rows and _normal(self.sums) == _normal(other.sums)


class TargetNotEmpty(Exception):
    """The target already holds rows, and replacing them was not asked for."""

    def __init__(self, tables: list[str]) -> None:
        self.tables = tables
        super().__init__(", ".join(tables))


class CopyMismatch(Exception):
    """A copied table's count or sums differ from its source's: the copy was rolled back."""

    def __init__(self, source: Tally, target: Tally) -> None:
        self.source, self.target = source, target
        super().__init__(
            f"{source.table} differs after the copy: the source has {_said(source)}, the"
            f" target {_said(target)}"
        )


class SchemaBehind(Exception):
    """One side's schema is not the version this code writes."""


def copied_tables() -> list[CopiedTable]:
    """Every table of the schema, in name order, as the migrations make it."""
    tables = []
    for name, columns in sorted(schema.table_columns().items()):
        if name in KEPT_BY_EACH_SIDE:
            continue
        tables.append(
            CopiedTable(
                name=name,
                columns=tuple(column for column, _, _ in columns),
                summed=tuple(c for c, kind, _ in columns if kind.startswith(_SUMMED_TYPES)),
                measured=tuple(c for c, kind, _ in columns if kind in _MEASURED_TYPES),
            )
        )
    return tables


def copy_warehouse(
    source: duckdb.DuckDBPyConnection,
    target: PostgresConnection,
    *,
    replace: bool,
    on_table: Callable[[Tally], None] = lambda tally: None,
) -> list[Tally]:
    """Copy every table of `source` into `target` in one transaction; each table's tally.

    `TargetNotEmpty` when the target holds any row and `replace` is false; with `replace`,
    the target's rows are deleted in the same transaction, so they are gone only if the copy
    commits. `on_table` hears each table once it is copied and checked, before the commit.
    """
    _check_versions(source, target)
    tables = copied_tables()
    names = sql.SQL(", ").join(sql.Identifier(table.name) for table in tables)
    raw = target.raw
    raw.execute("BEGIN")
    try:
        # Taken before looking: a writer that starts meanwhile waits for the commit.
        raw.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(names))
        occupied = [table.name for table in tables if _has_rows(target, table.name)]
        if occupied and not replace:
            raise TargetNotEmpty(occupied)
        if occupied:
            raw.execute(sql.SQL("TRUNCATE {}").format(names))
        tallies = []
        for table in tables:
            _copy_table(source, target, table)
            expected, found = tally(source, table), tally(target, table)
            if not expected.same_as(found):
                raise CopyMismatch(expected, found)
            tallies.append(found)
            on_table(found)
        raw.execute("COMMIT")
    except BaseException:
        with suppress(Exception):
            raw.execute("ROLLBACK")
        raise
    return tallies


def tally(con: object, table: CopiedTable) -> Tally:
    """Count `table`'s rows, sum its exact columns and its blobs' bytes, on either engine."""
    parts = ["count(*)"]
    parts += [f'sum("{column}")' for column in table.summed]
    parts += [f'sum(octet_length("{column}"))' for column in table.measured]
    row = con.execute(f'SELECT {", ".join(parts)} FROM "{table.name}"').fetchone()
    labels = [*table.summed, *(f"{c} bytes" for c in table.measured)]
    return Tally(table.name, int(row[0]), tuple(zip(labels, row[1:], strict=True)))


def _check_versions(source: duckdb.DuckDBPyConnection, target: PostgresConnection) -> None:
    for side, con in (("source", source), ("target", target)):
        version = schema.current_version(con)
        if version != schema.LATEST_VERSION:
            raise SchemaBehind(
                f"the {side}'s schema is at version {version}, this release's at"
                f" {schema.LATEST_VERSION}"
            )


def _has_rows(target: PostgresConnection, table: str) -> bool:
    statement = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(table))
    return bool(target.raw.execute(statement).fetchone()[0])


def _copy_table(
    source: duckdb.DuckDBPyConnection, target: PostgresConnection, table: CopiedTable
) -> None:
    columns = ", ".join(f'"{column}"' for column in table.columns)
    # DuckDB refuses a new statement while an earlier result is half-read.
    source.complete()
    for batch in source.sql(f'SELECT {columns} FROM "{table.name}"').to_arrow_reader(BATCH_ROWS):
        if batch.num_rows:
            copy_into(target.raw, table.name, pa.Table.from_batches([batch]))


def _normal(sums: tuple[tuple[str, Decimal | int | None], ...]) -> tuple:
    # DuckDB sums integers to an int, PostgreSQL to a numeric: the same number either way.
    return tuple((label, None if value is None else Decimal(value)) for label, value in sums)


def _said(tally: Tally) -> str:
    sums = ", ".join(f"{label} {value}" for label, value in tally.sums)
    return f"{tally.rows} rows" + (f" ({sums})" if sums else "")


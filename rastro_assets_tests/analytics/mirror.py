"""The same world in a PostgreSQL warehouse as in a DuckDB one: every table copied, row for
row, so a snapshot published from each can be compared value for value."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
from psycopg import errors as pg_errors

from rastro_assets.analytics import publish
from rastro_assets.analytics.tables import ANALYST_TABLES
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse, copy_into

# The migrations' own bookkeeping is each engine's; everything else is the world.
SKIPPED = {"schema_version"}


def mirror(source: Warehouse, target: PostgresWarehouse) -> None:
    """Replace every table of `target` with `source`'s rows (columns matched by name)."""
    with source.connect(read_only=True) as duck:
        tables = [
            name
            for (name,) in duck.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'"
                " AND database_name = current_database() ORDER BY 1"
            ).fetchall()
            if name not in SKIPPED
        ]
        rows = {
            name: duck.sql(f"SELECT * FROM {name}").to_arrow_table() for name in tables
        }
    with target.connect() as pg:
        for name, table in rows.items():
            pg.execute(f"DELETE FROM {name}")
            if table.num_rows:
                copy_into(pg.raw, name, table)


def snapshot_tables(path: Path) -> dict[str, tuple[list, list]]:
    """Each analyst table of the snapshot at `path`: its columns with their types, and its
    rows sorted, exactly as DuckDB returns them (Decimal, datetime, bytes)."""
    with duckdb.connect(str(path), read_only=True) as snap:
        return {
            table: (
                snap.execute(f"DESCRIBE {table}").fetchall(),
                sorted(snap.execute(f"SELECT * FROM {table}").fetchall(), key=repr),
            )
            for table in ANALYST_TABLES
        }


@contextmanager
def planner_on(twin: Warehouse) -> Iterator[None]:
    """The planner's reads, for a publisher on PostgreSQL, while they are not portable yet:
    the account states come from `twin`, the DuckDB warehouse holding the same world.
    Once the planner runs on PostgreSQL, its own answer is used and this changes nothing."""
    real = publish.planned_accounts

    def planned(con, *args, **kwargs):
        try:
            return real(con, *args, **kwargs)
        except (pg_errors.SyntaxError, pg_errors.UndefinedFunction):
            with twin.connect(read_only=True) as duck:
                return real(duck, *args, **kwargs)

    publish.planned_accounts = planned
    try:
        yield
    finally:
        publish.planned_accounts = real

"""Which warehouse the settings name: the DuckDB file, or a PostgreSQL database.

Everything outside `warehouse/` (and the snapshot's publisher) asks for "the warehouse"
here and never learns which engine answered.
"""

from __future__ import annotations

from typing import Any

from rastro_assets.process_settings import Settings
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse

AnyWarehouse = Warehouse | PostgresWarehouse

_POOLS: dict[str, PostgresWarehouse] = {}


def open_warehouse(
    settings: Settings, *, require_path: bool = False, **options: Any
) -> AnyWarehouse:
    """The warehouse of `settings`: RASTRO_WAREHOUSE_URL's database when set, else the file.

    `require_path`: refuse a DuckDB path that is only a guess (`Settings.require_duckdb_path`).
    One PostgreSQL warehouse, and so one pool, per URL in a process.
    """
    if settings.warehouse_url:
        found = _POOLS.get(settings.warehouse_url)
        if found is None:
            found = PostgresWarehouse(settings.warehouse_url, snapshot_path=settings.snapshot_path)
            _POOLS[settings.warehouse_url] = found
        return found
    path = settings.require_duckdb_path() if require_path else settings.duckdb_path
    return Warehouse(path, snapshot_path=settings.snapshot_path, **options)

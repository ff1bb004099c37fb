"""The DuckDB warehouse: schema and migrations, connections, and every statement on its
tables (the registry, the writers, and the reads the planner, the syncs and the CLI ask)."""

from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked, transaction

__all__ = ["Warehouse", "WarehouseLocked", "transaction"]

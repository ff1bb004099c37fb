"""The DuckDB warehouse: schema and migrations, connections, registry and writers."""

from rastro_assets.warehouse.connection import Warehouse, WarehouseLocked, transaction

__all__ = ["Warehouse", "WarehouseLocked", "transaction"]

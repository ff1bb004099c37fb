"""The `warehouse` fixture's warehouse is not migrated statement by statement (a DuckDB file is a
copy of one migrated once; a PostgreSQL schema runs the migrations as one text): it holds
exactly what migrating an empty warehouse makes, tables, keys, indexes and recorded versions."""

from __future__ import annotations

from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse

DESCRIBED_BY = {
    "duckdb": {
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_schema = current_schema()"
        " ORDER BY table_name, ordinal_position",
        "indexes": "SELECT table_name, index_name, sql FROM duckdb_indexes()"
        " WHERE schema_name = current_schema() ORDER BY ALL",
        "constraints": "SELECT table_name, constraint_type, constraint_text"
        " FROM duckdb_constraints() WHERE schema_name = current_schema() ORDER BY ALL",
    },
    "postgres": {
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_schema = current_schema()"
        " ORDER BY table_name, ordinal_position",
        "indexes": "SELECT tablename, indexname, replace(indexdef, current_schema() || '.', '')"
        " FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1, 2",
        "constraints": "SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid)"
        " FROM pg_constraint WHERE connamespace = current_schema()::regnamespace"
        " ORDER BY 1, 2, 3",
    },
}


def described(warehouse) -> dict[str, list[tuple]]:
    with warehouse.connect() as con:
        found = {
            what: [tuple(row) for row in con.execute(query).fetchall()]
            for what, query in DESCRIBED_BY[warehouse.engine].items()
        }
        found["versions"] = con.execute(
            "SELECT version, description FROM schema_version ORDER BY version"
        ).fetchall()
    return found


def test_a_tests_warehouse_is_what_migrating_an_empty_one_makes(
    warehouse, engine, tmp_path, request
):
    if engine == "postgres":
        server = request.getfixturevalue("warehouse_server")
        migrated = PostgresWarehouse(server.fresh_schema_url())
    else:
        migrated = Warehouse(tmp_path / "migrated" / "rastro.duckdb")
    migrated.migrate()
    try:
        expected = described(migrated)
        assert expected["columns"] and expected["indexes"] and expected["constraints"]
        assert described(warehouse) == expected
    finally:
        if engine == "postgres":
            migrated.close()

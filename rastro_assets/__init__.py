"""rastro_assets: Meta ad spend, catalog and thumbnails kept in DuckDB by Dagster."""

"""The Dagster skin over the pure core, by domain (spend, catalog, analytics, cadence) over
shared keys, partitions, resources and metadata."""

"""The Dagster skin over the pure core: partitions, resources, assets, checks, sensors, jobs."""

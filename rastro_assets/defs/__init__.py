"""The Dagster skin over the pure core, by domain (spend, catalog, analytics, cadence) over
shared keys, partitions, resources and metadata."""

from rastro_assets.instance.moved import keep_old_paths

# The instance plug-ins lived here; a `dagster.yaml` written then still names this package.
keep_old_paths()

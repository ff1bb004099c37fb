"""The Dagster skin over the pure core, by domain (spend, catalog, analytics, cadence) over
shared keys, partitions, resources and metadata.

A domain offers its definitions by convention, and `definitions.py` finds them: any module
here, at any depth, may define
- `shard_defs(shard, shard_count) -> dg.Definitions`: what each shard has (shard 0 under
  the names an install of one shard has always had, `shards.named`), built again for every
  shard of the location;
- `location_defs(shard_count) -> dg.Definitions`: what the location has once (a sensor over
  every shard, the catalog, the snapshot).
A module dropped here with either is merged into the code location as it is. No definition
is built when a module is imported: the shard count is an argument, never a module constant.
"""

from rastro_assets.instance.moved import keep_old_paths

# The instance plug-ins lived here; a `dagster.yaml` written then still names this package.
keep_old_paths()

"""What the Dagster instance loads from us, and what the `rastro` command asks of it.

The plug-ins a `dagster.yaml` names (the run queue, the run launcher, the pooled Postgres
storage, the backfill daemon's log filter), the webserver `rastro webserver` serves, and the
helpers that add, move and place accounts' partitions from outside a run. None of this is a
definition: the code location (`defs/`) imports none of it but the loader of the old
paths (`moved.py`), and the daemon loads it without loading the definitions.
"""

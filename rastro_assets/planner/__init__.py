"""The planner: what each linked ad account reads from Meta next, and when.

Pure rules over an injected instant, and the history they read. The rows of
`meta_sync_runs` are the planner's only state; the sensors, `rastro plan` and
`rastro status` ask the same questions of it.

- `state`: what the planner knows of an account (its runs, its connection, its
  recent delivery, for the idle rule).
- `marks`: the live, daily and weekly marks a run earns, each beside the SQL
  that over-approximates it.
- `cadence`: `plan` and `status`, the back-off and the freshness rule.
- `history`: loads an account's state from the warehouse, reduced to the rows
  the answers depend on.
- `retention`: prunes `meta_sync_runs` without changing an answer.

Imports nothing from Dagster: only `warehouse/`, `meta/` and the leaves lie below.
"""

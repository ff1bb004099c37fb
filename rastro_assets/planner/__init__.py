"""The planner: what each linked ad account reads from Meta next, and when.

Pure rules over an injected instant, and the history they read. The rows of
`meta_sync_runs` are the planner's only state; the sensors, `rastro plan` and
`rastro status` ask the same questions of it.

- `state`: what the planner knows of an account (its runs, its connection, its
  recent delivery, for the idle rule).
- `marks`: the live, daily and weekly marks a run earns (the warehouse
  over-approximates each to find candidates).
- `rules`: one rule per kind of read (backfill, gap, weekly, daily, live).
- `coverage`: which days good runs have read (backfill and gap progress).
- `backoff`: what holds the next sync back (a run in flight, failures, usage).
- `cadence`: `plan` and `status` from those, and the freshness rule.
- `instants`: the UTC instants the rules compare, and how reasons print waits.
- `history`: each account's state from what the warehouse read; `reduced` picks
  the rows the answers depend on, asking the warehouse's reads; `runs` turns rows
  into `SyncRun`s. The planner runs no SQL: the statements are `warehouse/`'s.

Imports nothing from Dagster: only `warehouse/`, `meta/` and the leaves lie below.
"""

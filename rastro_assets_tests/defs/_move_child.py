"""`rastro shard move` in a process the test SIGKILLs at a chosen point:
`python -m rastro_assets_tests.defs._move_child POINT`.

At POINT the child says `stopped POINT` on stdout and sleeps for good; the parent looks
at the instance, then kills it. POINT is one of:
- `event:N`: right after the Nth runless materialization is stored;
- `store:before` / `store:after`: around the warehouse's store of the new shard;
- `place:between`: once the account left its old shard's partitions, before it joins
  the new one's.
The environment names the warehouse, the instance and the shard count, as for `rastro`.
"""

from __future__ import annotations

import sys
import time


def _stop(point: str) -> None:
    print(f"stopped {point}", flush=True)
    time.sleep(600)


def main(point: str) -> int:
    import dagster as dg

    from rastro_assets import cli
    from rastro_assets.cli import shards as shard_cli

    kind, _, when = point.partition(":")
    if kind == "event":
        report = dg.DagsterInstance.report_runless_asset_event
        seen = [0]

        def counting(self, event):
            result = report(self, event)
            seen[0] += 1
            if seen[0] == int(when):
                _stop(point)
            return result

        dg.DagsterInstance.report_runless_asset_event = counting
    elif kind == "store":
        store = shard_cli._store_shard

        def stopping(*args, **kwargs):
            if when == "before":
                _stop(point)
            store(*args, **kwargs)
            _stop(point)

        shard_cli._store_shard = stopping
    elif kind == "place":
        add = dg.DagsterInstance.add_dynamic_partitions

        def stopping_add(self, name, keys):
            _stop(point)
            return add(self, name, keys)

        dg.DagsterInstance.add_dynamic_partitions = stopping_add
    code = cli.main(["shard", "move"])
    print(f"finished {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

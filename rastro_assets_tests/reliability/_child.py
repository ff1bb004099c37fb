"""Processes the reliability tests start, kill and race: `python -m ...reliability._child`.

- `sync`: sync an account against a Graph URL (the fake's loopback server),
  print the outcome as one JSON line.
- `stall`: sync in-process, but stop for good inside the writer's transaction,
  right after it deleted rows and before it inserts, saying so on stdout (the
  parent then SIGKILLs it).
- `hold`: an analyst's read-only DuckDB session: open, read, say "locked",
  keep the file for N seconds.

The secrets key comes from RASTRO_SECRETS_KEY, as in any run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date, datetime


def _sync(args: argparse.Namespace) -> int:
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.sync.syncer import Syncer
    from rastro_assets.sync.types import SyncRequest
    from rastro_assets.timekeeping import fixed_clock
    from rastro_assets.warehouse.connection import Warehouse

    def client(token: str) -> MetaClient:
        return MetaClient(token, base_url=args.graph, page_size=args.page_size,
                          sleep=lambda seconds: None)

    warehouse = Warehouse(args.db, lock_wait_seconds=args.lock_wait)
    syncer = Syncer(warehouse, client, clock=fixed_clock(datetime.fromisoformat(args.at)))
    print("ready", flush=True)
    sys.stdin.readline()  # the parent starts every racer at once
    started, wall_started = time.monotonic(), time.time()
    outcome = syncer.sync(SyncRequest(
        args.account, date.fromisoformat(args.since), date.fromisoformat(args.until),
        kind="manual", run_id=args.run_id,
    ))
    print(json.dumps({
        "outcome": outcome.outcome,
        "error": outcome.error,
        "complete_days": len(outcome.complete_days),
        "rows_written": outcome.rows_written,
        "seconds": round(time.monotonic() - started, 2),
        "wall": [wall_started, time.time()],
    }), flush=True)
    return 0


class _StallAfterDelete:
    """A DuckDB connection that never returns from its DELETE of ad rows."""

    def __init__(self, con) -> None:
        self._con = con

    def execute(self, query, *args, **kwargs):
        result = self._con.execute(query, *args, **kwargs)
        if " ".join(str(query).split()).startswith("DELETE FROM ad_spend_daily"):
            remaining = self._con.execute("SELECT count(*) FROM ad_spend_daily").fetchone()[0]
            print(f"in-transaction {remaining}", flush=True)
            time.sleep(600)
        return result

    def __getattr__(self, name):
        return getattr(self._con, name)


def _stall(args: argparse.Namespace) -> int:
    from rastro_assets.sync import spend_writer
    from rastro_assets.sync.syncer import Syncer
    from rastro_assets.sync.types import SyncRequest
    from rastro_assets.warehouse.connection import Warehouse
    from rastro_assets_tests.conftest import TOKEN
    from rastro_assets_tests.reliability.helpers import build_world, client_factory, perturb
    from rastro_fake_graph.world import MutableClock

    clock = MutableClock(datetime.fromisoformat(args.at))
    world = build_world(clock, TOKEN)
    since, until = date.fromisoformat(args.since), date.fromisoformat(args.until)
    perturb(world, args.account, since, until)
    real_write = spend_writer.write_spend_many

    def stalling_write(con, *write_args, **kwargs):
        return real_write(_StallAfterDelete(con), *write_args, **kwargs)

    spend_writer.write_spend_many = stalling_write
    syncer = Syncer(Warehouse(args.db), client_factory(world), clock=clock)
    outcome = syncer.sync(SyncRequest(args.account, since, until, kind="manual",
                                      run_id=args.run_id))
    print(f"finished {outcome.outcome}", flush=True)  # never reached: the parent kills us
    return 1


def _hold(args: argparse.Namespace) -> int:
    import duckdb

    con = duckdb.connect(args.db, read_only=True)
    rows = con.execute("SELECT count(*) FROM ad_spend_daily").fetchone()[0]
    print(f"locked {rows}", flush=True)
    time.sleep(args.seconds)
    con.execute("SELECT sum(spend) FROM site_spend_daily").fetchone()
    con.close()
    print("released", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    sync_cmd = commands.add_parser("sync")
    stall_cmd = commands.add_parser("stall")
    for command in (sync_cmd, stall_cmd):
        command.add_argument("--db", required=True)
        command.add_argument("--account", required=True)
        command.add_argument("--since", required=True)
        command.add_argument("--until", required=True)
        command.add_argument("--run-id", required=True)
        command.add_argument("--at", required=True)
    sync_cmd.add_argument("--graph", required=True)
    sync_cmd.add_argument("--page-size", type=int, default=25)
    sync_cmd.add_argument("--lock-wait", type=float, default=60.0)
    hold_cmd = commands.add_parser("hold")
    hold_cmd.add_argument("--db", required=True)
    hold_cmd.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    return {"sync": _sync, "stall": _stall, "hold": _hold}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

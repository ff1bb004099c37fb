"""Processes the reliability tests start, kill and race: `python -m ...reliability._child`.

- `sync`: sync an account against a Graph URL (the fake's loopback server),
  print the outcome as one JSON line.
- `stall`: sync in-process, but stop for good at one point of the spend write
  (`STALL_POINTS`), saying so on stdout (the parent then SIGKILLs it).
- `hold`: an analyst's read-only DuckDB session: open, read, say "locked",
  keep the file for N seconds.

The warehouse is the one the environment names (RASTRO_WAREHOUSE_URL, else
RASTRO_DUCKDB_PATH), and the secrets key comes from RASTRO_SECRETS_KEY, as in any run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date, datetime

STALL_POINTS = {
    "copy": "PostgreSQL only: inside the COPY of the read's rows to the server",
    "delete": "inside the transaction, after deleting the rows the read no longer has",
    "commit": "every statement done, COMMIT not yet sent",
    "commit-sent": "PostgreSQL only: COMMIT sent, its answer never read",
    "committed": "after COMMIT returned, before the run records its end",
}
INCOMING = "incoming_spend"  # the name the spend writer registers a read's rows under


def _open_warehouse(**duckdb_options):
    from rastro_assets.process_settings import Settings
    from rastro_assets.warehouse.engines import open_warehouse

    return open_warehouse(Settings.from_env(), **duckdb_options)


def _sync(args: argparse.Namespace) -> int:
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.sync.syncer import Syncer
    from rastro_assets.sync.types import SyncRequest
    from rastro_assets.timekeeping import fixed_clock

    def client(token: str) -> MetaClient:
        return MetaClient(token, base_url=args.graph, page_size=args.page_size,
                          sleep=lambda seconds: None)

    warehouse = _open_warehouse(lock_wait_seconds=args.lock_wait)
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


def _seen(con, account: str) -> str:
    """What `con`'s transaction sees of the account (rows, spend) and its server process."""
    rows, spend = con.execute(
        "SELECT count(*), coalesce(sum(spend), 0) FROM ad_spend_daily WHERE ad_account_id = ?",
        [account],
    ).fetchone()
    backend = 0
    if getattr(con, "engine", "duckdb") == "postgres":
        backend = con.execute("SELECT pg_backend_pid()").fetchone()[0]
    return f"{rows} {spend} {backend}"


def _stop(point: str, seen: str) -> None:
    """Say where we are, then never go on: the parent kills us here."""
    print(f"at {point} {seen}", flush=True)
    time.sleep(600)


class _Stalling:
    """A warehouse connection that stops for good at `point` of the spend write."""

    def __init__(self, con, point: str, account: str) -> None:
        self._con, self._point, self._account = con, point, account

    def execute(self, query, *args, **kwargs):
        text = " ".join(str(query).split())
        if text == "COMMIT" and self._point == "commit":
            _stop(self._point, _seen(self._con, self._account))
        if text == "COMMIT" and self._point == "commit-sent":
            seen = _seen(self._con, self._account)
            pgconn = self._con.raw.pgconn
            pgconn.send_query(b"COMMIT")
            while pgconn.flush():
                time.sleep(0.01)
            _stop(self._point, seen)
        result = self._con.execute(query, *args, **kwargs)
        if text.startswith("DELETE FROM ad_spend_daily") and self._point == "delete":
            _stop(self._point, _seen(self._con, self._account))
        if text == "COMMIT" and self._point == "committed":
            _stop(self._point, _seen(self._con, self._account))
        return result

    def __getattr__(self, name):
        return getattr(self._con, name)


def _stall_in_copy(account: str) -> None:
    """Make the COPY of a read's rows stop for good once its first row is sent."""
    from psycopg import sql

    from rastro_assets.warehouse import postgres

    real_copy = postgres.copy_into

    def stalling_copy(raw, table_name, table):
        if table_name != INCOMING or table.num_rows < 2:
            return real_copy(raw, table_name, table)
        seen = _seen(postgres.PostgresConnection(raw), account)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(table_name), sql.SQL(", ").join(map(sql.Identifier, table.schema.names))
        )
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            copy.write_row([column[0].as_py() for column in table.columns])
            _stop("copy", seen)
        return None

    postgres.copy_into = stalling_copy


def _stall(args: argparse.Namespace) -> int:
    from rastro_assets.sync import spend_write
    from rastro_assets.sync.syncer import Syncer
    from rastro_assets.sync.types import SyncRequest
    from rastro_assets_tests.conftest import TOKEN
    from rastro_assets_tests.reliability.helpers import build_world, client_factory, perturb
    from rastro_fake_graph.world import MutableClock

    clock = MutableClock(datetime.fromisoformat(args.at))
    world = build_world(clock, TOKEN)
    since, until = date.fromisoformat(args.since), date.fromisoformat(args.until)
    perturb(world, args.account, since, until)
    if args.point == "copy":
        _stall_in_copy(args.account)
    else:
        real_write = spend_write.write_spend_many

        def stalling_write(con, *write_args, **kwargs):
            return real_write(_Stalling(con, args.point, args.account), *write_args, **kwargs)

        spend_write.write_spend_many = stalling_write
    syncer = Syncer(_open_warehouse(), client_factory(world), clock=clock)
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
        command.add_argument("--account", required=True)
        command.add_argument("--since", required=True)
        command.add_argument("--until", required=True)
        command.add_argument("--run-id", required=True)
        command.add_argument("--at", required=True)
    stall_cmd.add_argument("--point", choices=sorted(STALL_POINTS), required=True)
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

"""Sensor tick: the cadence sensor's evaluation with 5,000 accounts and 90 days of history.

The warehouse holds 5,000 linked accounts (eight timezones, 50 connections, 2,500 sites) linked
90 days ago, each with the history the cadence leaves: the 90-day backfill (three 30-day runs
at linking), a live sync every 45 minutes (today and yesterday; about 1% failed, 0.5%
throttled), and the daily re-sync at 04:00 local (7 days and the catalog; the weekly 28-day one
every seventh day): 2,973 rows an account, 14.9 million `meta_sync_runs` rows. They are built
by one set-based `INSERT ... SELECT` over `range()` in start order, as syncs append them
(account-local dates by DuckDB's ICU), not by running syncs.

Measured: `planned_accounts` (the loader), `cadence.plan` for every account, and the sensor
function `meta_cadence_sensor` itself, evaluated through `dg.build_sensor_context` on an
ephemeral instance with the resource on that warehouse (`RASTRO_DUCKDB_PATH`) and its clock
pinned (`rastro_assets_tests.pinned`): a first tick without a cursor (it also evaluates the
freshness check), then ticks with the cursor the previous one returned. The figure is the
slowest of those ticks (wall clock); the CPU seconds the process used (all threads) are
printed too, as they depend less on what else runs on the machine.
`meta_accounts_sensor` (the backfill sensor, every 30 s, same loader) is timed too, and
`meta_incidents_sensor` (every minute: the same loader, every account's incidents, the
ledger's transaction; no channel set), twice: the first tick opens what it finds.

Run: .venv/bin/python bench/sensor.py [--accounts 5000] [--keep PATH] [--full-loader N]
  --keep PATH      build the warehouse at PATH once and reuse it on later runs
  --full-loader N  also time the full-history loader on the first N accounts (its cost grows
                   with the history: 15M SyncRun objects do not fit a sensor tick)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

NOW = _world.NOW + timedelta(minutes=7)  # the tick's instant: a few live syncs are due
LINKED_AT = _world.NOW - timedelta(days=90)
TIMEZONES = [
    "America/Los_Angeles", "America/New_York", "America/Sao_Paulo", "Europe/London",
    "Europe/Berlin", "Asia/Kolkata", "Asia/Tokyo", "Pacific/Auckland",
]
LIVE_PER_DAY = 32  # every 45 minutes
GOAL_SECONDS = 2.0
# `meta_incidents` ticks every minute: a tick within a tenth of it leaves the daemon's sensor
# thread free for the cadence.
INCIDENTS_GOAL_SECONDS = 6.0


def build(path: Path, accounts: int) -> None:
    """The warehouse with `accounts` linked accounts and their 90-day sync history."""
    from rastro_assets.warehouse.connection import Warehouse

    warehouse = Warehouse(path)
    warehouse.migrate()
    started = time.perf_counter()
    with warehouse.connect() as con:
        con.execute(
            """
            INSERT INTO meta_connections
                (connection_id, status, sealed_token, sealed_at, created_at, updated_at)
            SELECT 'c' || i, 'active', '\\x00'::BLOB, $linked, $linked, $linked
            FROM range(50) t(i)
            """,
            {"linked": LINKED_AT},
        )
        con.execute(
            "INSERT INTO sites SELECT 's' || i, 'Site ' || i, $linked FROM range($n // 2) t(i)",
            {"linked": LINKED_AT, "n": accounts},
        )
        con.execute(
            """
            CREATE TEMP TABLE bench_accounts AS
            SELECT i, 'act_' || (100000 + i) AS act, $tz[i % 8 + 1] AS tz,
                   (hash(i) % 45)::INTEGER AS phase
            FROM range($n) t(i)
            """,
            {"tz": TIMEZONES, "n": accounts},
        )
        con.execute(
            """
            INSERT INTO meta_ad_accounts
                (ad_account_id, connection_id, timezone, currency, name, created_at)
            SELECT act, 'c' || (i % 50), tz, 'USD', NULL, $linked FROM bench_accounts
            """,
            {"linked": LINKED_AT},
        )
        con.execute(
            "INSERT INTO site_ad_accounts SELECT 's' || (i // 2), act, $linked FROM bench_accounts",
            {"linked": LINKED_AT},
        )
        # All runs in one INSERT, in the order syncs write them (by start): the backfill at
        # linking (three 30-day runs up to the link date), a live sync every 45 minutes
        # (today and yesterday local; ~1% failed, 0.5% throttled), and the re-sync from
        # 04:00 local (7 days and the catalog; 28 days every seventh day).
        resyncs = _world.resync_runs_sql(
            "SELECT act, tz, d, timezone(tz, $linked::TIMESTAMPTZ)::DATE + 1 + d::INTEGER AS day"
            " FROM bench_accounts, range(90) t(d)",
            "started_at < $now",
        )
        con.execute(
            f"""
            INSERT INTO meta_sync_runs
            SELECT * FROM (
                SELECT 'bf-' || b, act, 'backfill',
                       link_day - 89 + (30 * b)::INTEGER,
                       least(link_day - 89 + (30 * b + 29)::INTEGER, link_day),
                       $linked + to_seconds(60 * b), $linked + to_seconds(60 * b + 50), 'ok',
                       60000, 0, 120, NULL, false, 3.0, NULL, NULL, $linked
                FROM (SELECT *, timezone(tz, $linked::TIMESTAMPTZ)::DATE AS link_day
                      FROM bench_accounts), range(3) t(b)
                UNION ALL
                SELECT 'live-' || k, act, 'live', local_day - 1, local_day, started_at,
                       started_at + INTERVAL 40 SECOND, outcome, 400, 0, 2,
                       CASE outcome WHEN 'other' THEN 'META_UNAVAILABLE: the connection failed'
                                    WHEN 'throttled' THEN 'RATE_LIMITED: too many calls' END,
                       false, (hash(act, k) % 50)::DOUBLE,
                       CASE WHEN outcome = 'throttled'
                            THEN started_at + INTERVAL 5 MINUTE END, NULL, $linked
                FROM (
                    SELECT act, k, started_at, timezone(tz, started_at)::DATE AS local_day,
                           CASE WHEN hash(act, k, 'o') % 200 < 2 THEN 'other'
                                WHEN hash(act, k, 'o') % 200 = 2 THEN 'throttled'
                                ELSE 'ok' END AS outcome
                    FROM (SELECT act, tz, k,
                                 $linked + to_minutes(45 * k + phase + 5) AS started_at
                          FROM bench_accounts, range($live) t(k))
                    WHERE started_at < $now
                )
                UNION ALL
                {resyncs}
            ) ORDER BY 6
            """,
            {"linked": LINKED_AT, "now": _world.NOW, "live": 90 * LIVE_PER_DAY},
        )
        con.execute("CHECKPOINT")
        total = con.execute("SELECT count(*) FROM meta_sync_runs").fetchone()[0]
    print(f"built {accounts} accounts, {total:,} meta_sync_runs rows in "
          f"{time.perf_counter() - started:.0f} s")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - started, value


def timed_cpu(fn, *args, **kwargs):
    """(wall seconds, CPU seconds of this process, all threads, value)."""
    cpu, started = _cpu(), time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - started, _cpu() - cpu, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the warehouse here once, then reuse it")
    parser.add_argument("--full-loader", type=int, default=0, metavar="N")
    args = parser.parse_args()

    import dagster as dg

    from rastro_assets.defs.cadence.incidents import build_meta_incidents_sensor
    from rastro_assets.defs.cadence.sensors import (
        build_meta_accounts_sensor,
        build_meta_cadence_sensor,
    )
    from rastro_assets.defs.partitions import configured_shard_count
    from rastro_assets.planner import cadence
    from rastro_assets.planner.history import planned_accounts
    from rastro_assets.warehouse.connection import Warehouse
    from rastro_assets_tests.pinned import pinned

    meta_cadence_sensor = build_meta_cadence_sensor(configured_shard_count())
    meta_accounts_sensor = build_meta_accounts_sensor(configured_shard_count())
    meta_incidents_sensor = build_meta_incidents_sensor()
    with _world.tempdir() as directory:
        path = args.keep or Path(directory) / "rastro.duckdb"
        if not path.exists():
            build(path, args.accounts)
        size_mb = os.path.getsize(path) / 2**20
        warehouse = Warehouse(path)
        with warehouse.connect(read_only=True) as con:
            runs = con.execute("SELECT count(*) FROM meta_sync_runs").fetchone()[0]
            accounts = con.execute("SELECT count(*) FROM meta_ad_accounts").fetchone()[0]
        print(f"warehouse: {accounts} accounts, {runs:,} sync runs, {size_mb:.0f} MB")

        with warehouse.connect(read_only=True) as con:
            load_s, planned = timed(planned_accounts, con)
        loaded = sum(len(account.state.runs) for account in planned)
        plan_s, plans = timed(lambda: [cadence.plan(a.state, NOW) for a in planned])
        kinds = statistics.multimode(plan.kind for plan in plans)
        due = sum(plan.is_due(NOW) for plan in plans)
        print(f"planned_accounts: {load_s:.2f} s ({loaded:,} runs loaded for the planner); "
              f"cadence.plan x {len(plans)}: {plan_s:.2f} s ({due} due, mostly {kinds})")

        if args.full_loader:
            ids = [account.state.ad_account_id for account in planned[: args.full_loader]]
            with warehouse.connect(read_only=True) as con:
                full_s, full = timed(planned_accounts, con, ids, full_history=True)
            full_runs = sum(len(account.state.runs) for account in full)
            same = [cadence.plan(a.state, NOW) for a in full] == plans[: len(full)]
            print(f"full-history loader, {len(ids)} accounts: {full_s:.2f} s for {full_runs:,} "
                  f"runs (x{accounts / len(ids):.0f}: ~{full_s * accounts / len(ids):.0f} s); "
                  f"same plans: {same}")

        # The resource reads its warehouse from the environment only, as a code location does.
        os.environ["RASTRO_DUCKDB_PATH"] = str(path)
        rastro = pinned(NOW)
        ticks, cpus, cursor, incident_ticks = [], [], None, []
        with dg.DagsterInstance.ephemeral() as instance:
            for tick in range(args.ticks):
                context = dg.build_sensor_context(
                    instance=instance, cursor=cursor, resources={"rastro": rastro}
                )
                seconds, cpu, result = timed_cpu(meta_cadence_sensor, context)
                cursor = result.cursor
                requests = result.run_requests or []
                syncs = sum(
                    len(r.run_config["ops"]["sync_wave"]["config"]["syncs"]) for r in requests
                )
                print(f"meta_cadence tick {tick + 1} ({'no cursor' if tick == 0 else 'cursor'}):"
                      f" {seconds:.2f} s ({cpu:.2f} CPU s), {len(requests)} wave run with"
                      f" {syncs} syncs"
                      f"{', ' + result.skip_reason if result.skip_reason else ''}")
                ticks.append(seconds)
                cpus.append(cpu)
            context = dg.build_sensor_context(instance=instance, resources={"rastro": rastro})
            seconds, result = timed(meta_accounts_sensor, context)
            print(f"meta_accounts tick: {seconds:.2f} s "
                  f"({len(result.run_requests or [])} backfills requested)")
            incident_cursor = None
            for tick in range(2):
                context = dg.build_sensor_context(
                    instance=instance, cursor=incident_cursor, resources={"rastro": rastro}
                )
                seconds, cpu, result = timed_cpu(meta_incidents_sensor, context)
                incident_cursor = result.cursor
                print(f"meta_incidents tick {tick + 1}: {seconds:.2f} s ({cpu:.2f} CPU s),"
                      f" {result.skip_reason}")
                incident_ticks.append(seconds)
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} (2 cores); the slowest tick"
          f" used {max(cpus):.2f} CPU s")
    print(f"sensor: {max(ticks):.2f} s per tick (goal <= {GOAL_SECONDS:g} s)")
    print(f"incidents sensor: {max(incident_ticks):.2f} s per tick"
          f" (goal <= {INCIDENTS_GOAL_SECONDS:g} s)")


if __name__ == "__main__":
    main()

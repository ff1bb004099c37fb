"""`meta_records` at scale: one tick, and `rastro status --check`'s full count.

The warehouse holds N linked accounts (Sao Paulo, one shard), each with a year of days
(`RASTRO_PARTITIONS_START` 2025-12-01 to 2026-11-30): its backfill in 30-day blocks and a
week of live reads every 45 minutes (237 `meta_sync_runs` rows an account). The instance
(SQLite, a temporary `DAGSTER_HOME`) holds every account-day of both spend assets as
materialized: one real event each, then copies of its `event_logs` row with the partition
changed, written with SQLite directly (storing them through Dagster takes ~10 ms each).
So both ticks below find nothing to record but the fills; what they cost is the comparison.

Measured, CPU and wall seconds: `recorder.records_tick` twice (200 accounts a tick), then
`records.stored_not_recorded` over every account (the check's count).

Run: .venv/bin/python bench/records.py [--accounts 1000]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta

os.environ["RASTRO_PARTITIONS_START"] = "2025-12-01"

import dagster as dg  # noqa: E402

from rastro_assets import shards  # noqa: E402
from rastro_assets.defs.cadence import recorder, records  # noqa: E402
from rastro_assets.defs.keys import AD_SPEND_DAILY, SITE_SPEND_DAILY  # noqa: E402
from rastro_assets.timekeeping import days_between, fixed_clock  # noqa: E402
from rastro_assets.warehouse import link_store, registry, site_store  # noqa: E402
from rastro_assets.warehouse.connection import Warehouse  # noqa: E402
from rastro_assets.warehouse.runs import (  # noqa: E402
    SyncRunEnd,
    SyncRunStart,
    finish_sync_runs,
    start_sync_runs,
)

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
TODAY = date(2026, 11, 30)
FIRST = date(2025, 12, 1)


def build_warehouse(path: str, ids: list[str]) -> Warehouse:
    warehouse = Warehouse(path)
    blocks = []
    day = FIRST
    while day <= TODAY:
        blocks.append((day, min(day + timedelta(days=29), TODAY)))
        day += timedelta(days=30)
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, NOW)
        for first in range(0, len(ids), 100):
            connection = f"c{first}"
            registry.save_connection(con, connection, b"\0" * 40, NOW)
            for account in ids[first : first + 100]:
                link_store.link_account(con, "s1", account, connection, "America/Sao_Paulo",
                                        "BRL", NOW - timedelta(days=400))
        starts, ends = [], []
        for account in ids:
            for k, (since, until) in enumerate(blocks):
                at = NOW - timedelta(days=300)
                starts.append(SyncRunStart(f"b{k}", account, "backfill", since, until, at,
                                           False, None))
                ends.append(((f"b{k}", account, since), SyncRunEnd(at, "ok")))
            for j in range(7 * 32):
                at = NOW - timedelta(minutes=45 * j)
                since = at.date() - timedelta(days=1)
                starts.append(SyncRunStart(f"l{j}", account, "live", since, at.date(), at,
                                           False, None))
                ends.append(((f"l{j}", account, since), SyncRunEnd(at, "ok")))
        start_sync_runs(con, starts)
        finish_sync_runs(con, ends)
    return warehouse


def build_instance(home: str, ids: list[str]) -> int:
    with dg.DagsterInstance.from_config(home) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), ids)
        for key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key=key, partition=f"{ids[0]}|{FIRST}")
            )
    db = sqlite3.connect(os.path.join(home, "history", "runs", "index.db"))
    columns = [row[1] for row in db.execute("PRAGMA table_info(event_logs)")]
    partition, event_id = columns.index("partition"), columns.index("id")
    copies = []
    for row in db.execute("SELECT * FROM event_logs WHERE partition IS NOT NULL").fetchall():
        for account in ids:
            for day in days_between(FIRST, TODAY):
                if f"{account}|{day}" != row[partition]:
                    copy = list(row)
                    copy[partition], copy[event_id] = f"{account}|{day}", None
                    copies.append(copy)
    db.executemany(f"INSERT INTO event_logs VALUES ({','.join('?' * len(columns))})", copies)
    db.commit()
    db.close()
    return len(copies) + 2


class _Resource:
    def __init__(self, warehouse: Warehouse) -> None:
        self._warehouse = warehouse

    def warehouse(self) -> Warehouse:
        return self._warehouse

    def clock(self):
        return fixed_clock(NOW)


def timed(label: str, work):
    cpu, wall = time.process_time(), time.perf_counter()
    result = work()
    print(f"{label}: {time.process_time() - cpu:.2f} CPU s, {time.perf_counter() - wall:.2f} s")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accounts", type=int, default=1000)
    args = parser.parse_args(argv)
    ids = [f"act_{100000 + i}" for i in range(args.accounts)]
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = build_warehouse(os.path.join(tmp, "rastro.duckdb"), ids)
        home = os.path.join(tmp, "home")
        os.mkdir(home)
        events = build_instance(home, ids)
        print(f"{args.accounts} accounts, {events} materializations in one spend pair")
        rastro = _Resource(warehouse)
        with dg.DagsterInstance.from_config(home) as instance:
            for label in ("tick", "next tick"):
                result = timed(
                    f"{label} ({recorder.ACCOUNTS_PER_TICK} accounts)",
                    lambda: recorder.records_tick(
                        dg.build_sensor_context(instance=instance), rastro, 1
                    ),
                )
                print(f"  {result.skip_reason.skip_message}")
            missing = timed(
                "the check's count, every account",
                lambda: records.stored_not_recorded(instance, warehouse, NOW, 1),
            )
            print(f"  {sum(missing.account_days().values())} account-days not recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())

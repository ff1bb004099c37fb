"""The spend writer against DuckDB's own speed.

`write_spend` replaces 180,000 account-day rows (2,000 ads x 90 days, one account linked to two
sites) in one call, with reconciliation (deletions from complete days) and the site aggregate,
over a warehouse already holding those days: 3% of the rows changed, 2% gone from the new read
(deleted), 2% new (inserted). Timed from the `InsightRow` list the client hands it to the
commit, so the Python-to-Arrow conversion is included.

The floor: a bare `INSERT INTO t SELECT * FROM incoming` of the same Arrow table (the one
`write_spend` builds from the rows) into an empty table with the same columns, in the same
DuckDB file.

Each round starts from a fresh copy of the pre-filled file. Best of N rounds for each.

Run: .venv/bin/python bench/writer.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

ADS = 2000
DAYS = 90


def make_rows(seed: int, days, ads: int):
    from rastro_assets.meta.models import InsightRow

    rng = random.Random(seed)
    rows = []
    for day in days:
        for index in range(ads):
            ad_id = f"120214242{index:05d}"
            rows.append(InsightRow(
                ad_id=ad_id, day=day,
                spend=Decimal(rng.randrange(1, 50000)) / 100,
                impressions=rng.randrange(0, 20000), clicks=rng.randrange(0, 400),
                conversations=rng.randrange(0, 5),
                ad_name=f"Ad {index}", adset_id=f"1202242{index // 4:05d}",
                adset_name=f"Ad set {index // 4}", campaign_id=f"1202342{index // 7:05d}",
                campaign_name=f"Campaign {index // 7}",
            ))
    return rows


def reread(rows, seed: int):
    """The same days read again: 3% changed, 2% gone, 2% new ad-days."""
    import dataclasses

    rng = random.Random(seed)
    out = []
    for row in rows:
        roll = rng.random()
        if roll < 0.02:
            continue
        if roll < 0.05:
            row = dataclasses.replace(row, spend=row.spend + Decimal("1.25"),
                                      impressions=row.impressions + 10)
        out.append(row)
    extra_days = sorted({row.day for row in rows})
    for index in range(ADS, ADS + int(len(rows) * 0.02) // len(extra_days)):
        for day in extra_days:
            out.append(dataclasses.replace(rows[0], ad_id=f"120214242{index:05d}", day=day))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from rastro_assets.warehouse.spend import _incoming_table, write_spend

    today = _world.account_today()
    days = [today - timedelta(days=offset) for offset in range(DAYS - 1, -1, -1)]
    old = make_rows(1, days, ADS)
    new = reread(old, 2)
    new.sort(key=lambda row: (row.day, row.ad_id))
    with _world.tempdir() as directory:
        seed_dir = Path(directory) / "seed"
        warehouse, _ = _world.linked_warehouse(seed_dir, sites=_world.SITES)
        with warehouse.connect() as con:
            write_spend(con, _world.ACCOUNT, days=days, rows=old, complete_days=days,
                        synced_at=_world.NOW - timedelta(days=1))
            con.execute("CHECKPOINT")
        arrow_times = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            incoming = _incoming_table(days, days, new)
            arrow_times.append(time.perf_counter() - started)
        print(f"pre-filled {len(old)} rows; the new read has {len(new)} rows over {len(days)} "
              f"days, account linked to {len(_world.SITES)} sites")

        writes, floors = [], []
        result = None
        for round_ in range(args.rounds):
            work = Path(directory) / f"round{round_}"
            shutil.copytree(seed_dir, work)
            from rastro_assets.warehouse.connection import Warehouse

            with Warehouse(work / "rastro.duckdb").connect() as con:
                con.execute(
                    "CREATE TABLE bare (ad_id VARCHAR, day DATE, spend DECIMAL(18, 4), "
                    "impressions BIGINT, clicks BIGINT, conversations BIGINT)"
                )
                con.execute("CHECKPOINT")
                started = time.perf_counter()
                con.register("incoming", incoming)
                con.execute("INSERT INTO bare SELECT * FROM incoming")
                con.unregister("incoming")
                floors.append(time.perf_counter() - started)
                started = time.perf_counter()
                result = write_spend(con, _world.ACCOUNT, days=days, rows=new,
                                     complete_days=days, synced_at=_world.NOW)
                writes.append(time.perf_counter() - started)
                stored = con.execute(
                    "SELECT count(*) FROM ad_spend_daily WHERE ad_account_id = ?",
                    [_world.ACCOUNT]).fetchone()[0]
                sites = con.execute("SELECT count(*) FROM site_spend_daily").fetchone()[0]
            shutil.rmtree(work)
            print(f"round {round_ + 1}: bare insert {floors[-1] * 1000:.0f} ms, "
                  f"write_spend {writes[-1] * 1000:.0f} ms")
            if stored != len(new) or sites != len(_world.SITES) * len(days):
                raise SystemExit(f"unexpected result: {stored} rows, {sites} site-days")
    assert result is not None
    print(f"write_spend: {result.rows_written} written, {result.rows_deleted} deleted, "
          f"{result.rows_unchanged} unchanged")
    best_write, best_floor = min(writes), min(floors)
    print(f"bare insert: {len(new) / best_floor:,.0f} rows/s; write_spend: "
          f"{len(new) / best_write:,.0f} rows/s (best of {args.rounds})")
    print(f"of which the rows into Arrow columns (`_incoming_table`): {min(arrow_times) * 1000:.0f}"
          f" ms; load average {os.getloadavg()[0]:.1f} on 2 cores")
    print(f"writer: {best_write / best_floor:.2f}x (goal <= 3x)")


if __name__ == "__main__":
    main()

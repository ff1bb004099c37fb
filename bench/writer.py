"""The spend writer against DuckDB's own speed.

`write_spend` replaces 180,000 account-day rows (2,000 ads x 90 days, one account linked to two
sites) in one call, with reconciliation (deletions from complete days) and the site aggregate,
over a warehouse already holding those days: 3% of the rows changed, 2% gone from the new read
(deleted), 2% new (inserted). Timed from the Arrow table the client hands it (the
`InsightsChunk.table` that `read_insights_page` reads from Meta's pages, 500 rows a page;
bench/backfill.py times that parsing) to the commit, so its checks of the table are included.

The floor: a bare `INSERT INTO t SELECT <the six spend columns> FROM incoming` of the same Arrow
table into an empty table with those columns, in the same DuckDB file. DuckDB scans a table of
one chunk faster than one of a chunk per page, so the bare insert of the table combined into one
chunk is printed too (a stricter floor).

Also printed: `write_spend` from the same read as `InsightRow`s turned into a table by
`insight_table` (the way tests build their reads), which adds that conversion.

Each round starts from fresh copies of the pre-filled file. Best of N rounds for each.

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


def as_pages(rows, page_size: int = 500):
    """The rows as the `data` of Meta's insights pages (what `json.loads` gives the client)."""
    messaging = "onsite_conversion.messaging_conversation_started_7d"
    items = [
        {
            "ad_id": row.ad_id, "ad_name": row.ad_name, "adset_id": row.adset_id,
            "adset_name": row.adset_name, "campaign_id": row.campaign_id,
            "campaign_name": row.campaign_name, "spend": str(row.spend),
            "impressions": str(row.impressions), "clicks": str(row.clicks),
            "actions": [{"action_type": "link_click", "value": str(row.clicks)},
                        {"action_type": messaging, "value": str(row.conversations)}],
            "date_start": row.day.isoformat(), "date_stop": row.day.isoformat(),
            "account_currency": "BRL",
        }
        for row in rows
    ]
    return [items[start:start + page_size] for start in range(0, len(items), page_size)]


def parsed_table(rows, days):
    """The chunk table the client builds from the rows' pages, read from their bytes."""
    import json

    import pyarrow as pa

    from rastro_assets.meta.insights_parse import read_insights_page
    from rastro_assets.meta.models import insight_table

    pages = [
        read_insights_page(json.dumps({"data": page}).encode(), days[0], days[-1])
        for page in as_pages(rows)
    ]
    if any(page is None for page in pages):
        raise SystemExit("the byte reader refused a plain page")
    table = pa.concat_tables([page.table for page in pages])
    if not table.equals(insight_table(rows)):
        raise SystemExit("the parsed pages differ from the rows")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from rastro_assets.meta.models import insight_table
    from rastro_assets.warehouse.ad_spend_table import write_spend
    from rastro_assets.warehouse.connection import Warehouse
    from rastro_assets.warehouse.spend_input import incoming_table

    today = _world.account_today()
    days = [today - timedelta(days=offset) for offset in range(DAYS - 1, -1, -1)]
    old = make_rows(1, days, ADS)
    new = reread(old, 2)
    new.sort(key=lambda row: (row.day, row.ad_id))
    incoming = parsed_table(new, days)
    with _world.tempdir() as directory:
        seed_dir = Path(directory) / "seed"
        warehouse, _ = _world.linked_warehouse(seed_dir, sites=_world.SITES)
        with warehouse.connect() as con:
            write_spend(con, _world.ACCOUNT, days=days, rows=insight_table(old), complete_days=days,
                        synced_at=_world.NOW - timedelta(days=1))
            con.execute("CHECKPOINT")
        check_times, convert_times = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            incoming_table(days, days, incoming)
            check_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            incoming_table(days, days, insight_table(new))
            convert_times.append(time.perf_counter() - started)
        print(f"pre-filled {len(old)} rows; the new read has {len(new)} rows over {len(days)} "
              f"days ({incoming.column('ad_id').num_chunks} pages), account linked to "
              f"{len(_world.SITES)} sites")

        writes, floors, one_chunk_floors, row_writes = [], [], [], []
        combined = incoming.combine_chunks()
        result = None
        for round_ in range(args.rounds):
            for source, rows in (("table", incoming), ("rows", new)):
                work = Path(directory) / f"round{round_}-{source}"
                shutil.copytree(seed_dir, work)
                with Warehouse(work / "rastro.duckdb").connect() as con:
                    if source == "table":
                        con.execute(
                            "CREATE TABLE bare (ad_id VARCHAR, day DATE, spend DECIMAL(18, 4), "
                            "impressions BIGINT, clicks BIGINT, conversations BIGINT)"
                        )
                        con.execute("CHECKPOINT")
                        for table, times in ((combined, one_chunk_floors), (incoming, floors)):
                            started = time.perf_counter()
                            con.register("incoming", table)
                            con.execute("INSERT INTO bare SELECT ad_id, day, spend, impressions, "
                                        "clicks, conversations FROM incoming")
                            con.unregister("incoming")
                            times.append(time.perf_counter() - started)
                            con.execute("DELETE FROM bare")
                            con.execute("CHECKPOINT")
                    started = time.perf_counter()
                    if source == "rows":
                        rows = insight_table(rows)
                    result = write_spend(con, _world.ACCOUNT, days=days, rows=rows,
                                         complete_days=days, synced_at=_world.NOW)
                    (writes if source == "table" else row_writes).append(
                        time.perf_counter() - started)
                    stored = con.execute(
                        "SELECT count(*) FROM ad_spend_daily WHERE ad_account_id = ?",
                        [_world.ACCOUNT]).fetchone()[0]
                    sites = con.execute("SELECT count(*) FROM site_spend_daily").fetchone()[0]
                shutil.rmtree(work)
                if stored != len(new) or sites != len(_world.SITES) * len(days):
                    raise SystemExit(f"unexpected result: {stored} rows, {sites} site-days")
            print(f"round {round_ + 1}: bare insert {floors[-1] * 1000:.0f} ms, "
                  f"write_spend {writes[-1] * 1000:.0f} ms (from InsightRows "
                  f"{row_writes[-1] * 1000:.0f} ms)")
    assert result is not None
    print(f"write_spend: {result.rows_written} written, {result.rows_deleted} deleted, "
          f"{result.rows_unchanged} unchanged")
    best_write, best_floor = min(writes), min(floors)
    print(f"bare insert: {len(new) / best_floor:,.0f} rows/s; write_spend: "
          f"{len(new) / best_write:,.0f} rows/s (best of {args.rounds})")
    print(f"bare insert of the table in one chunk: {min(one_chunk_floors) * 1000:.0f} ms "
          f"(write_spend against it: {best_write / min(one_chunk_floors):.2f}x)")
    print(f"of which checking the table (`incoming_table`): {min(check_times) * 1000:.0f} ms; "
          f"load average {os.getloadavg()[0]:.1f} on 2 cores")
    print(f"from InsightRows: write_spend {min(row_writes) * 1000:.0f} ms "
          f"({min(row_writes) / best_floor:.2f}x), of which their conversion and checks "
          f"{min(convert_times) * 1000:.0f} ms")
    print(f"writer: {best_write / best_floor:.2f}x (goal <= 3x)")


if __name__ == "__main__":
    main()

"""The spend writer on both warehouse engines, side by side: DuckDB's file and PostgreSQL.

One account of 2,000 ads x 30 days (60,000 rows), linked to two sites, written through
`write_spend` four ways: a first write (every row new), a re-read with unchanged figures
(only `synced_at` moves), a re-read with 3% of the rows changed, 2% gone and 2% new, and,
for comparison, the unchanged re-read done the way that costs most: every column of every
row rewritten (an `UPDATE` of the whole account's days beside the writer). CPU is counted
where the work is done: the writer's process (DuckDB runs inside it) and, on PostgreSQL, the
server backend that served the writer's connection (from `/proc`). Per account-day is that
CPU over the 30 days.

The floor: a bare bulk load of the same Arrow table into an empty table with the six spend
columns (DuckDB: `register` then `INSERT ... SELECT`; PostgreSQL: the writer's own `COPY`).
Writer against floor is wall time, the re-read with changes against the bare load.

Then eight processes, each writing its own account (a first write, then a re-read with
changes) at once: rows a second over the whole, from the first start to the last commit.
On DuckDB the file has one writer at a time, so the processes queue for its lock.

PostgreSQL is a server this script starts on loopback (`rastro_assets_tests/postgres_server`,
fsync off as in the tests). Best of N rounds for each figure.

Run: .venv/bin/python bench/warehouse_writer.py [--rounds 3] [--ads 2000] [--days 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import random
import sys
import time
from contextlib import ExitStack
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

ACCOUNT = _world.ACCOUNT
WRITERS = 8
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def make_rows(seed: int, days: list[date], ads: int):
    from rastro_assets.meta.models import InsightRow

    rng = random.Random(seed)
    return [
        InsightRow(f"120214242{index:05d}", day, Decimal(rng.randrange(1, 50000)) / 100,
                   rng.randrange(0, 20000), rng.randrange(0, 400), rng.randrange(0, 5))
        for day in days for index in range(ads)
    ]


def reread(rows, seed: int, ads: int):
    """The same days read again: 3% changed, 2% gone, 2% new ad-days."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        roll = rng.random()
        if roll < 0.02:
            continue
        if roll < 0.05:
            row = dataclasses.replace(row, spend=row.spend + Decimal("1.25"))
        out.append(row)
    days = sorted({row.day for row in rows})
    for index in range(ads, ads + int(len(rows) * 0.02) // len(days)):
        out.extend(dataclasses.replace(rows[0], ad_id=f"120214242{index:05d}", day=day)
                   for day in days)
    return out


def open_engine(engine: str, stack: ExitStack, directory: Path, name: str):
    """A fresh warehouse of `engine`, and the URL or path a process opens it by."""
    from rastro_assets.warehouse.connection import Warehouse
    from rastro_assets.warehouse.postgres import PostgresWarehouse

    if engine == "duckdb":
        path = str(directory / f"{name}.duckdb")
        warehouse = Warehouse(path, lock_wait_seconds=600)
        warehouse.migrate()
        return warehouse, path
    server = stack.enter_context(_postgres())
    url = server.fresh_schema_url()
    warehouse = PostgresWarehouse(url)
    warehouse.migrate()
    stack.callback(warehouse.close)
    return warehouse, url


_SERVER = None


def _postgres():
    """One server for the whole script, started the first time it is asked for."""
    from contextlib import contextmanager

    from rastro_assets_tests.postgres_server import WarehouseServer, postgres_server

    @contextmanager
    def shared():
        global _SERVER
        if _SERVER is not None:
            yield _SERVER
            return
        with postgres_server("warehouse") as server:
            _SERVER = WarehouseServer(server)
            try:
                yield _SERVER
            finally:
                _SERVER = None

    return shared()


def link(warehouse, accounts: list[str]) -> None:
    from rastro_assets.warehouse import link_store, registry, site_store

    with warehouse.connect() as con:
        registry.save_connection(con, "c1", b"\0" * 40, NOW)
        for site in _world.SITES:
            site_store.add_site(con, site, None, NOW)
        for account in accounts:
            link_store.link_account(con, _world.SITES[0], account, "c1", "UTC", "BRL", NOW)
        link_store.link_account(con, _world.SITES[1], accounts[0], "c1", "UTC", "BRL", NOW)


def backend_cpu(con) -> float:
    """CPU seconds the server process behind `con` has used (0 for DuckDB, in-process)."""
    raw = getattr(con, "raw", None)
    if raw is None:
        return 0.0
    fields = Path(f"/proc/{raw.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclasses.dataclass
class Cost:
    wall: float
    client: float
    server: float

    @property
    def cpu(self) -> float:
        return self.client + self.server


def timed(con, work) -> Cost:
    wall, client, server = time.perf_counter(), time.process_time(), backend_cpu(con)
    work()
    return Cost(time.perf_counter() - wall, time.process_time() - client,
                backend_cpu(con) - server)


def best(costs: list[Cost]) -> Cost:
    return min(costs, key=lambda cost: cost.cpu)


def one_engine(engine: str, args, directory: Path) -> dict[str, object]:
    from rastro_assets.meta.models import insight_table
    from rastro_assets.warehouse.ad_spend_table import write_spend
    from rastro_assets.warehouse.connection import transaction

    days = [date(2026, 11, 30) - timedelta(days=offset) for offset in range(args.days)][::-1]
    first = make_rows(1, days, args.ads)
    changed = reread(first, 2, args.ads)
    tables = {"first": insight_table(first), "changed": insight_table(changed)}
    costs: dict[str, list[Cost]] = {key: [] for key in
                                   ("first", "unchanged", "changed", "rewrite all", "bare")}
    for round_ in range(args.rounds):
        with ExitStack() as stack:
            warehouse, _ = open_engine(engine, stack, directory, f"w{round_}")
            link(warehouse, [ACCOUNT])
            with warehouse.connect() as con:
                def write(table, at):
                    return lambda: write_spend(con, ACCOUNT, days=days, rows=table,
                                               complete_days=days, synced_at=at)

                costs["first"].append(timed(con, write(tables["first"], NOW)))
                costs["unchanged"].append(
                    timed(con, write(tables["first"], NOW + timedelta(hours=1))))
                costs["changed"].append(
                    timed(con, write(tables["changed"], NOW + timedelta(hours=2))))
                costs["rewrite all"].append(timed(con, lambda: _rewrite_all(con)))
                con.execute(
                    "CREATE TABLE bare (ad_id VARCHAR, day DATE, spend DECIMAL(18, 4),"
                    " impressions BIGINT, clicks BIGINT, conversations BIGINT)"
                )
                bare = tables["changed"].select(
                    ["ad_id", "day", "spend", "impressions", "clicks", "conversations"])

                def load(bare=bare):
                    with transaction(con):
                        _bare_load(con, bare)

                costs["bare"].append(timed(con, load))
                stored = con.execute(
                    "SELECT count(*) FROM ad_spend_daily WHERE ad_account_id = ?", [ACCOUNT]
                ).fetchone()[0]
                if stored != len(changed):
                    raise SystemExit(f"{engine}: {stored} rows stored, not {len(changed)}")
    return {key: best(value) for key, value in costs.items()}


def _rewrite_all(con) -> None:
    """What an unchanged re-read cost when every column of every row was written again."""
    con.execute(
        "UPDATE ad_spend_daily SET spend = spend, impressions = impressions, clicks = clicks,"
        " conversations = conversations, synced_at = ? WHERE ad_account_id = ?",
        [NOW + timedelta(hours=3), ACCOUNT],
    )


def _bare_load(con, table) -> None:
    from rastro_assets.warehouse.postgres import copy_into

    raw = getattr(con, "raw", None)
    if raw is not None:
        copy_into(raw, "bare", table)
        return
    con.register("incoming_bare", table)
    con.execute("INSERT INTO bare SELECT * FROM incoming_bare")
    con.unregister("incoming_bare")


def concurrent_writer(engine: str, target: str, account: str, ads: int, days_count: int,
                      start, done) -> None:
    from rastro_assets.meta.models import insight_table
    from rastro_assets.warehouse.ad_spend_table import write_spend
    from rastro_assets.warehouse.connection import Warehouse
    from rastro_assets.warehouse.postgres import PostgresWarehouse

    days = [date(2026, 11, 30) - timedelta(days=offset) for offset in range(days_count)][::-1]
    seed = int(account.removeprefix("act_"))
    first = make_rows(seed, days, ads)
    tables = [insight_table(first), insight_table(reread(first, seed + 100, ads))]
    warehouse = (Warehouse(target, lock_wait_seconds=600) if engine == "duckdb"
                 else PostgresWarehouse(target))
    start.wait(120)
    rows = 0
    for number, table in enumerate(tables):
        with warehouse.connect() as con:
            write_spend(con, account, days=days, rows=table, complete_days=days,
                        synced_at=NOW + timedelta(hours=number))
        rows += table.num_rows
    done.put((rows, time.time()))


def concurrent(engine: str, args, directory: Path) -> tuple[float, int, float]:
    """Rows a second of `WRITERS` processes, each writing its own account at once."""
    accounts = [f"act_{number}" for number in range(1, WRITERS + 1)]
    context = multiprocessing.get_context("spawn")
    with ExitStack() as stack:
        warehouse, target = open_engine(engine, stack, directory, "concurrent")
        link(warehouse, accounts)
        if hasattr(warehouse, "close"):
            warehouse.close()
        start, done = context.Barrier(WRITERS + 1), context.Queue()
        writers = [
            context.Process(target=concurrent_writer,
                            args=(engine, target, account, args.ads, args.days, start, done))
            for account in accounts
        ]
        for writer in writers:
            writer.start()
        start.wait(120)
        began = time.time()
        finished = [done.get(timeout=600) for _ in writers]
        for writer in writers:
            writer.join()
        elapsed = max(at for _, at in finished) - began
        rows = sum(count for count, _ in finished)
        with warehouse.connect() as con:
            stored = con.execute("SELECT count(*) FROM ad_spend_daily").fetchone()[0]
        return rows / elapsed, stored, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ads", type=int, default=2000)
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args()
    engines = ("duckdb", "postgres")
    with _world.tempdir() as directory, _postgres():
        results = {engine: one_engine(engine, args, Path(directory)) for engine in engines}
        together = {engine: concurrent(engine, args, Path(directory)) for engine in engines}
    rows = args.ads * args.days
    print(f"one account: {args.ads:,} ads x {args.days} days = {rows:,} rows, two sites; "
          f"best of {args.rounds}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"{'':44} {'duckdb':>22} {'postgres (client + server)':>34}")
    for key, label in (("first", "first write, every row new"),
                       ("unchanged", "re-read, figures unchanged"),
                       ("changed", "re-read, 3% changed, 2% gone, 2% new"),
                       ("rewrite all", "unchanged, every column rewritten (before)"),
                       ("bare", "bare bulk load of the re-read")):
        duck, pg = results["duckdb"][key], results["postgres"][key]
        print(f"{label:44} {duck.cpu * 1000 / args.days:8.1f} ms/acct-day "
              f"{duck.wall * 1000:6.0f} ms wall   "
              f"{pg.cpu * 1000 / args.days:6.1f} ms/acct-day ({pg.client * 1000:.0f} + "
              f"{pg.server * 1000:.0f} ms CPU) {pg.wall * 1000:6.0f} ms wall")
    ratios = {engine: results[engine]["changed"].wall / results[engine]["bare"].wall
              for engine in engines}
    for engine in engines:
        per_second, stored, elapsed = together[engine]
        print(f"{WRITERS} writers at once, {engine}: {per_second:,.0f} rows/s "
              f"({elapsed:.1f} s; {stored:,} rows stored)")
    print(f"writer (re-read with changes) vs bare load: duckdb {ratios['duckdb']:.2f}x, "
          f"postgres {ratios['postgres']:.2f}x (goal <= 3x)")


if __name__ == "__main__":
    main()

"""Dagster's write cost per event, on SQLite and on Postgres instance storage.

What a sync pays Dagster for each account-day it records: a real run (in-process executor)
whose op calls `context.log_event(AssetMaterialization(...))` for partitions of
`ad_spend_daily`, as the wave and the spend assets do, each event carrying a partition's own
small figures. The cost per event is (run with N events - run with no event) / N, the median
of several rounds, so the run's own start and end are not counted.

Each backend is measured on an empty instance and again after it holds `--fill`
materializations (200,000 by default: ~1,000 accounts x 100 days x both spend assets). The
fill clones one real event through Dagster's own batch insert (the rows, tags and asset row
`store_event` writes to the index), as the scale measurement did
(../shared/dagster-scale.md), since writing 200,000 events one by one would take an hour.
On SQLite the fill skips the per-run shard files, which only back each run's log view.

Postgres is a real server this script starts on loopback and stops at the end
(rastro_assets_tests/postgres_server.py), with the storage section of
docs/dagster.scaled.yaml; its disk writes are not fsynced (a test server), so its figure is a
floor for a real one, where a network round trip is added to every write.

`--connections`: only what one new connection to that server costs, with TLS
(`sslmode: require`, as docs/dagster.scaled.yaml has it) and without. `storage: postgres`
as `dagster-postgres` ships it opens one for every storage call (its engines use
SQLAlchemy's `NullPool`), so that cost is part of every event it stores; the scaled config's
`PooledPostgresStorage` (`rastro_assets/instance/postgres_storage.py`) keeps one a process.

Run: .venv/bin/python bench/events.py [--events 300] [--rounds 3] [--fill 200000]
     [--connections]
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import dagster as dg  # noqa: E402
from dagster._core.storage.event_log.schema import SqlEventLogStorageTable  # noqa: E402

from rastro_assets_tests.postgres_server import postgres_server  # noqa: E402

SPEND = dg.AssetKey("ad_spend_daily")
SITE_SPEND = dg.AssetKey("site_spend_daily")
FIRST_DAY = date(2026, 8, 1)
FILL_BATCH = 500
# The console logger prints every event; quiet, so the figure is the storage write.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
GOAL_MS = 10.0  # one event on a small SQLite instance, ../shared/dagster-facts.md


def partition_metadata(account: int, day: date) -> dict:
    return {
        "spend": dg.MetadataValue.text(f"{account % 97}.{day.day:02d}00 NZD"),
        "rows": dg.MetadataValue.int(3),
        "ads": dg.MetadataValue.int(3),
    }


def event_job(n_events: int, first_account: int) -> dg.JobDefinition:
    @dg.op(name="record_partitions")
    def record_partitions(context: dg.OpExecutionContext) -> None:
        for index in range(n_events):
            account = first_account + index // 30
            day = FIRST_DAY + timedelta(days=index % 30)
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=SPEND,
                    partition=f"act_{account}|{day}",
                    metadata=partition_metadata(account, day),
                )
            )

    @dg.job(name=f"record_{n_events}_events")
    def record() -> None:
        record_partitions()

    return record


def run_cost(instance: dg.DagsterInstance, job: dg.JobDefinition) -> tuple[float, float]:
    """Wall and CPU seconds of one run (the CPU of this process: the Postgres server's is not
    counted, SQLite's is)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = job.execute_in_process(run_config=QUIET, instance=instance)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert result.success
    return wall, cpu


def ms_per_event(instance: dg.DagsterInstance, n_events: int, rounds: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds per event."""
    empty = event_job(0, 0)
    run_cost(instance, empty)  # the first run pays imports and table checks
    walls, cpus = [], []
    for round_index in range(rounds):
        # New accounts each round, so every event is a partition's first materialization.
        full = event_job(n_events, 900_000 + round_index * 1_000)
        bare_wall, bare_cpu = run_cost(instance, empty)
        wall, cpu = run_cost(instance, full)
        walls.append((wall - bare_wall) * 1000 / n_events)
        cpus.append((cpu - bare_cpu) * 1000 / n_events)
    return statistics.median(walls), statistics.median(cpus)


def template_event(instance: dg.DagsterInstance) -> dg.EventLogEntry:
    """One materialization as a real run stored it."""
    run_cost(instance, event_job(1, 1))
    [record] = instance.fetch_materializations(SPEND, limit=1).records
    return record.event_log_entry


def clone(template: dg.EventLogEntry, asset: dg.AssetKey, account: int, day: date):
    dagster_event = template.get_dagster_event()
    materialization = dg.AssetMaterialization(
        asset_key=asset, partition=f"act_{account}|{day}", metadata=partition_metadata(account, day)
    )
    data = dagster_event.event_specific_data._replace(materialization=materialization)
    return template._replace(dagster_event=dagster_event._replace(event_specific_data=data))


def fill(instance: dg.DagsterInstance, n_events: int) -> float:
    """`n_events` materializations, accounts x 100 days x both spend assets; returns seconds."""
    started = time.perf_counter()
    template = template_event(instance)
    storage = instance.event_log_storage
    accounts = max(1, n_events // 200)
    instance.add_dynamic_partitions("meta_ad_account", [f"act_{a}" for a in range(accounts)])
    events = (
        clone(template, asset, account, FIRST_DAY + timedelta(days=offset))
        for account in range(accounts)
        for offset in range(100)
        for asset in (SPEND, SITE_SPEND)
    )
    batch: list = []
    for event in events:
        batch.append(event)
        if len(batch) == FILL_BATCH:
            insert_batch(storage, batch)
            batch = []
    if batch:
        insert_batch(storage, batch)
    return time.perf_counter() - started


def insert_batch(storage, events: list) -> None:
    # What dagster_postgres's store_event_batch does, on the index both backends query.
    with storage.index_transaction() as conn:
        result = conn.execute(
            storage.prepare_insert_event_batch(events).returning(SqlEventLogStorageTable.c.id)
        )
        event_ids = [row[0] for row in result.fetchall()]
        storage._store_asset_event_tags(conn, events, event_ids)
        storage._store_asset_event(conn, events[-1], event_ids[-1])


@contextlib.contextmanager
def sqlite_instance() -> Iterator[dg.DagsterInstance]:
    with tempfile.TemporaryDirectory(prefix="rastro-events-") as home:
        config = {"storage": {"sqlite": {"base_dir": f"{home}/storage"}},
                  "telemetry": {"enabled": False}}
        Path(home, "dagster.yaml").write_text(yaml.safe_dump(config))
        with dg.DagsterInstance.from_config(home) as instance:
            yield instance


@contextlib.contextmanager
def postgres_instance() -> Iterator[dg.DagsterInstance]:
    scaled = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    with postgres_server() as server, tempfile.TemporaryDirectory(prefix="rastro-events-") as home:
        os.environ.update(server.env())
        config = {"storage": scaled["storage"], "telemetry": {"enabled": False}}
        Path(home, "dagster.yaml").write_text(yaml.safe_dump(config))
        with dg.DagsterInstance.from_config(home) as instance:
            yield instance


def connection_costs(count: int = 50) -> None:
    import psycopg2

    with postgres_server() as server:
        for sslmode in ("require", "disable"):
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(count):
                connection = psycopg2.connect(
                    host=server.host, port=server.port, user=server.user,
                    password=server.password, dbname=server.db, sslmode=sslmode,
                )
                connection.cursor().execute("SELECT 1")
                connection.close()
            print(f"postgres connection, sslmode={sslmode}: "
                  f"{(time.perf_counter() - wall) / count * 1000:.1f} ms wall, "
                  f"{(time.process_time() - cpu) / count * 1000:.1f} ms CPU of this process")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300, help="events per measured run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fill", type=int, default=200_000)
    parser.add_argument("--connections", action="store_true")
    args = parser.parse_args()
    if args.connections:
        connection_costs()
        return
    figures = {}
    for backend, open_instance in (("sqlite", sqlite_instance), ("postgres", postgres_instance)):
        with open_instance() as instance:
            empty, empty_cpu = ms_per_event(instance, args.events, args.rounds)
            print(f"{backend}: empty instance {empty:.1f} ms/event wall, {empty_cpu:.1f} ms CPU"
                  f" (load average {os.getloadavg()[0]:.1f})", flush=True)
            filled_in = fill(instance, args.fill)
            full, full_cpu = ms_per_event(instance, args.events, args.rounds)
            print(f"{backend}: after {args.fill:,} materializations (filled in {filled_in:.0f} s)"
                  f" {full:.1f} ms/event wall, {full_cpu:.1f} ms CPU"
                  f" (load average {os.getloadavg()[0]:.1f})", flush=True)
            figures[backend] = (empty, full)
    summary = ", ".join(
        f"{backend} {empty:.1f} / {full:.1f}" for backend, (empty, full) in figures.items()
    )
    print(f"events: wall ms/event empty / after {args.fill:,}: {summary}"
          f" (goal <= {GOAL_MS:.0f} ms)")

if __name__ == "__main__":
    main()

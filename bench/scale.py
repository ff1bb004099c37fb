"""Dagster's own costs at thousands of accounts (issue 16, items 1, 3 and part of 4).

Builds a SQLite Dagster instance holding N `meta_ad_account` partitions and 90 days of both
spend assets per account as the product records them, then measures:

- the backfill daemon: `meta_accounts`' grouping (`shared_backfills`, `backfill_request`) for
  20 accounts linked in the same minute, submitted as the sensor daemon does
  (`PartitionBackfill.from_asset_graph_subset` + `add_backfill`), then Dagster's own
  `execute_backfill_iteration` on a real workspace (the code location in a code-server
  subprocess, as the daemon runs it), several iterations: the first requests the 60 runs (they
  are only queued: the instance has a `QueuedRunCoordinator` and nothing dequeues), the later
  ones are what every iteration costs while the runs are in flight. Time and peak RSS of each
  (the peak is reset before each iteration through `/proc/self/clear_refs`);
  `--per-account` submits one backfill per account instead (the code before issue 16);
- the retention tick (`prune_instance`) with the retention age at 24 h, from a fresh cursor:
  the biggest window a tick walks, and the space it frees;
- the write cost per event: `report_runless_asset_event` of one spend materialization, and
  `store_event` of one within a run, on the built instance;
- the instance's size on disk.

The history per account (linked over the last 30 days, 90-day backfill at linking):
the backfill's 3 runs of 30 days, each storing a planned event and a materialization per
asset and day; then, for every day since its link, 8 live-wave recordings of today and
yesterday and one daily re-sync of 7 days per asset, in wave runs shared by all accounts.

The builder is faster than executing runs: it writes the rows `store_event` writes
(`event_logs`, `asset_event_tags`) with the SQL storage's own tables, in batches, from
events serialized once by Dagster (`serialize_value` of real `EventLogEntry`s) with the run
id, partition and time substituted. Run records go through `add_run`, their times then set
to when they ran. Per-run event files are not written (they back only each run's log view).
At 1,000 accounts it builds in about a minute.

Run: .venv/bin/python bench/scale.py [--accounts 1000] [--keep DIR] [--iterations 4]
     [--per-account] [--planned-subset] [--small]
  --small          200 accounts, for a quick look
  --planned-subset sets DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS (the daemon's
                   environment): a run plans its range in one event per asset, not one per
                   partition, which is what the iteration that submits the runs spends on
  --keep DIR       build the instance in DIR once and reuse it later (one DIR per N)
  --retention-only only the retention ticks (on a --keep instance: later runs find less)
  --partitions-only  only the N account partitions, no history: the backfill daemon's
                   iterations cost by the key space (accounts x dates), not by history
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NEW_ACCOUNTS = 20
HISTORY_DAYS = 90
LINK_SPREAD_DAYS = 30
LIVE_RECORDINGS_PER_DAY = 8
BATCH_ROWS = 20_000
GOAL_ITERATION_SECONDS = 5.0
GOAL_ITERATION_MB = 500
GOAL_RETENTION_SECONDS = 10.0
INSTANCE_YAML = """
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
telemetry:
  enabled: false
"""


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> None:
    # Linux: writing 5 resets VmHWM to the current RSS.
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def account_id(number: int) -> str:
    return f"act_{100000 + number}"


class Builder:
    """Writes the rows `store_event` would, from templates Dagster serialized."""

    def __init__(self, instance, today: date):
        import dagster as dg
        from dagster._core.events import AssetMaterializationPlannedData, StepMaterializationData
        from dagster_shared.serdes import serialize_value

        from rastro_assets.defs.spend_assets import AD_SPEND_DAILY, SITE_SPEND_DAILY

        self.dg = dg
        self.instance = instance
        self.today = today
        self.assets = (AD_SPEND_DAILY, SITE_SPEND_DAILY)
        self.next_id = 1
        self.events: list[dict] = []
        self.tags: list[dict] = []
        self.runs: list[tuple[str, datetime]] = []
        self.templates = {}
        for asset_key in self.assets:
            for planned in (False, True):
                if planned:
                    event_type = dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
                    data = AssetMaterializationPlannedData(asset_key, "@@PART@@")
                else:
                    event_type = dg.DagsterEventType.ASSET_MATERIALIZATION
                    data = StepMaterializationData(
                        dg.AssetMaterialization(
                            asset_key=asset_key,
                            partition="@@PART@@",
                            metadata={
                                "spend": dg.MetadataValue.text("1234.5600 BRL"),
                                "rows": dg.MetadataValue.int(48),
                                "ads": dg.MetadataValue.int(12),
                            },
                            tags={
                                "dagster/partition/account": "@@ACC@@",
                                "dagster/partition/date": "@@DATE@@",
                            },
                        )
                    )
                entry = dg.EventLogEntry(
                    error_info=None,
                    level="debug",
                    user_message="",
                    run_id="@@RUN@@",
                    timestamp=1.5,
                    step_key="meta_spend",
                    job_name="__ASSET_JOB",
                    dagster_event=dg.DagsterEvent(
                        event_type_value=event_type.value,
                        job_name="__ASSET_JOB",
                        step_key="meta_spend",
                        event_specific_data=data,
                    ),
                )
                template = serialize_value(entry).replace('"timestamp": 1.5', '"timestamp": @@TS@@')
                assert "@@TS@@" in template, "the event's serialized form changed"
                self.templates[(asset_key, planned)] = (event_type.value, template)

    def add_run(self, run_id: str, at: datetime) -> None:
        self.runs.append((run_id, at))

    def record(self, run_id: str, account: str, day: date, at: datetime, planned: bool) -> None:
        partition = f"{account}|{day.isoformat()}"
        stamp = at.timestamp()
        naive = at.astimezone(UTC).replace(tzinfo=None)
        for asset_key in self.assets:
            for is_planned in ((True, False) if planned else (False,)):
                event_type, template = self.templates[(asset_key, is_planned)]
                event = (
                    template.replace("@@RUN@@", run_id)
                    .replace("@@PART@@", partition)
                    .replace("@@ACC@@", account)
                    .replace("@@DATE@@", day.isoformat())
                    .replace("@@TS@@", repr(stamp))
                )
                self.events.append(
                    {
                        "id": self.next_id,
                        "run_id": run_id,
                        "event": event,
                        "dagster_event_type": event_type,
                        "timestamp": naive,
                        "step_key": "meta_spend",
                        "asset_key": asset_key.to_string(),
                        "partition": partition,
                    }
                )
                if not is_planned:
                    for key, value in (
                        ("dagster/partition/account", account),
                        ("dagster/partition/date", day.isoformat()),
                    ):
                        self.tags.append(
                            {
                                "event_id": self.next_id,
                                "asset_key": asset_key.to_string(),
                                "key": key,
                                "value": value,
                                "event_timestamp": naive,
                            }
                        )
                self.next_id += 1
        if len(self.events) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        from rastro_assets.defs.dagster_private import AssetEventTagsTable, SqlEventLogStorageTable

        storage = self.instance.event_log_storage
        with storage.index_transaction() as conn:
            if self.events:
                conn.execute(SqlEventLogStorageTable.insert(), self.events)
            if self.tags:
                conn.execute(AssetEventTagsTable.insert(), self.tags)
        self.events, self.tags = [], []

    def write_runs(self) -> None:
        from dagster._core.storage.runs.schema import RunsTable, RunTagsTable

        storage = self.instance.run_storage
        rows, tags = [], []
        for run_id, at in self.runs:
            run = self.dg.DagsterRun(
                job_name="__ASSET_JOB", run_id=run_id, status=self.dg.DagsterRunStatus.SUCCESS
            )
            # The row `add_historical_run` inserts, one transaction for all of them.
            values = storage._get_run_insertion_values(run, at)  # noqa: SLF001
            naive = at.astimezone(UTC).replace(tzinfo=None)
            values["create_timestamp"] = values["update_timestamp"] = naive
            rows.append(values)
            tags.extend(
                {"run_id": run_id, "key": key, "value": value}
                for key, value in run.tags_for_storage().items()
            )
        with storage.connect() as conn:
            conn.execute(RunsTable.insert(), rows)
            if tags:
                conn.execute(RunTagsTable.insert(), tags)


def build(instance, accounts: int, now: datetime, history: bool = True) -> dict:
    """N accounts with 90 days of both spend assets as the product records them."""
    from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME

    started = time.perf_counter()
    today = now.date()
    ids = [account_id(n) for n in range(accounts)]
    instance.add_dynamic_partitions(ACCOUNT_PARTITIONS_NAME, ids)
    if not history:
        return {"seconds": time.perf_counter() - started, "events": 0, "runs": 0}
    builder = Builder(instance, today)
    rng = random.Random(16)
    link_days = {
        account: today - timedelta(days=rng.randrange(LINK_SPREAD_DAYS)) for account in ids
    }
    for account in ids:
        linked = link_days[account]
        first = linked - timedelta(days=HISTORY_DAYS - 1)
        for block in range(3):
            run_id = f"bf-{account}-{block}"
            at = datetime.combine(linked, datetime.min.time(), UTC) + timedelta(minutes=5 * block)
            builder.add_run(run_id, at)
            for offset in range(30):
                builder.record(run_id, account, first + timedelta(days=30 * block + offset), at,
                               planned=True)
    # Waves shared by all accounts: 8 live recordings of today and yesterday a day, and the
    # 04:00 daily re-sync of 7 days, for each account linked by then.
    for back in range(LINK_SPREAD_DAYS, -1, -1):
        day = today - timedelta(days=back)
        linked_by = [account for account in ids if link_days[account] < day]
        if not linked_by:
            continue
        daily_at = datetime.combine(day, datetime.min.time(), UTC) + timedelta(hours=4)
        builder.add_run(f"daily-{day}", daily_at)
        for account in linked_by:
            for offset in range(7):
                builder.record(f"daily-{day}", account, day - timedelta(days=offset), daily_at,
                               planned=False)
        for wave in range(LIVE_RECORDINGS_PER_DAY):
            at = daily_at + timedelta(minutes=45 * (wave + 1))
            if at > now:
                break
            run_id = f"wave-{day}-{wave}"
            builder.add_run(run_id, at)
            for account in linked_by:
                for offset in (1, 0):
                    builder.record(run_id, account, day - timedelta(days=offset), at,
                                   planned=False)
    builder.flush()
    builder.write_runs()
    return {"seconds": time.perf_counter() - started, "events": builder.next_id - 1,
            "runs": len(builder.runs)}


def workspace_context(instance):
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget

    return WorkspaceProcessContext(
        instance,
        ModuleTarget(
            module_name="rastro_assets.definitions",
            attribute=None,
            working_directory=str(REPO),
            location_name="rastro_assets",
        ),
    )


def new_accounts(accounts: int) -> list[str]:
    return [account_id(accounts + n) for n in range(NEW_ACCOUNTS)]


def submit_new_accounts(instance, accounts: int, now: datetime, per_account: bool) -> list[str]:
    """20 accounts linked in the same minute, as `meta_accounts` and the sensor daemon do."""
    from rastro_assets.defs.dagster_private import PartitionBackfill
    from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME
    from rastro_assets.defs.sensors import Fill, backfill_request, shared_backfills

    today = now.date()
    new = new_accounts(accounts)
    instance.add_dynamic_partitions(ACCOUNT_PARTITIONS_NAME, new)
    fills = [Fill(account, "backfill", today - timedelta(days=HISTORY_DAYS - 1), today)
             for account in new]
    groups = [[fill] for fill in fills] if per_account else shared_backfills(fills)
    backfill_ids = []
    for number, group in enumerate(groups):
        request = backfill_request(group)
        backfill_id = f"bench{int(time.time())}{number}"
        instance.add_backfill(
            PartitionBackfill.from_asset_graph_subset(
                backfill_id=backfill_id,
                asset_graph_subset=request.asset_graph_subset,
                dynamic_partitions_store=instance,
                tags=request.tags,
                backfill_timestamp=time.time(),
                title=None,
                description=None,
                run_config=None,
            )
        )
        backfill_ids.append(backfill_id)
    return backfill_ids


def measure_daemon(instance, accounts: int, now: datetime, iterations: int,
                   per_account: bool) -> list[tuple[float, float]]:
    import dagster as dg
    from dagster._daemon.backfill import execute_backfill_iteration

    from rastro_assets.defs.dagster_private import BulkActionStatus
    from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME

    logger = logging.getLogger("bench.backfill")
    logger.setLevel(logging.WARNING)
    with workspace_context(instance) as context:
        context.create_request_context()  # loads the code location before the clock starts
        backfill_ids = submit_new_accounts(instance, accounts, now, per_account)
        figures = []
        for _ in range(iterations):
            reset_peak()
            before = rss_mb()
            started = time.perf_counter()
            for error in execute_backfill_iteration(context, logger):
                if error is not None:
                    print(f"  backfill daemon error: {error.message.strip()[:300]}")
            seconds = time.perf_counter() - started
            figures.append((seconds, peak_mb() - before))
            runs = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
            print(f"  iteration {len(figures)}: {seconds:.2f} s, peak +{figures[-1][1]:.0f} MB, "
                  f"{runs} runs queued so far", flush=True)
        queued = instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])
        )
        print(f"  runs queued by the backfills: {len(queued)}")
        # Leave the instance as it was built, for the next measurement with --keep.
        for backfill_id in backfill_ids:
            backfill = instance.get_backfill(backfill_id)
            instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELED))
        for record in queued:
            instance.delete_run(record.dagster_run.run_id)
        for account in new_accounts(accounts):
            instance.delete_dynamic_partition(ACCOUNT_PARTITIONS_NAME, account)
    return figures


def measure_retention(instance, now: datetime) -> dict:
    from rastro_assets.defs.retention import RUN_RETENTION, RetentionCursor, prune_instance

    index = Path(os.environ["DAGSTER_HOME"]) / "history" / "runs" / "index.db"
    pages_before = _sqlite_pages(index)
    started = time.perf_counter()
    tick = prune_instance(instance, now - RUN_RETENTION, RetentionCursor())
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    second = prune_instance(instance, now - RUN_RETENTION, tick.cursor)
    second_seconds = time.perf_counter() - started
    pages_after = _sqlite_pages(index)
    return {
        "seconds": seconds,
        "events": tick.events_deleted,
        "runs": tick.runs_deleted,
        "second_seconds": second_seconds,
        "second_events": second.events_deleted,
        "second_runs": second.runs_deleted,
        "free_mb_before": pages_before[1] / 1024 / 1024,
        "free_mb_after": pages_after[1] / 1024 / 1024,
    }


def _sqlite_pages(path: Path) -> tuple[int, int]:
    import sqlite3

    with sqlite3.connect(path) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * size, free * size


def measure_writes(instance, accounts: int, today: date) -> tuple[float, float]:
    import dagster as dg
    from dagster._core.events import StepMaterializationData

    from rastro_assets.defs.spend_assets import AD_SPEND_DAILY

    count = 30
    started = time.perf_counter()
    for number in range(count):
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=AD_SPEND_DAILY, partition=f"{account_id(number)}|{today}",
                metadata={"rows": 1},
            )
        )
    runless = (time.perf_counter() - started) / count
    run_id = f"bench-writes-{time.time_ns()}"
    instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id=run_id))
    started = time.perf_counter()
    for number in range(count):
        instance.store_event(
            dg.EventLogEntry(
                error_info=None, level="debug", user_message="", run_id=run_id,
                timestamp=time.time(), step_key="meta_spend", job_name="__ASSET_JOB",
                dagster_event=dg.DagsterEvent(
                    event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
                    job_name="__ASSET_JOB", step_key="meta_spend",
                    event_specific_data=StepMaterializationData(dg.AssetMaterialization(
                        asset_key=AD_SPEND_DAILY, partition=f"{account_id(number)}|{today}",
                        metadata={"rows": 1},
                    )),
                ),
            )
        )
    in_run = (time.perf_counter() - started) / count
    return runless * 1000, in_run * 1000


def directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1024 / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--per-account", action="store_true")
    parser.add_argument("--planned-subset", action="store_true")
    parser.add_argument("--partitions-only", action="store_true")
    parser.add_argument("--retention-only", action="store_true")
    args = parser.parse_args()
    if args.planned_subset:
        os.environ["DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"] = "true"
    accounts = 200 if args.small else args.accounts
    planned = "one per asset a run" if args.planned_subset else "one per partition (default)"
    print(f"load average {os.getloadavg()[0]:.1f}; {accounts} accounts; planned events: {planned}")

    home = args.keep or Path(tempfile.mkdtemp(prefix="rastro-scale-"))
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    now = datetime.now(UTC)
    instance = dg.DagsterInstance.get()
    try:
        if not (home / "built").exists():
            built = build(instance, accounts, now, history=not args.partitions_only)
            (home / "built").write_text(now.isoformat())
            print(f"built {built['events']:,} events and {built['runs']:,} runs "
                  f"in {built['seconds']:.0f} s")
        size_mb = directory_mb(home)
        if args.retention_only:
            retention = measure_retention(instance, now)
            print(f"SCALE retention tick at {accounts:,} accounts: {retention['seconds']:.2f} s, "
                  f"{retention['events']:,} events and {retention['runs']:,} runs deleted; next "
                  f"{retention['second_seconds']:.2f} s (goal <= {GOAL_RETENTION_SECONDS:.0f} s)")
            return
        runless_ms, in_run_ms = measure_writes(instance, accounts, now.date())
        iterations = measure_daemon(instance, accounts, now, args.iterations, args.per_account)
        if args.partitions_only:
            print(f"SCALE backfill daemon iteration at {accounts:,} accounts (partitions only): "
                  f"{max(seconds for seconds, _ in iterations[1:] or iterations):.2f} s after "
                  f"the first; first {iterations[0][0]:.2f} s")
            return
        retention = measure_retention(instance, now)

        from rastro_assets.defs.partitions import AXIS_START

        dates = (now.date() - AXIS_START).days + 2
        print(f"key space: {accounts + NEW_ACCOUNTS:,} accounts x {dates} dates = "
              f"{(accounts + NEW_ACCOUNTS) * dates:,} keys per spend asset")
        kind = "one backfill per account" if args.per_account else "one shared backfill"
        print(f"retention tick: {retention['seconds']:.2f} s, deleted {retention['events']:,} "
              f"events and {retention['runs']:,} runs; "
              f"the next tick {retention['second_seconds']:.2f} s "
              f"({retention['second_events']:,} events, {retention['second_runs']:,} runs); "
              f"index.db free pages {retention['free_mb_before']:.0f} -> "
              f"{retention['free_mb_after']:.0f} MB (reused by new events)")
        print(f"write per event: {runless_ms:.1f} ms runless, {in_run_ms:.1f} ms in a run")
        print(f"instance size: {size_mb:,.0f} MB ({size_mb / accounts:.2f} MB per account)")
        slowest = max(seconds for seconds, _ in iterations)
        fattest = max(mb for _, mb in iterations)
        print(f"SCALE backfill daemon iteration at {accounts:,} accounts, {NEW_ACCOUNTS} linked "
              f"together ({kind}): {slowest:.2f} s (goal <= {GOAL_ITERATION_SECONDS:.0f} s), "
              f"peak +{fattest:.0f} MB (goal <= {GOAL_ITERATION_MB} MB)")
        print(f"SCALE retention tick at {accounts:,} accounts: {retention['seconds']:.2f} s "
              f"(goal <= {GOAL_RETENTION_SECONDS:.0f} s)")
    finally:
        instance.dispose()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

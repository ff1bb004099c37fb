"""Dagster's own costs at thousands of accounts.

Builds a Dagster instance, SQLite (the repo's) or Postgres (`docs/dagster.scaled.yaml`'s
storage on a real server started here), holding N `meta_ad_account` partitions and both
spend assets' history as the product records it, then measures, in this order:

- the write cost per event: `report_runless_asset_event` of one spend materialization, and
  `store_event` of one within a run;
- the status cache (`get_and_update_asset_status_cache_value`, the path the UI's partition
  queries take): cold, warm, and right after one account is linked;
- the UI's own GraphQL operations (`bench/ui_queries.graphql`, taken from the webserver's
  bundle; `bench/_ui.py` runs them as `dagster-webserver` does) for both spend assets: with
  the status caches wiped, warm, and the first call after a link;
- both sensors that tick every 30-60 s, `meta_cadence` (three ticks) and `meta_accounts`, on
  this instance over a warehouse of the same N accounts (`bench/sensor.py`'s builder), in a
  process of their own as in the code server;
- the backfill daemon: what `meta_accounts` starts when `--linked` accounts (20) are linked
  in the same minute, each in the shard `rastro link` gives it (`shard_for_new_account`,
  `RASTRO_SHARD_ACCOUNTS` as set): one partition backfill of the shard's `spend_backfill`
  (`fill_request`) per shard touched, over those accounts, submitted as the sensor daemon
  does (`PartitionBackfill.from_asset_graph_subset` + `add_backfill`); then Dagster's own
  `execute_backfill_iteration` on a real workspace (the code location in a code-server
  subprocess, as the daemon runs it): the iteration that submits the backfills' runs (one
  per 25 accounts, `BackfillPolicy.multi_run(25)`; they are only queued: nothing dequeues),
  one while they are in flight, and one after a workspace refresh (the daemon refreshes
  every 60 s). Time and peak RSS of each (the peak is reset before each iteration through
  `/proc/self/clear_refs`). Twice: with Dagster's default planned events (one per partition
  of a run) and with DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=true in the daemon's
  environment (one per asset a run). When more than 25 accounts owe their newest block at
  once, `meta_cadence` reads those blocks first in `meta_sync_wave` runs (not backfills:
  the backfill daemon does not see them) and `meta_accounts` starts the backfill for the
  older blocks after; the backfill measured here is that one, over every linked account.
  `--per-account` submits one such backfill per account instead: what `meta_accounts`
  starts when the accounts are linked a tick apart (each tick's owing accounts get their
  own backfill while the earlier ones are in flight). The two cases its goals name:
  `--accounts 0 --linked 1000 --partitions-only` (a first install: 1,000 accounts linked at
  once, nothing else) and `--accounts 5000 --shards 50` (5,000 accounts in shards, 20 more
  linked together);
- the retention tick (`prune_instance`) with the retention age at 24 h, from a fresh cursor:
  the biggest window a tick walks, and the space it frees;
- the instance's size (the directory, or the Postgres database).
The last lines (`SCALE ...`) give each figure beside its goal.

Two histories:
- default: accounts linked over the last 30 days with their 90-day backfill (the accounts
  of a shard linked the same day read by `spend_backfill` runs of 25 accounts: a
  materialization per spend asset and account-day, a planned event and a materialization
  of the account's `spend_backfill` partition), then for every day since
  the link 8 live-wave recordings of today and yesterday and one daily re-sync of 7 days per
  asset, in wave runs shared by all accounts. Nothing pruned yet: retention's worst case.
- `--year`: the steady state a year after linking, retention applied: each account-day of
  the year holds its latest materialization (the re-sync that last covered it), the last
  day every live-wave recording, and each account's `spend_backfill` partition its
  materialization from the link. The date axis then starts a year and 90 days back
  (`RASTRO_PARTITIONS_START`): the key space such a deployment has.

The builder is faster than executing runs: it writes the rows `store_event` writes
(`event_logs`, `asset_event_tags`) with the SQL storage's own tables, in batches, from
events serialized once by Dagster (`serialize_value` of real `EventLogEntry`s) with the run
id, partition and time substituted. Run records go through the run storage, with the times
they ran. Per-run event files are not written (they back only each run's log view).
At 1,000 accounts it builds in about a minute on SQLite.

Run: .venv/bin/python bench/scale.py [--accounts 1000] [--year] [--backend postgres]
     [--keep DIR] [--iterations 3] [--linked 20] [--per-account] [--small] [--shards K]
  --small          200 accounts, for a quick look
  --linked M       how many accounts are linked together for the backfill daemon's figures
                   (20), on top of the N built ones; `--accounts 0` builds none
  --keep DIR       build the SQLite instance in DIR once and reuse it later (one DIR per N)
  --retention-only only the retention ticks (on a --keep instance: later runs find less)
  --build-only     build the --keep instance now, measure it in a later run
  --no-daemon      everything but the backfill daemon (its submission costs minutes)
  --shards K       RASTRO_ACCOUNT_SHARDS=K: the accounts spread evenly over K spend pairs, as
                   `rastro shard move` leaves them (the partitions page is then measured for
                   every spend asset, the lineage with every asset on screen)
  --partitions-only  only the backfill daemon (`--planned-subset` for the daemon environment
                   above); a new instance gets the N account partitions and no history, a
                   built --keep instance keeps its history
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dagster as dg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _world  # noqa: E402

NEW_ACCOUNTS = 20
HISTORY_DAYS = 90
LINK_SPREAD_DAYS = 30
LIVE_RECORDINGS_PER_DAY = 8
YEAR_DAYS = 365
BATCH_ROWS = 20_000
GOAL_ITERATION_SECONDS = 5.0
GOAL_SUBMIT_SECONDS = 30.0
PLANNED_SUBSET_VARIABLE = "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"
GOAL_ITERATION_MB = 500
GOAL_RETENTION_SECONDS = 10.0
GOAL_UI_WARM = 1.0
GOAL_UI_AFTER_LINK = 3.0
GOAL_UI_CATALOG = 0.5
GOAL_SENSOR_SECONDS = 2.0
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


def shard_of(account: str, shard_count: int) -> int:
    """The built accounts' shards: an even share each, as `rastro shard move` leaves an
    install that grew (accounts linked later go where `rastro link` puts them:
    `new_accounts`)."""
    return (int(account.removeprefix("act_")) - 100000) % shard_count


def built_homes(ids: list[str], shard_count: int) -> dict[str, int]:
    return {account: shard_of(account, shard_count) for account in ids}


def add_accounts(instance, homes: dict[str, int], shard_count: int) -> None:
    """The accounts' partitions as `meta_accounts` keeps them: each in its shard's set and,
    with several shards, in the catalog's set of every account."""
    from rastro_assets import shards

    for shard in sorted(set(homes.values())):
        members = [account for account, home in homes.items() if home == shard]
        instance.add_dynamic_partitions(shards.accounts_name(shard), members)
    if shard_count > 1:
        instance.add_dynamic_partitions(shards.all_accounts_name(shard_count), list(homes))


def remove_accounts(instance, homes: dict[str, int], shard_count: int) -> None:
    from rastro_assets import shards

    for account, shard in homes.items():
        instance.delete_dynamic_partition(shards.accounts_name(shard), account)
        if shard_count > 1:
            instance.delete_dynamic_partition(shards.all_accounts_name(shard_count), account)



def event_template(
    asset_key: dg.AssetKey, planned: bool, step: str, metadata: dict, tags: dict | None
) -> tuple[str, str]:
    """(event type, the serialized event with @@RUN@@, @@PART@@, @@TS@@ ... to fill in): a
    materialization of one partition, or its planned event."""
    import dagster as dg
    from dagster._core.events import AssetMaterializationPlannedData, StepMaterializationData
    from dagster_shared.serdes import serialize_value

    if planned:
        event_type = dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        data = AssetMaterializationPlannedData(asset_key, "@@PART@@")
    else:
        event_type = dg.DagsterEventType.ASSET_MATERIALIZATION
        data = StepMaterializationData(
            dg.AssetMaterialization(
                asset_key=asset_key, partition="@@PART@@", metadata=metadata, tags=tags
            )
        )
    entry = dg.EventLogEntry(
        error_info=None, level="debug", user_message="", run_id="@@RUN@@",
        timestamp=1.5, step_key=step, job_name="__ASSET_JOB",
        dagster_event=dg.DagsterEvent(
            event_type_value=event_type.value, job_name="__ASSET_JOB",
            step_key=step, event_specific_data=data,
        ),
    )
    template = serialize_value(entry).replace('"timestamp": 1.5', '"timestamp": @@TS@@')
    assert "@@TS@@" in template, "the event's serialized form changed"
    return event_type.value, template

class Builder:
    """Writes the rows `store_event` would, from templates Dagster serialized."""

    def __init__(self, instance, today: date, shard_count: int = 1):
        import dagster as dg

        from rastro_assets.defs.keys import fill_key
        from rastro_assets.defs.partitions import spend_shard

        self.dg = dg
        self.instance = instance
        self.today = today
        self.shard_count = shard_count
        self.pairs = [spend_shard(shard).keys for shard in range(shard_count)]
        self.assets = [key for pair in self.pairs for key in pair]
        self.fills = [fill_key(shard) for shard in range(shard_count)]
        self.next_id = 1
        self.events: list[dict] = []
        self.tags: list[dict] = []
        self.runs: list[tuple[str, datetime]] = []
        self.templates = {}
        spend_metadata = {
            "spend": dg.MetadataValue.text("1234.5600 BRL"),
            "rows": dg.MetadataValue.int(48),
            "ads": dg.MetadataValue.int(12),
        }
        spend_tags = {"dagster/partition/account": "@@ACC@@", "dagster/partition/date": "@@DATE@@"}
        fill_metadata = {
            "blocks_read": dg.MetadataValue.int(3),
            "days_read": dg.MetadataValue.int(HISTORY_DAYS),
            "holds": dg.MetadataValue.text("every owed day"),
        }
        for planned in (False, True):
            for asset_key in self.assets:
                self.templates[(asset_key, planned)] = event_template(
                    asset_key, planned, "meta_spend", spend_metadata, spend_tags
                )
            for asset_key in self.fills:
                self.templates[(asset_key, planned)] = event_template(
                    asset_key, planned, asset_key.to_python_identifier(), fill_metadata, None
                )

    def add_run(self, run_id: str, at: datetime) -> None:
        self.runs.append((run_id, at))

    def record(self, run_id: str, account: str, day: date, at: datetime, planned: bool) -> None:
        partition = f"{account}|{day.isoformat()}"
        stamp = at.timestamp()
        naive = at.astimezone(UTC).replace(tzinfo=None)
        for asset_key in self.pairs[shard_of(account, self.shard_count)]:
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

    def record_fill(self, run_id: str, account: str, at: datetime) -> None:
        """The account's `spend_backfill` partition planned and materialized by `run_id`."""
        stamp = at.timestamp()
        naive = at.astimezone(UTC).replace(tzinfo=None)
        asset_key = self.fills[shard_of(account, self.shard_count)]
        for planned in (True, False):
            event_type, template = self.templates[(asset_key, planned)]
            self.events.append(
                {
                    "id": self.next_id,
                    "run_id": run_id,
                    "event": template.replace("@@RUN@@", run_id)
                    .replace("@@PART@@", account)
                    .replace("@@TS@@", repr(stamp)),
                    "dagster_event_type": event_type,
                    "timestamp": naive,
                    "step_key": asset_key.to_python_identifier(),
                    "asset_key": asset_key.to_string(),
                    "partition": account,
                }
            )
            self.next_id += 1

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


def build(instance, accounts: int, now: datetime, history: bool = True,
          year: bool = False, shard_count: int = 1) -> dict:
    """N accounts with 90 days of both spend assets as the product records them.

    `year`: instead, the steady state a year after linking, once retention has run: each
    account-day of the year holds its latest materialization only (from the daily re-sync
    that last covered it), and the last day holds every live-wave recording.
    """
    started = time.perf_counter()
    today = now.date()
    ids = [account_id(n) for n in range(accounts)]
    add_accounts(instance, built_homes(ids, shard_count), shard_count)
    if not history:
        return {"seconds": time.perf_counter() - started, "events": 0, "runs": 0}
    builder = Builder(instance, today, shard_count)
    if year:
        return build_year(builder, ids, now, started)
    rng = random.Random(16)
    link_days = {
        account: today - timedelta(days=rng.randrange(LINK_SPREAD_DAYS)) for account in ids
    }
    # Each shard's accounts linked the same day: one fill backfill, runs of 25 accounts, each
    # recording its accounts' 90 days (newest block first) and then their fill partitions.
    from rastro_assets.defs.keys import FILL_ACCOUNTS_PER_RUN

    together = collections.defaultdict(list)
    for account in ids:
        together[(link_days[account], shard_of(account, shard_count))].append(account)
    for (linked, shard), group in sorted(together.items()):
        first = linked - timedelta(days=HISTORY_DAYS - 1)
        at = datetime.combine(linked, datetime.min.time(), UTC) + timedelta(minutes=1)
        for start in range(0, len(group), FILL_ACCOUNTS_PER_RUN):
            run_id = f"fill-{linked}-{shard}-{start}"
            builder.add_run(run_id, at)
            for account in group[start:start + FILL_ACCOUNTS_PER_RUN]:
                for offset in range(HISTORY_DAYS - 1, -1, -1):
                    builder.record(run_id, account, first + timedelta(days=offset), at,
                                   planned=False)
                builder.record_fill(run_id, account, at)
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
        record_live_waves(builder, linked_by, day, now)
    return finish(builder, started)


def record_live_waves(builder: Builder, accounts: list[str], day: date, now: datetime) -> None:
    """The day's live-wave recordings up to `now`: today and yesterday, every 45 minutes
    from 04:45."""
    daily_at = datetime.combine(day, datetime.min.time(), UTC) + timedelta(hours=4)
    for wave in range(LIVE_RECORDINGS_PER_DAY):
        at = daily_at + timedelta(minutes=45 * (wave + 1))
        if at > now:
            break
        run_id = f"wave-{day}-{wave}"
        builder.add_run(run_id, at)
        for account in accounts:
            for offset in (1, 0):
                builder.record(run_id, account, day - timedelta(days=offset), at, planned=False)


def finish(builder: Builder, started: float) -> dict:
    builder.flush()
    builder.write_runs()
    return {"seconds": time.perf_counter() - started, "events": builder.next_id - 1,
            "runs": len(builder.runs)}


def build_year(builder: Builder, ids: list[str], now: datetime, started: float) -> dict:
    from rastro_assets.defs.keys import FILL_ACCOUNTS_PER_RUN

    today = now.date()
    # Each account's `spend_backfill` partition, materialized at its link a year ago: the
    # latest materialization of a partition outlives retention.
    linked_at = datetime.combine(today - timedelta(days=YEAR_DAYS), datetime.min.time(), UTC)
    for start in range(0, len(ids), FILL_ACCOUNTS_PER_RUN):
        run_id = f"fill-year-{start}"
        builder.add_run(run_id, linked_at)
        for account in ids[start:start + FILL_ACCOUNTS_PER_RUN]:
            builder.record_fill(run_id, account, linked_at)
    for back in range(YEAR_DAYS - 1, 1, -1):
        day = today - timedelta(days=back)
        resynced = day + timedelta(days=min(6, back - 2))
        at = datetime.combine(resynced, datetime.min.time(), UTC) + timedelta(hours=4)
        run_id = f"daily-{resynced}-{day}"
        builder.add_run(run_id, at)
        for account in ids:
            builder.record(run_id, account, day, at, planned=False)
    for back in (1, 0):
        record_live_waves(builder, ids, today - timedelta(days=back), now)
    return finish(builder, started)


def new_accounts(accounts: int, shard_count: int, linked: int = NEW_ACCOUNTS) -> dict[str, int]:
    """The `linked` accounts linked in the same minute, each in the shard `rastro link` gives
    it (`RASTRO_SHARD_ACCOUNTS` as the environment sets it) after the built ones."""
    from rastro_assets import shards
    from rastro_assets.process_settings import Settings

    size = Settings.from_env(os.environ).shard_accounts
    counts = collections.Counter(shard_of(account_id(n), shard_count) for n in range(accounts))
    homes = {}
    for n in range(linked):
        homes[account_id(accounts + n)] = home = shards.shard_for_new_account(
            counts, shard_count, size
        )
        counts[home] += 1
    return homes


def submit_new_accounts(instance, accounts: int, now: datetime, per_account: bool,
                        shard_count: int = 1, linked: int = NEW_ACCOUNTS) -> list[str]:
    """`linked` accounts linked in the same minute, and the backfills `meta_accounts` then
    starts for their 90 days (`fill_request`: one over a shard's owing accounts), submitted
    as the sensor daemon submits a sensor's backfill request."""
    from rastro_assets.defs.cadence.backfills import Fill, fill_request
    from rastro_assets.defs.dagster_private import PartitionBackfill

    today = now.date()
    shards = new_accounts(accounts, shard_count, linked)
    new = list(shards)
    add_accounts(instance, shards, shard_count)
    print(f"  {len(new)} accounts linked together, in "
          f"{len(set(shards.values()))} shard(s): {sorted(set(shards.values()))[:20]}",
          flush=True)
    requests = []
    for shard in sorted(set(shards.values())):
        fills = [Fill(account, "backfill", today - timedelta(days=HISTORY_DAYS - 1), today)
                 for account in new if shards[account] == shard]
        groups = [[fill] for fill in fills] if per_account else [fills]
        requests += [fill_request(group, shard) for group in groups]
    backfill_ids = []
    for number, request in enumerate(requests):
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
    print(f"  {len(backfill_ids)} fill backfill(s) of spend_backfill requested", flush=True)
    return backfill_ids


def measure_daemon(instance, accounts: int, now: datetime, iterations: int,
                   per_account: bool, planned_subset: bool = False,
                   shard_count: int = 1, linked: int = NEW_ACCOUNTS) -> list[tuple[float, float]]:
    """Backfill-daemon iterations after `linked` accounts are linked in the same minute: the
    first submits the runs, the later ones are what each costs while the runs are in flight, and the
    last follows a workspace refresh, which the daemon does every 60 s
    (`RELOAD_WORKSPACE_INTERVAL`): it drops every cached key listing.

    `planned_subset`: the daemon runs with DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS,
    which Dagster reads at each run it creates."""
    import dagster as dg
    from dagster._daemon.backfill import execute_backfill_iteration

    from rastro_assets.defs.dagster_private import BulkActionStatus

    logger = logging.getLogger("bench.backfill")
    logger.setLevel(logging.WARNING)
    previous = os.environ.pop(PLANNED_SUBSET_VARIABLE, None)
    if planned_subset:
        os.environ[PLANNED_SUBSET_VARIABLE] = "true"
    with _world.workspace_context(instance) as context:
        context.create_request_context()  # loads the code location before the clock starts
        backfill_ids = submit_new_accounts(instance, accounts, now, per_account, shard_count,
                                           linked)
        figures = []
        for number in range(iterations):
            refreshed = iterations > 2 and number == iterations - 1
            if refreshed:
                context.refresh_workspace()
            reset_peak()
            before = rss_mb()
            started = time.perf_counter()
            for error in execute_backfill_iteration(context, logger):
                if error is not None:
                    print(f"  backfill daemon error: {error.message.strip()[:300]}")
            seconds = time.perf_counter() - started
            figures.append((seconds, peak_mb() - before))
            runs = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
            what = ("submits the runs" if number == 0 else
                    "after a workspace refresh" if refreshed else "runs in flight")
            print(f"  iteration {len(figures)} ({what}): {seconds:.2f} s, "
                  f"peak +{figures[-1][1]:.0f} MB, {runs} runs queued so far", flush=True)
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
        remove_accounts(instance, new_accounts(accounts, shard_count, linked), shard_count)
    os.environ.pop(PLANNED_SUBSET_VARIABLE, None)
    if previous is not None:
        os.environ[PLANNED_SUBSET_VARIABLE] = previous
    return figures


def measure_retention(instance, now: datetime, backend: str) -> dict:
    from rastro_assets.defs.retention import RUN_RETENTION, RetentionCursor, prune_instance

    index = Path(os.environ["DAGSTER_HOME"]) / "history" / "runs" / "index.db"
    pages_before = _sqlite_pages(index) if backend == "sqlite" else (0, 0)
    started = time.perf_counter()
    tick = prune_instance(instance, now - RUN_RETENTION, RetentionCursor())
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    second = prune_instance(instance, now - RUN_RETENTION, tick.cursor)
    second_seconds = time.perf_counter() - started
    pages_after = _sqlite_pages(index) if backend == "sqlite" else (0, 0)
    space = (f"; index.db free pages {pages_before[1] / 2**20:.0f} -> "
             f"{pages_after[1] / 2**20:.0f} MB (reused by new events)"
             if backend == "sqlite" else "")
    return {
        "space": space,
        "seconds": seconds,
        "events": tick.events_deleted,
        "runs": tick.runs_deleted,
        "second_seconds": second_seconds,
        "second_events": second.events_deleted,
        "second_runs": second.runs_deleted,
    }


def _sqlite_pages(path: Path) -> tuple[int, int]:
    import sqlite3

    with sqlite3.connect(path) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * size, free * size


def measure_writes(instance, accounts: int, today: date,
                   shard_count: int = 1) -> tuple[float, float]:
    import dagster as dg
    from dagster._core.events import StepMaterializationData

    from rastro_assets.defs.keys import AD_SPEND_DAILY

    count = 30
    shard_zero = [account_id(number * shard_count) for number in range(count)]
    started = time.perf_counter()
    for number in range(count):
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=AD_SPEND_DAILY, partition=f"{shard_zero[number]}|{today}",
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
                        asset_key=AD_SPEND_DAILY, partition=f"{shard_zero[number]}|{today}",
                        metadata={"rows": 1},
                    )),
                ),
            )
        )
    in_run = (time.perf_counter() - started) / count
    return runless * 1000, in_run * 1000


def measure_status_cache(instance, shard_count: int = 1) -> dict[str, float]:
    """`get_and_update_asset_status_cache_value`, the path the UI's partition queries take,
    for shard 0's `ad_spend_daily` (every shard holds as many accounts): cold (cache wiped),
    warm (nothing new), and after one account is linked to the shard (its dynamic keys are
    part of the cache's id, so a link discards it)."""
    from dagster._core.storage.partition_status_cache import (
        get_and_update_asset_status_cache_value,
    )

    from rastro_assets import shards
    from rastro_assets.defs.keys import AD_SPEND_DAILY
    from rastro_assets.defs.partitions import spend_partitions

    def update() -> float:
        started = time.perf_counter()
        get_and_update_asset_status_cache_value(instance, AD_SPEND_DAILY, spend_partitions)
        return time.perf_counter() - started

    instance.wipe_asset_cached_status([AD_SPEND_DAILY])
    figures = {"cold": update(), "warm": update()}
    linked = account_id(10**6 * shard_count)
    instance.add_dynamic_partitions(shards.accounts_name(0), [linked])
    try:
        figures["after link"] = update()
    finally:
        instance.delete_dynamic_partition(shards.accounts_name(0), linked)
    update()
    return figures


LIVE_BATCH_KEYS = 10  # AssetGraphLiveQuery's keys per request (ui-core's AssetBaseDataProvider)
HEALTH_BATCH_KEYS = 250  # AssetHealthDataProvider's
PER_ASSET_OPERATIONS = ("PartitionHealthQuery", "AssetViewDefinitionQuery")


def _chunks(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


class UiRound:
    """One pass over the pages an operator opens, as the webserver answers them: wall
    seconds of each request and this process's CPU seconds (the webserver's resolvers and
    status caches run here; the code location only serves definitions)."""

    def __init__(self, context, spend_keys: list[list[str]], lineage_keys: list[list[str]]):
        self.context = context
        self.spend_keys = spend_keys
        self.lineage_keys = lineage_keys

    def _timed(self, name: str, variables: dict) -> tuple[float, float]:
        import _ui

        cpu = time.process_time()
        wall = _ui.run_operation(self.context, name, variables)[0]
        return wall, time.process_time() - cpu

    def run(self, spend_keys: list[list[str]] | None = None) -> dict[str, float]:
        import _ui

        figures: dict[str, float] = {}
        for name in PER_ASSET_OPERATIONS:
            timings = [self._timed(name, _ui.variables_for(name, key))
                       for key in spend_keys or self.spend_keys]
            figures[f"{name} (slowest spend asset)"] = max(wall for wall, _ in timings)
            figures[f"{name} (slowest spend asset, CPU)"] = max(cpu for _, cpu in timings)
            figures[f"{name} (CPU, every spend asset)"] = sum(cpu for _, cpu in timings)
        live = [self._timed("AssetGraphLiveQuery", {"assetKeys": [{"path": k} for k in batch]})
                for batch in _chunks(self.lineage_keys, LIVE_BATCH_KEYS)]
        figures["AssetGraphLiveQuery (slowest batch of 10)"] = max(wall for wall, _ in live)
        figures["AssetGraphLiveQuery (slowest batch of 10, CPU)"] = max(cpu for _, cpu in live)
        figures["lineage, every asset on screen (CPU of its live batches)"] = sum(
            cpu for _, cpu in live)
        health = [self._timed("AssetHealthQuery", {"assetKeys": [{"path": k} for k in batch]})
                  for batch in _chunks(self.lineage_keys, HEALTH_BATCH_KEYS)]
        figures["AssetHealthQuery (slowest batch of 250)"] = max(wall for wall, _ in health)
        wall, cpu = self._timed("AssetCatalogTableQuery",
                                _ui.variables_for("AssetCatalogTableQuery", []))
        figures["AssetCatalogTableQuery"] = wall
        figures["AssetCatalogTableQuery, CPU"] = cpu
        return figures


def measure_ui(instance, shard_count: int = 1) -> dict[str, dict[str, float]]:
    """The UI's own GraphQL operations (bench/ui_queries.graphql) as `dagster-webserver` runs
    them: the partitions page and the definition of every spend asset, the lineage with
    every asset on screen (its live data 10 keys a request, its health 250), and the catalog;
    with every status cache wiped (the first load), warm (the best of two), and the first
    calls after one account is linked to shard 0 (its pair's pages; the lineage whole)."""
    from rastro_assets import shards
    from rastro_assets.definitions import defs
    from rastro_assets.defs.partitions import spend_shard

    pairs = [spend_shard(shard).keys for shard in range(shard_count)]
    spend = [key.path for pair in pairs for key in pair]
    lineage = [key.path for key in sorted(defs.resolve_asset_graph().get_all_asset_keys())]
    with _world.workspace_context(instance) as context:
        context.create_request_context()
        ui = UiRound(context, spend, lineage)
        instance.wipe_asset_cached_status([key for pair in pairs for key in pair])
        cold = ui.run()
        warm = [ui.run() for _ in range(2)]
        linked = account_id((10**6 + 1) * shard_count)
        instance.add_dynamic_partitions(shards.accounts_name(0), [linked])
        try:
            after_link = ui.run([key.path for key in pairs[0]])
        finally:
            instance.delete_dynamic_partition(shards.accounts_name(0), linked)
        ui.run([key.path for key in pairs[0]])
    return {
        "cold": cold,
        "warm": {name: min(w[name] for w in warm) for name in warm[0]},
        "after link": after_link,
    }


def measure_sensor_ticks(instance, accounts: int, directory: Path,
                         shard_count: int = 1) -> dict[str, float]:
    """The two sensors that tick every 30-60 s, on this instance, over a warehouse of the same
    accounts (bench/sensor.py's: 90 days of sync history each), each account stored in the
    shard this instance holds it in."""
    import dagster as dg
    import sensor as sensor_bench

    from rastro_assets.defs.cadence.sensors import (
        build_meta_accounts_sensor,
        build_meta_cadence_sensor,
    )
    from rastro_assets.warehouse.connection import Warehouse
    from rastro_assets_tests.pinned import pinned

    path = directory / f"sensor-{accounts}.duckdb"
    if not path.exists():
        sensor_bench.build(path, accounts)
    with Warehouse(path).connect() as con:
        con.execute("DELETE FROM ad_account_shards")
        con.execute(
            "INSERT INTO ad_account_shards SELECT ad_account_id,"
            " (ad_account_id[5:]::INTEGER - 100000) % $shards FROM meta_ad_accounts",
            {"shards": shard_count},
        )
    # The resource reads its warehouse from the environment only, as a code location does;
    # this runs in a process of its own (`sensor_ticks_in_own_process`).
    os.environ["RASTRO_DUCKDB_PATH"] = str(path)
    rastro = pinned(sensor_bench.NOW)
    figures: dict[str, float] = {}
    meta_cadence_sensor = build_meta_cadence_sensor(shard_count)
    meta_accounts_sensor = build_meta_accounts_sensor(shard_count)
    cursor = None
    for tick in range(3):
        context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                          resources={"rastro": rastro})
        started = time.perf_counter()
        result = meta_cadence_sensor(context)
        seconds = time.perf_counter() - started
        cursor = result.cursor
        figures[f"meta_cadence tick {tick + 1}"] = seconds
    context = dg.build_sensor_context(instance=instance, resources={"rastro": rastro})
    started = time.perf_counter()
    meta_accounts_sensor(context)
    figures["meta_accounts tick"] = time.perf_counter() - started
    return figures


def sensor_ticks_in_own_process(accounts: int, directory: Path,
                                shard_count: int = 1) -> dict[str, float]:
    """`measure_sensor_ticks` in a fresh process, as the daemon evaluates sensors in the code
    server's: this one holds the webserver's heap after the UI queries, and every garbage
    collection walks it (the ticks read 0.3-0.6 s slower here at 5,000 accounts)."""
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        return pool.submit(_sensor_ticks_child, accounts, directory, shard_count).result()


def _sensor_ticks_child(accounts: int, directory: Path, shard_count: int) -> dict[str, float]:
    import dagster as dg

    instance = dg.DagsterInstance.get()
    try:
        return measure_sensor_ticks(instance, accounts, directory, shard_count)
    finally:
        instance.dispose()


def directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1024 / 1024


@contextlib.contextmanager
def instance_home(backend: str, keep: Path | None) -> Iterator[Path]:
    """DAGSTER_HOME for the measured instance: SQLite storage (the repo's default), or
    `docs/dagster.scaled.yaml`'s Postgres storage on a real server started here."""
    import yaml

    config = yaml.safe_load(INSTANCE_YAML)
    if backend == "sqlite":
        home = keep or Path(tempfile.mkdtemp(prefix="rastro-scale-"))
        home.mkdir(parents=True, exist_ok=True)
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
        try:
            yield home
        finally:
            if not keep:
                shutil.rmtree(home, ignore_errors=True)
        return
    from rastro_assets_tests.postgres_server import postgres_server

    scaled = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    with postgres_server() as server, tempfile.TemporaryDirectory(prefix="rastro-scale-") as home:
        os.environ.update(server.env())
        config["storage"] = scaled["storage"]
        Path(home, "dagster.yaml").write_text(yaml.safe_dump(config))
        yield Path(home)


def storage_mb(instance, backend: str, home: Path) -> float:
    if backend == "sqlite":
        return directory_mb(home)
    with instance.event_log_storage.index_connection() as conn:
        size = conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar()
    return size / 1024 / 1024


def ensure_asset_records(instance, shard_count: int) -> None:
    """Each spend and fill asset's row in `asset_keys`, which `store_event` keeps and the
    builder does not write: without it Dagster finds no status cache to read or update, and
    the UI's figures would be of an asset that looks never materialized. Made from the
    asset's latest materialization, as `store_event` would have left it."""
    import dagster as dg
    from dagster._core.storage.event_log.schema import SqlEventLogStorageTable
    from dagster_shared.serdes import deserialize_value

    from rastro_assets.defs.keys import fill_key
    from rastro_assets.defs.partitions import spend_shard

    storage = instance.event_log_storage
    keys = [key for shard in range(shard_count)
            for key in (*spend_shard(shard).keys, fill_key(shard))]
    present = {record.asset_entry.asset_key for record in instance.get_asset_records(keys)}
    for key in keys:
        if key in present:
            continue
        with storage.index_connection() as conn:
            row = conn.execute(
                SqlEventLogStorageTable.select()
                .with_only_columns(SqlEventLogStorageTable.c.id, SqlEventLogStorageTable.c.event)
                .where(SqlEventLogStorageTable.c.asset_key == key.to_string())
                .where(SqlEventLogStorageTable.c.dagster_event_type == "ASSET_MATERIALIZATION")
                .order_by(SqlEventLogStorageTable.c.id.desc())
                .limit(1)
            ).fetchone()
        if row is not None:
            storage.store_asset_event(deserialize_value(row[1], dg.EventLogEntry), row[0])


def after_build(instance, backend: str) -> None:
    """The builder sets event ids itself: move Postgres's sequence past them."""
    if backend != "postgres":
        return
    with instance.event_log_storage.index_transaction() as conn:
        conn.exec_driver_sql(
            "SELECT setval(pg_get_serial_sequence('event_logs', 'id'),"
            " (SELECT max(id) FROM event_logs))"
        )


def status(figure: float, goal: float) -> str:
    return "met" if figure <= goal else f"MISSED by {figure / goal:.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--year", action="store_true")
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--linked", type=int, default=NEW_ACCOUNTS,
                        help="accounts linked together for the backfill daemon's figures (20)")
    parser.add_argument("--per-account", action="store_true",
                        help="one fill backfill per linked account (linked a tick apart)")
    parser.add_argument("--planned-subset", action="store_true")
    parser.add_argument("--partitions-only", action="store_true")
    parser.add_argument("--retention-only", action="store_true")
    parser.add_argument("--no-daemon", action="store_true")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--shards", type=int, default=1,
                        help="RASTRO_ACCOUNT_SHARDS: accounts spread over this many spend pairs")
    args = parser.parse_args()
    if args.keep and args.backend != "sqlite":
        parser.error("--keep keeps a SQLite instance only")
    now = datetime.now(UTC)
    if args.year:
        # The axis a deployment a year old needs: a year, and the 90-day backfill before it.
        axis_start = now.date() - timedelta(days=YEAR_DAYS + HISTORY_DAYS)
        os.environ["RASTRO_PARTITIONS_START"] = axis_start.isoformat()
    os.environ["RASTRO_ACCOUNT_SHARDS"] = str(args.shards)
    accounts = 200 if args.small else args.accounts
    shape = "a year, retention applied" if args.year else "90-day backfills, 30 days of waves"
    print(f"load average {os.getloadavg()[0]:.1f}; {accounts} accounts in {args.shards} "
          f"shard(s) on {args.backend}; history: {shape}", flush=True)

    with instance_home(args.backend, args.keep) as home:
        os.environ["DAGSTER_HOME"] = str(home)
        import dagster as dg

        instance = dg.DagsterInstance.get()
        try:
            measure(instance, args, accounts, now, home)
        finally:
            instance.dispose()


def measure(instance, args, accounts: int, now: datetime, home: Path) -> None:
    if not (home / "built").exists():
        built = build(instance, accounts, now, history=not args.partitions_only, year=args.year,
                      shard_count=args.shards)
        after_build(instance, args.backend)
        (home / "built").write_text(now.isoformat())
        print(f"built {built['events']:,} events and {built['runs']:,} runs "
              f"in {built['seconds']:.0f} s", flush=True)
    ensure_asset_records(instance, args.shards)
    if args.build_only:
        return
    size_mb = storage_mb(instance, args.backend, home)
    if args.retention_only:
        retention = measure_retention(instance, now, args.backend)
        print(f"SCALE retention tick at {accounts:,} accounts: {retention['seconds']:.2f} s, "
              f"{retention['events']:,} events and {retention['runs']:,} runs deleted; next "
              f"{retention['second_seconds']:.2f} s (goal <= {GOAL_RETENTION_SECONDS:.0f} s)")
        return
    runless_ms, in_run_ms = measure_writes(instance, accounts, now.date(), args.shards)
    print(f"write per event: {runless_ms:.1f} ms runless, {in_run_ms:.1f} ms in a run",
          flush=True)
    if args.partitions_only:
        iterations = measure_daemon(instance, accounts, now, args.iterations, args.per_account,
                                    planned_subset=args.planned_subset,
                                    shard_count=args.shards, linked=args.linked)
        submit = iterations[0][0]
        in_flight = max(seconds for seconds, _ in iterations[1:] or iterations)
        peak = max(mb for _, mb in iterations)
        print(f"SCALE backfill daemon, {args.linked:,} accounts linked together beside "
              f"{accounts:,} built, {args.shards} shard(s) (partitions only): the iteration "
              f"that submits "
              f"the runs {submit:.2f} s (goal <= {GOAL_SUBMIT_SECONDS:g} s: "
              f"{status(submit, GOAL_SUBMIT_SECONDS)}); with the runs in flight (slowest) "
              f"{in_flight:.2f} s (goal <= {GOAL_ITERATION_SECONDS:g} s: "
              f"{status(in_flight, GOAL_ITERATION_SECONDS)}); peak +{peak:.0f} MB (goal <= "
              f"{GOAL_ITERATION_MB} MB: {status(peak, GOAL_ITERATION_MB)})")
        return
    goals: list[tuple[str, float, float, str]] = []
    cache = measure_status_cache(instance, args.shards)
    print("status cache (ad_spend_daily): " + ", ".join(
        f"{name} {seconds:.2f} s" for name, seconds in cache.items()), flush=True)
    ui = measure_ui(instance, args.shards)
    for phase, figures in ui.items():
        print(f"UI queries, {phase}:", flush=True)
        for name, seconds in figures.items():
            print(f"    {name}: {seconds:.2f} s", flush=True)
    page = "PartitionHealthQuery (slowest spend asset)"
    live = "AssetGraphLiveQuery (slowest batch of 10)"
    goals.append(("partitions page of every spend asset, warm", ui["warm"][page],
                  GOAL_UI_WARM, "s"))
    goals.append(("the same, first after a link", ui["after link"][page],
                  GOAL_UI_AFTER_LINK, "s"))
    goals.append(("the same, every status cache cold", ui["cold"][page], GOAL_UI_AFTER_LINK, "s"))
    goals.append(("lineage live data, a batch of 10 keys, warm", ui["warm"][live],
                  GOAL_UI_WARM, "s"))
    goals.append(("catalog (AssetCatalogTableQuery), warm", ui["warm"]["AssetCatalogTableQuery"],
                  GOAL_UI_CATALOG, "s"))
    goals.append(("asset definitions (AssetViewDefinitionQuery), warm",
                  ui["warm"]["AssetViewDefinitionQuery (slowest spend asset)"], GOAL_UI_WARM, "s"))
    ticks = sensor_ticks_in_own_process(accounts, home.parent if args.keep else home,
                                        args.shards)
    print("sensor ticks: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in
                                       ticks.items()), flush=True)
    goals.append(("sensor tick (slowest)", max(ticks.values()), GOAL_SENSOR_SECONDS, "s"))
    if args.no_daemon:
        report(goals, accounts, args)
        return
    print("backfill daemon, Dagster's default planned events (one per partition):")
    iterations = measure_daemon(instance, accounts, now, args.iterations, args.per_account,
                                shard_count=args.shards, linked=args.linked)
    print(f"backfill daemon, with {PLANNED_SUBSET_VARIABLE}=true (one per asset a run):")
    subset = measure_daemon(instance, accounts, now, 1, args.per_account, planned_subset=True,
                            shard_count=args.shards, linked=args.linked)
    goals.append(("backfill daemon, the iteration that submits the runs", iterations[0][0],
                  GOAL_SUBMIT_SECONDS, "s"))
    goals.append(("  the same, planned events as one subset a run", subset[0][0],
                  GOAL_SUBMIT_SECONDS, "s"))
    goals.append(("backfill daemon, an iteration with the runs in flight (slowest)",
                  max(seconds for seconds, _ in iterations[1:]), GOAL_ITERATION_SECONDS, "s"))
    goals.append(("backfill daemon iteration peak", max(mb for _, mb in iterations + subset),
                  GOAL_ITERATION_MB, "MB"))
    retention = measure_retention(instance, now, args.backend)
    goals.append(("retention tick", retention["seconds"], GOAL_RETENTION_SECONDS, "s"))

    from rastro_assets.defs.partitions import AXIS_START

    dates = (now.date() - AXIS_START).days + 2
    per_asset = -(-accounts // args.shards)
    print(f"key space: {per_asset:,} accounts x {dates} dates = {per_asset * dates:,} keys per "
          f"spend asset, {args.shards * 2} spend assets")
    print(f"retention tick: {retention['seconds']:.2f} s, deleted {retention['events']:,} "
          f"events and {retention['runs']:,} runs; the next tick "
          f"{retention['second_seconds']:.2f} s ({retention['second_events']:,} events, "
          f"{retention['second_runs']:,} runs){retention['space']}")
    print(f"instance size: {size_mb:,.0f} MB ({size_mb / accounts:.2f} MB per account)")
    report(goals, accounts, args)


def report(goals: list[tuple[str, float, float, str]], accounts: int, args) -> None:
    kind = ("one fill backfill per account" if args.per_account
            else "one fill backfill per shard touched")
    print(f"SCALE at {accounts:,} accounts in {args.shards} shard(s) on {args.backend} ({kind} "
          f"for {args.linked:,} accounts linked together):")
    for name, figure, goal, unit in goals:
        print(f"SCALE   {name}: {figure:.2f} {unit} (goal <= {goal:g} {unit}): "
              f"{status(figure, goal)}")


if __name__ == "__main__":
    main()

"""Records (definitions layer): Dagster's spend grid against the warehouse: what it lacks.

A run records each account-day it wrote as a materialization once the rows are committed.
A worker killed between the two leaves days the warehouse holds, read completely, that
Dagster shows as missing; and a later read that changes nothing records nothing (a wave
records changed days only, and days past the weekly re-sync are never read again). This
module finds those days (`missing_records`), and the `spend_backfill` partitions of
accounts the planner owes no fill, whatever ran their blocks (a killed fill run, or an
install older than the fill asset); and builds their runless materializations, whose
metadata says they were `recorded_from` the warehouse and which sync read the day. The
`meta_records` sensor (`recorder.py`) records them; `rastro status --check` and the
`meta_account_health` run count them.

What is never counted: a day of a sync whose Dagster run is still in flight (that run
records its own), a day a sync left incomplete (`META_TRUNCATED`) unless another read it
whole, and a day before the date axis or after the account's local today. An account its
shard's `meta_ad_account` partitions do not hold yet is counted apart (`unplaced`): none
of its days can be recorded until `meta_accounts` adds it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.cadence.busy import LAUNCHED_STATUSES, outlived
from rastro_assets.defs.keys import META_ACCOUNT_HEALTH, fill_key
from rastro_assets.defs.partitions import (
    AXIS_START,
    reach_start,
    spend_shard,
)
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.planner.records import StoredDay, owes_no_fill, stored_days
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse.complete_reads import CompleteDay, complete_days
from rastro_assets.warehouse.connection import Connection, Warehouse

PARTITIONS_PER_QUERY = 2_000
"""Partition keys one query of the instance names (a bound parameter each)."""
RUN_IDS_PER_QUERY = 500
"""Run ids one query of the instance names."""
RECORD_GRACE = timedelta(minutes=60)
"""How long a stored day may wait for `meta_records` before `rastro status --check` reports
it: the sensor compares a failed run's accounts a tick after run monitoring fails it, and
its first walk goes over 12,000 accounts in an hour."""

RECORDED_FROM = "recorded_from"
WAREHOUSE = "warehouse"
SYNC_RUN_ID = "sync_run_id"
UNRECORDED = "unrecorded"
"""`meta_account_health`'s entry: stored account-days not recorded."""
UNRECORDED_DAYS = "unrecorded_days"
UNRECORDED_ACCOUNTS = "unrecorded_accounts"


@dataclass(frozen=True)
class MissingDay:
    """A stored account-day whose partition of `asset_key` has no materialization."""

    asset_key: dg.AssetKey
    ad_account_id: str
    stored: StoredDay

    @property
    def partition(self) -> str:
        return partition_key(self.ad_account_id, self.stored.day)


@dataclass
class MissingRecords:
    """What the instance lacks of what the warehouse holds, for some accounts."""

    days: list[MissingDay] = field(default_factory=list)
    """By account, then day, then asset."""
    fills: list[tuple[dg.AssetKey, str]] = field(default_factory=list)
    """(fill asset, account) of each account owed no fill whose partition is not recorded."""
    unplaced: dict[str, list[StoredDay]] = field(default_factory=dict)
    """Stored days of each account its shard's partitions do not hold (yet): none of them
    can show as materialized, and `meta_accounts` adds the account at its next tick."""

    def account_days(self, stored_before_us: int | None = None) -> dict[str, int]:
        """Per account, its stored days that lack a record in either spend asset, or that
        no partition can hold yet (of those first stored before `stored_before_us`, when
        given)."""
        days: dict[str, set[date]] = {}
        found = [(m.ad_account_id, m.stored) for m in self.days] + [
            (account, stored) for account, all_days in self.unplaced.items()
            for stored in all_days
        ]
        for account, stored in found:
            if stored_before_us is None or stored.stored_since_us < stored_before_us:
                days.setdefault(account, set()).add(stored.day)
        return {account: len(each) for account, each in days.items()}


WRITING_STATUSES = [*LAUNCHED_STATUSES, dg.DagsterRunStatus.CANCELING]
"""Runs that may be writing. A queued run has written nothing yet, and a UI backfill queues
thousands: they are never read."""


def runs_in_flight(instance: dg.DagsterInstance, now_seconds: float | None = None) -> set[str]:
    """The runs that may still write and record: started and younger than their maximum
    runtime (a killed worker leaves its run `STARTED` until run monitoring fails it, as
    `cadence.busy` reads it too)."""
    now_seconds = time.time() if now_seconds is None else now_seconds
    return {
        record.dagster_run.run_id
        for record in instance.get_run_records(filters=dg.RunsFilter(statuses=WRITING_STATUSES))
        if not outlived(record, now_seconds)
    }


def ended_without_success(
    instance: dg.DagsterInstance, syncs: Sequence[tuple[str, str]], in_flight: Collection[str]
) -> list[str]:
    """The accounts of `syncs` (account, run id) whose run is no longer in flight and did not
    succeed (failed, canceled, killed, or gone): the runs that may have stored days without
    recording them. A run that succeeded recorded every block it wrote."""
    run_ids = sorted({run_id for _, run_id in syncs if run_id not in in_flight})
    succeeded: set[str] = set()
    for start in range(0, len(run_ids), RUN_IDS_PER_QUERY):
        chunk = run_ids[start : start + RUN_IDS_PER_QUERY]
        records = instance.get_run_records(
            filters=dg.RunsFilter(run_ids=chunk, statuses=[dg.DagsterRunStatus.SUCCESS])
        )
        succeeded.update(record.dagster_run.run_id for record in records)
    return sorted(
        {account for account, run_id in syncs if run_id in run_ids and run_id not in succeeded}
    )



@dataclass(frozen=True)
class Stored:
    """What the warehouse says of some linked accounts: their plans' inputs and the days
    finished ok syncs read completely."""

    accounts: list[PlannedAccount]
    complete: list[CompleteDay]


def read_stored(
    con: Connection, in_flight: Collection[str], ad_account_ids: Sequence[str] | None = None
) -> Stored:
    """The linked accounts (of those named, or all) and their completely read days, leaving
    out the syncs of the runs `in_flight`."""
    accounts = planned_accounts(con, ad_account_ids)
    ids = [account.ad_account_id for account in accounts]
    complete = complete_days(
        con, AXIS_START, ad_account_ids=ids if ad_account_ids is not None else None,
        excluded_run_ids=in_flight,
    )
    return Stored(accounts, complete)


def missing_records(
    instance: dg.DagsterInstance,
    stored: Stored,
    now: datetime,
    in_flight: Collection[str],
    shard_count: int,
) -> MissingRecords:
    """The stored account-days and the fills owed nothing that the instance does not show as
    materialized, among the accounts of `stored` that are in their shard's partitions."""
    timezones = {a.ad_account_id: a.state.timezone for a in stored.accounts}
    days = stored_days(stored.complete, timezones, now, AXIS_START)
    missing = MissingRecords()
    by_shard: dict[int, list[PlannedAccount]] = {}
    for account in stored.accounts:
        if account.shard < shard_count:
            by_shard.setdefault(account.shard, []).append(account)
    for shard, members in sorted(by_shard.items()):
        placed = set(instance.get_dynamic_partitions(shards.accounts_name(shard)))
        missing.unplaced.update(
            {
                a.ad_account_id: days[a.ad_account_id]
                for a in members
                if a.ad_account_id not in placed and days.get(a.ad_account_id)
            }
        )
        members = [a for a in members if a.ad_account_id in placed]
        keys = {
            partition_key(a.ad_account_id, d.day): (a.ad_account_id, d)
            for a in members
            for d in days.get(a.ad_account_id, ())
        }
        # Every account of the shard asked: one read of the asset's keys beats many lookups.
        whole = len(members) == len(placed)
        lacking = {
            asset_key: set(keys) - recorded_partitions(instance, asset_key, keys, whole=whole)
            for asset_key in spend_shard(shard).keys
        }
        for key, (account, day) in keys.items():
            for asset_key in spend_shard(shard).keys:
                if key in lacking[asset_key]:
                    missing.days.append(MissingDay(asset_key, account, day))
        fill = fill_key(shard)
        unfilled = {a.ad_account_id for a in members} - recorded_partitions(
            instance, fill, {a.ad_account_id for a in members}
        )
        missing.fills += [
            (fill, a.ad_account_id)
            for a in members
            if a.ad_account_id in unfilled and _owes_no_fill(a, now, in_flight)
        ]
    missing.days.sort(key=lambda m: (m.ad_account_id, m.stored.day, m.asset_key.path))
    return missing


def _owes_no_fill(account: PlannedAccount, now: datetime, in_flight: Collection[str]) -> bool:
    first = reach_start(local_date(now, account.state.timezone))
    return owes_no_fill(account.state, now, first, in_flight)


def partition_key(ad_account_id: str, day: date) -> str:
    """`str(spend_partition_key(ad_account_id, day))`, without building the key object: a
    pass over a shard builds tens of thousands."""
    return f"{ad_account_id}|{day.isoformat()}"


def recorded_partitions(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    partitions: Collection[str],
    *,
    whole: bool = False,
) -> set[str]:
    """Of `partitions`, those the asset has a materialization of. `whole`: `partitions` are
    about all the asset holds, so one read of every materialized key costs less than looking
    them up."""
    if not partitions:
        return set()
    if whole and len(partitions) > PARTITIONS_PER_QUERY:
        return instance.get_materialized_partitions(asset_key) & set(partitions)
    found: set[str] = set()
    ordered = sorted(partitions)
    for start in range(0, len(ordered), PARTITIONS_PER_QUERY):
        found.update(
            instance.get_latest_storage_id_by_partition(
                asset_key,
                dg.DagsterEventType.ASSET_MATERIALIZATION,
                partitions=set(ordered[start : start + PARTITIONS_PER_QUERY]),
            )
        )
    return found


def record_events(missing: MissingRecords) -> list[dg.AssetMaterialization]:
    """A runless materialization for each missing record, its metadata naming its source."""
    events = [
        dg.AssetMaterialization(
            asset_key=day.asset_key,
            partition=day.partition,
            metadata={RECORDED_FROM: WAREHOUSE, SYNC_RUN_ID: day.stored.run_id},
        )
        for day in missing.days
    ]
    events += [
        dg.AssetMaterialization(
            asset_key=asset_key,
            partition=account,
            metadata={
                RECORDED_FROM: WAREHOUSE,
                "holds": "every owed day, read by runs that ended before recording it",
            },
        )
        for asset_key, account in missing.fills
    ]
    return events


def stored_not_recorded(
    instance: dg.DagsterInstance,
    warehouse: Warehouse,
    now: datetime,
    shard_count: int,
) -> MissingRecords:
    """What the instance lacks of what the warehouse holds, over every linked account.

    The warehouse is open only while it is read, never while the instance is asked.
    """
    in_flight = runs_in_flight(instance)
    with warehouse.connect(read_only=True) as con:
        stored = read_stored(con, in_flight)
    return missing_records(instance, stored, now, in_flight, shard_count)


def latest_unrecorded(instance: dg.DagsterInstance) -> int | None:
    """The account-days `meta_records` last found stored but not recorded, or None when it
    has not said."""
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=META_ACCOUNT_HEALTH), limit=5
    ).records
    for record in records:
        observation = record.asset_observation
        value = observation.metadata.get(UNRECORDED_DAYS) if observation else None
        if value is not None:
            return int(value.value)
    return None

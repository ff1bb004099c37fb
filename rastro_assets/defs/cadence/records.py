"""`meta_records`: Dagster's record of the spend grid follows the warehouse, after any crash.

A run records each account-day it wrote as a materialization once the rows are committed.
A worker killed between the two leaves days the warehouse holds, read completely, that
Dagster shows as missing; and a later read that changes nothing records nothing (a wave
records changed days only, and days past the weekly re-sync are never read again). So
this sensor compares the two, a slice of accounts each tick, and records each such day of
both spend assets as a runless materialization that says it was `recorded_from` the
warehouse and which sync read it; nothing is read from Meta. It also records the
`spend_backfill` partition of each account the planner owes no fill, whatever ran its
blocks (a killed fill run, or an install older than the fill asset).

What it never records: a day of a sync whose Dagster run is still in flight (that run
records its own), a day a sync left incomplete (`META_TRUNCATED`) unless another read it
whole, a day before the date axis or after the account's local today, and an account that
is not among its shard's `meta_ad_account` partitions yet.

The cost of a tick is bounded whatever the install's size: `ACCOUNTS_PER_TICK` accounts
(their complete days from the warehouse, then their partitions' latest materialization
ids from the instance, a query per asset and chunk of keys) and at most
`EVENTS_PER_TICK` events, each of which the daemon stores as one write. The cursor says
where the walk over the accounts stands, and how many account-days each account visited
still lacked; their total goes to `meta_account_health` as an observation whenever it
changes, and `rastro status --check` counts the same days itself (`missing_records`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.keys import (
    DEFAULT_MAX_RUNTIME_SECONDS,
    IN_FLIGHT_STATUSES,
    MAX_RUNTIME_TAG,
    META_ACCOUNT_HEALTH,
    SENSOR_LOCK_WAIT_SECONDS,
    fill_key,
)
from rastro_assets.defs.partitions import (
    AXIS_START,
    SHARD_COUNT,
    reach_start,
    spend_shard,
)
from rastro_assets.defs.resources import RastroResource
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.planner.records import StoredDay, owes_no_fill, stored_days
from rastro_assets.settings import SENSOR_INTERVAL_OVERRIDE_SECONDS
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse.complete_reads import CompleteDay, complete_days
from rastro_assets.warehouse.connection import Connection, Warehouse, WarehouseLocked
from rastro_assets.warehouse.shard_store import account_shards

RECORDS_SENSOR = "meta_records"
RECORDS_SENSOR_SECONDS = SENSOR_INTERVAL_OVERRIDE_SECONDS or 60
ACCOUNTS_PER_TICK = 200
"""Accounts a tick compares: a shard's worth or two, so a tick's queries stay near a second
at any number of accounts (docs/growing.md); every account is visited once per
accounts / 200 ticks."""
EVENTS_PER_TICK = 1_000
"""Materializations a tick records at most: the daemon stores each as one write (~10 ms on
SQLite), after the tick, on the sensor's thread. What is left waits for the next tick."""
PARTITIONS_PER_QUERY = 2_000
"""Partition keys one query of the instance names (a bound parameter each)."""
RECORD_GRACE = timedelta(minutes=60)
"""How long a stored day may wait for `meta_records` before `rastro status --check` reports
it: a sweep over 12,000 accounts at one tick a minute."""

RECORDED_FROM = "recorded_from"
WAREHOUSE = "warehouse"
SYNC_RUN_ID = "sync_run_id"
UNRECORDED = "unrecorded"
"""`meta_account_health`'s entry: stored account-days not recorded."""
UNRECORDED_DAYS = "unrecorded_days"
UNRECORDED_ACCOUNTS = "unrecorded_accounts"


# -- What is missing ------------------------------------------------------------------------


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


def runs_in_flight(instance: dg.DagsterInstance, now_seconds: float | None = None) -> set[str]:
    """The runs that may still write and record: queued or going, and younger than their
    maximum runtime (a killed worker leaves its run `STARTED` until run monitoring fails it,
    as `cadence.busy` reads it too)."""
    now_seconds = time.time() if now_seconds is None else now_seconds
    going = set()
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES)):
        limit = float(record.dagster_run.tags.get(MAX_RUNTIME_TAG) or DEFAULT_MAX_RUNTIME_SECONDS)
        if record.start_time is None or now_seconds - record.start_time <= limit:
            going.add(record.dagster_run.run_id)
    return going


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
    shard_count: int = SHARD_COUNT,
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
    shard_count: int = SHARD_COUNT,
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


# -- The sensor -----------------------------------------------------------------------------


@dataclass
class RecordsCursor:
    """Where the walk over the accounts stands, and what each account visited still lacks."""

    after: str = ""
    """The last account compared; the next tick starts after it ("" for the first)."""
    unrecorded: dict[str, int] = field(default_factory=dict)
    """Account-days each account lacked when last visited, after that tick's records."""
    reported: int | None = None
    """The total last reported to `meta_account_health`."""

    @classmethod
    def from_json(cls, text: str | None) -> RecordsCursor:
        try:
            raw = json.loads(text or "{}")
            return cls(
                after=str(raw.get("after", "")),
                unrecorded={str(k): int(v) for k, v in raw.get("unrecorded", {}).items()},
                reported=None if raw.get("reported") is None else int(raw["reported"]),
            )
        except (ValueError, TypeError, AttributeError):
            return cls()

    def to_json(self) -> str:
        return json.dumps(
            {"after": self.after, "unrecorded": self.unrecorded, "reported": self.reported},
            sort_keys=True,
        )


def next_slice(ids: Sequence[str], after: str, size: int) -> tuple[list[str], str]:
    """The next `size` accounts of `ids` (sorted) after `after`, wrapping to the first once
    every account was visited; and the cursor's next `after` ("" once the last is in it)."""
    rest = [account for account in ids if account > after] or list(ids)
    chosen = rest[:size]
    return chosen, ("" if not chosen or chosen[-1] == ids[-1] else chosen[-1])


def _within(missing: MissingRecords, limit: int) -> MissingRecords:
    """The records of whole accounts, in order, that fit `limit` events; when the first
    account alone has more, its first `limit`."""
    by_account: dict[str, list[MissingDay]] = {}
    for day in missing.days:
        by_account.setdefault(day.ad_account_id, []).append(day)
    fills = {account: key for key, account in missing.fills}
    kept = MissingRecords()
    for account in sorted(set(by_account) | set(fills)):
        days = by_account.get(account, [])
        room = limit - len(kept.days) - len(kept.fills)
        if len(days) + (account in fills) > room:
            if not kept.days and not kept.fills:
                kept.days += days[:room]
            break
        kept.days += days
        if account in fills:
            kept.fills.append((fills[account], account))
    return kept


def _left(missing: MissingRecords, kept: MissingRecords) -> MissingRecords:
    recorded = {(d.asset_key, d.ad_account_id, d.stored.day) for d in kept.days}
    return MissingRecords(
        days=[d for d in missing.days if (d.asset_key, d.ad_account_id, d.stored.day)
              not in recorded],
        fills=[fill for fill in missing.fills if fill not in kept.fills],
        unplaced=missing.unplaced,
    )


def records_tick(
    context: dg.SensorEvaluationContext, rastro: RastroResource, shard_count: int
) -> dg.SensorResult | dg.SkipReason:
    now = rastro.clock()()
    cursor = RecordsCursor.from_json(context.cursor)
    in_flight = runs_in_flight(context.instance)
    warehouse = rastro.warehouse()
    warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
    try:
        with warehouse.connect(read_only=True) as con:
            ids = sorted(account_shards(con))
            chosen, after = next_slice(ids, cursor.after, ACCOUNTS_PER_TICK)
            stored = read_stored(con, in_flight, chosen)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    missing = missing_records(context.instance, stored, now, in_flight, shard_count)
    kept = _within(missing, EVENTS_PER_TICK)
    left = _left(missing, kept)
    pending = sorted({d.ad_account_id for d in left.days} | {a for _, a in left.fills})
    if pending:
        # The next tick starts with the first account this one could not finish.
        after = max((account for account in ids if account < pending[0]), default="")
    unrecorded = {
        account: count
        for account, count in cursor.unrecorded.items()
        if account not in chosen and account in ids
    }
    unrecorded.update(left.account_days())
    total = sum(unrecorded.values())
    events: list[dg.AssetMaterialization | dg.AssetObservation] = [*record_events(kept)]
    if total != cursor.reported:
        events.append(
            dg.AssetObservation(
                asset_key=META_ACCOUNT_HEALTH,
                description="Account-days the warehouse holds that Dagster does not show as "
                "materialized yet, as meta_records last found them",
                metadata={UNRECORDED_DAYS: total, UNRECORDED_ACCOUNTS: len(unrecorded)},
            )
        )
    return dg.SensorResult(
        asset_events=events,
        cursor=RecordsCursor(after, unrecorded, total).to_json(),
        skip_reason=_summary(kept, chosen, total),
    )


def _summary(kept: MissingRecords, chosen: Sequence[str], total: int) -> str:
    span = f"{chosen[0]} .. {chosen[-1]}" if chosen else "no linked accounts"
    days = len({(d.ad_account_id, d.stored.day) for d in kept.days})
    done = (
        f"recorded {days} stored account-days and {len(kept.fills)} fills from the warehouse"
        if days or kept.fills
        else "every stored account-day recorded"
    )
    later = f"; {total} stored account-days not recorded yet" if total else ""
    return f"{span}: {done}{later}"


def build_meta_records_sensor(shard_count: int) -> dg.SensorDefinition:
    """`meta_records` over the spend pairs and fills of `shard_count` shards."""

    @dg.sensor(
        name=RECORDS_SENSOR,
        minimum_interval_seconds=RECORDS_SENSOR_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Records, from the warehouse and without reading Meta, each account-day "
        "a finished sync read completely that the spend assets do not show as materialized "
        "(a run killed between its write and its events), and the spend_backfill partition "
        f"of each account that owes no fill; {ACCOUNTS_PER_TICK} accounts a tick, at most "
        f"{EVENTS_PER_TICK} events. Each event's metadata says recorded_from: warehouse and "
        "the sync_run_id that read the day.",
    )
    def meta_records_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return records_tick(context, rastro, shard_count)

    return meta_records_sensor


meta_records_sensor = build_meta_records_sensor(SHARD_COUNT)


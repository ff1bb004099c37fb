"""`meta_records`: Dagster's record of the spend grid follows the warehouse, after any crash.

Each tick compares a slice of accounts (`records.missing_records`) and records what the
instance lacks as runless materializations, from the warehouse, without reading Meta.
Its cost is bounded whatever the install's size: `ACCOUNTS_PER_TICK` accounts (their
complete days from the warehouse, then their partitions' latest materialization ids from
the instance, a query per asset and chunk of keys) and at most `EVENTS_PER_TICK` events,
each of which the daemon stores as one write. The cursor says where the walk over the
accounts stands, and how many account-days each account visited still lacked; their total
goes to `meta_account_health` as an observation whenever it changes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import dagster as dg

from rastro_assets.defs.cadence.records import (
    UNRECORDED_ACCOUNTS,
    UNRECORDED_DAYS,
    MissingDay,
    MissingRecords,
    missing_records,
    read_stored,
    record_events,
    runs_in_flight,
)
from rastro_assets.defs.keys import META_ACCOUNT_HEALTH, SENSOR_LOCK_WAIT_SECONDS
from rastro_assets.defs.partitions import SHARD_COUNT
from rastro_assets.defs.resources import RastroResource
from rastro_assets.settings import SENSOR_INTERVAL_OVERRIDE_SECONDS
from rastro_assets.warehouse.connection import WarehouseLocked
from rastro_assets.warehouse.shard_store import account_shards

RECORDS_SENSOR = "meta_records"
RECORDS_SENSOR_SECONDS = max(SENSOR_INTERVAL_OVERRIDE_SECONDS, 60)
"""A shorter override (tests, demos) would not make a crash's records come much sooner, but
its every tick would open the warehouse beside the syncs it is there to speed up."""
ACCOUNTS_PER_TICK = 200
"""Accounts a tick compares: a shard's worth or two, so a tick stays near two CPU seconds
at any number of accounts (docs/cadence.md); every account is visited once per
accounts / 200 ticks."""
EVENTS_PER_TICK = 1_000
"""Materializations a tick records at most: the daemon stores each as one write (~10 ms on
SQLite), after the tick, on the sensor's thread. What is left waits for the next tick."""


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


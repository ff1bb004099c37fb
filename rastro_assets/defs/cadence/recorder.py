"""`meta_records`: Dagster's record of the spend grid follows the warehouse, after any crash.

Each tick compares some accounts (`records.missing_records`) and records what the instance
lacks as runless materializations, from the warehouse, without reading Meta. An account
costs about ten milliseconds to compare (its complete days from the warehouse, then its
partitions' latest materialization ids from the instance), so the tick picks them:
- suspects, every tick: the accounts of ok syncs finished within `SUSPECT_WINDOW` whose run
  ended without success (a worker killed between its commit and its events), so a crash's
  days are recorded within a tick or two of run monitoring failing the run;
- a walk over every account, for what no recent run explains (an install older than the
  fill asset, a run gone from the instance): `ACCOUNTS_PER_TICK` a tick until it has been
  round once, then a share that takes it round once every `WALK_SECONDS`, so that keeping
  the record costs a few visits an account a day, not one a few minutes.
At most `EVENTS_PER_TICK` events a tick, each of which the daemon stores as one write. The
cursor says where the walk stands, whether it has been round, and how many account-days
each account visited still lacked; their total goes to `meta_account_health` as an
observation whenever it changes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import dagster as dg

from rastro_assets.defs.cadence.records import (
    UNRECORDED_ACCOUNTS,
    UNRECORDED_DAYS,
    MissingDay,
    MissingRecords,
    ended_without_success,
    missing_records,
    read_stored,
    record_events,
    runs_in_flight,
)
from rastro_assets.defs.keys import (
    DEFAULT_MAX_RUNTIME_SECONDS,
    META_ACCOUNT_HEALTH,
    SENSOR_LOCK_WAIT_SECONDS,
)
from rastro_assets.defs.resources import RastroResource
from rastro_assets.settings import load_time
from rastro_assets.warehouse.complete_reads import recent_ok_syncs
from rastro_assets.warehouse.connection import WarehouseLocked
from rastro_assets.warehouse.shard_store import account_shards

RECORDS_SENSOR = "meta_records"
RECORDS_SENSOR_SECONDS = max(load_time().sensor_interval_override_seconds, 60)
"""A shorter override (tests, demos) would not make a crash's records come much sooner, but
its every tick would open the warehouse beside the syncs it is there to speed up."""
ACCOUNTS_PER_TICK = 200
"""Accounts a tick compares at most, suspects and walk together: a shard's worth or two, so
a tick stays near two CPU seconds at any number of accounts (docs/cadence.md)."""
WALK_SECONDS = 6 * 60 * 60
"""How long the walk takes to go round every account once it has been round the first time."""
SUSPECT_WINDOW = timedelta(seconds=DEFAULT_MAX_RUNTIME_SECONDS) + timedelta(hours=1)
"""How far back a tick looks for syncs of runs that ended without success: a killed run
counts as in flight until its maximum runtime, and run monitoring fails it at a later poll."""
EVENTS_PER_TICK = 1_000
"""Materializations a tick records at most: the daemon stores each as one write (~10 ms on
SQLite), after the tick, on the sensor's thread. What is left waits for the next tick."""


@dataclass
class RecordsCursor:
    """Where the walk over the accounts stands, and what each account visited still lacks."""

    after: str = ""
    """The last account the walk compared; the next tick starts after it ("" for the first)."""
    walked: bool = False
    """Whether the walk has been round every account once."""
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
                walked=bool(raw.get("walked", False)),
                unrecorded={str(k): int(v) for k, v in raw.get("unrecorded", {}).items()},
                reported=None if raw.get("reported") is None else int(raw["reported"]),
            )
        except (ValueError, TypeError, AttributeError):
            return cls()

    def to_json(self) -> str:
        return json.dumps(
            {
                "after": self.after,
                "walked": self.walked,
                "unrecorded": self.unrecorded,
                "reported": self.reported,
            },
            sort_keys=True,
        )


def next_slice(ids: Sequence[str], after: str, size: int) -> tuple[list[str], str]:
    """The next `size` accounts of `ids` (sorted) after `after`, wrapping to the first once
    every account was visited; and the cursor's next `after` ("" once the last is in it)."""
    rest = [account for account in ids if account > after] or list(ids)
    chosen = rest[:size]
    return chosen, ("" if not chosen or chosen[-1] == ids[-1] else chosen[-1])


def walk_share(accounts: int, walked: bool) -> int:
    """Accounts the walk takes this tick: `ACCOUNTS_PER_TICK` until it has been round once,
    then its share of going round every `WALK_SECONDS`."""
    if not walked:
        return ACCOUNTS_PER_TICK
    return min(ACCOUNTS_PER_TICK, math.ceil(accounts * RECORDS_SENSOR_SECONDS / WALK_SECONDS))


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
    # The warehouse is open only while it is read, never while the instance is asked: a
    # reader holds off every writer of the file.
    try:
        with warehouse.connect(read_only=True) as con:
            ids = sorted(account_shards(con))
            recent = recent_ok_syncs(con, now - SUSPECT_WINDOW)
        walk, after = next_slice(ids, cursor.after, walk_share(len(ids), cursor.walked))
        linked = set(ids)
        suspects = [
            account
            for account in ended_without_success(context.instance, recent, in_flight)
            if account in linked
        ]
        chosen = sorted({*walk, *suspects[:ACCOUNTS_PER_TICK]})
        with warehouse.connect(read_only=True) as con:
            stored = read_stored(con, in_flight, chosen)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    walked = cursor.walked or (bool(walk) and after == "")
    missing = missing_records(context.instance, stored, now, in_flight, shard_count)
    kept = _within(missing, EVENTS_PER_TICK)
    left = _left(missing, kept)
    pending = sorted(
        account
        for account in {d.ad_account_id for d in left.days} | {a for _, a in left.fills}
        if account in walk
    )
    if pending:
        # The walk's next tick starts with the first account this one could not finish; a
        # suspect left unfinished is a suspect again at the next tick.
        after = max((account for account in ids if account < pending[0]), default="")
        walked = cursor.walked
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
        cursor=RecordsCursor(after, walked, unrecorded, total).to_json(),
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
        "of each account that owes no fill. It compares the accounts of runs that ended "
        "without success at once, and walks every account once every "
        f"{WALK_SECONDS // 3600} hours; at most {EVENTS_PER_TICK} events a tick. Each "
        "event's metadata says recorded_from: warehouse and "
        "the sync_run_id that read the day.",
    )
    def meta_records_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return records_tick(context, rastro, shard_count)

    return meta_records_sensor


def location_defs(shard_count: int) -> dg.Definitions:
    return dg.Definitions(sensors=[build_meta_records_sensor(shard_count)])


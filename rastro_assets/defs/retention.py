"""Retention: the instance and `meta_sync_runs` stay small over years of cadence.

Dagster OSS keeps every run and every event. At thousands of accounts the
live waves record each account-day many times (today and yesterday every
45 minutes, then the daily and weekly re-syncs), and each recording is a row
in the event log's index (`event_logs`, plus its `asset_event_tags`). The
partition grid needs only the newest of them: a partition is materialized
when it has any materialization, shows the newest one's metadata, and has
failed when a planned event newer than its newest materialization belongs
to a failed run. So the hourly sensor deletes, among asset events older than
the retention age, each one a newer event of the same asset and partition
supersedes:

- a materialization or observation, once a newer one of the same kind exists;
- a planned event, once a newer planned event or materialization exists.

What the UI shows of every partition stays as it was, and an asset's event
history keeps its newest entry per partition. Finished runs older than the
retention age that no longer hold any asset event then go with
`instance.delete_run` (their run record, tags and log), and on SQLite their
per-run event file too; a run that still holds some partition's newest event
keeps its record and log, so the grid's link to it works.

The run-based rule this replaces kept every run holding any partition's latest
materialization: a backfill run or a wave holds some, so almost nothing went,
and finding the holders read every latest-materialization record (far past a
tick's budget at thousands of accounts, bench/README.md). This one walks the
event ids in windows from a cursor and stops starting new windows, or deleting
runs, once `TICK_BUDGET_SECONDS` are spent, so a tick costs the same at any
size; what is left waits for the next tick. A window's newest events may be
superseded only later, so the walk starts over once it reaches the retention
age. On SQLite the freed pages are reused by new events (the file stops
growing; `VACUUM` with the daemon stopped shrinks it); on Postgres autovacuum
reuses them.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import sqlalchemy as sa

from rastro_assets.defs.dagster_private import (
    AssetEventTagsTable,
    SqlEventLogStorage,
    SqlEventLogStorageTable,
)
from rastro_assets.defs.resources import RastroResource
from rastro_assets.planner.rules import GAP_AFTER
from rastro_assets.settings import load_time, load_time_refusals
from rastro_assets.warehouse.connection import WarehouseLocked
from rastro_assets.warehouse.runs import prune_sync_runs

RETENTION_SENSOR_SECONDS = load_time().retention.sensor_seconds
RUN_RETENTION = load_time().retention.runs
SYNC_RUN_RETENTION = load_time().retention.sync_runs
EVENT_IDS_PER_TICK = 400_000
EVENT_IDS_PER_STATEMENT = 5_000
IDS_PER_DELETE = 5_000
MAX_RUNS_DELETED_PER_TICK = 200
# The work a tick may do, far below the daemon's 60 s sensor timeout; what is left
# waits for the next tick, from the cursor.
TICK_BUDGET_SECONDS = 6.0
EVENT_BUDGET_SHARE = 0.6
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
MATERIALIZATION = dg.DagsterEventType.ASSET_MATERIALIZATION.value
PLANNED = dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED.value
OBSERVATION = dg.DagsterEventType.ASSET_OBSERVATION.value
PARTITION_EVENTS = (MATERIALIZATION, PLANNED, OBSERVATION)


@dataclass(frozen=True)
class RetentionCursor:
    """Where the walks over event ids and run creation times stand (0 / None: start over)."""

    event_id: int = 0
    run_created: datetime | None = None

    def to_json(self) -> str:
        created = self.run_created.isoformat() if self.run_created else None
        return json.dumps({"event_id": self.event_id, "run_created": created})

    @classmethod
    def from_json(cls, raw: str | None) -> "RetentionCursor":
        if not raw:
            return cls()
        data = json.loads(raw)
        created = data.get("run_created")
        run_created = datetime.fromisoformat(created) if created else None
        return cls(int(data.get("event_id") or 0), run_created)


@dataclass(frozen=True)
class RetentionTick:
    events_deleted: int
    runs_deleted: int
    cursor: RetentionCursor


def prune_instance(
    instance: dg.DagsterInstance,
    older_than: datetime,
    cursor: RetentionCursor = RetentionCursor(),
    event_ids: int = EVENT_IDS_PER_TICK,
    max_runs: int = MAX_RUNS_DELETED_PER_TICK,
    budget_seconds: float = TICK_BUDGET_SECONDS,
    timer: Callable[[], float] = time.monotonic,
) -> RetentionTick:
    """One tick: superseded events in the next `event_ids` ids, then runs that hold none.

    The tick stops starting new work once `budget_seconds` (by `timer`) are
    spent: the events may use `EVENT_BUDGET_SHARE` of it, the runs the rest.
    """
    started = timer()
    events_deleted, next_event_id = delete_superseded_events(
        instance,
        older_than,
        cursor.event_id,
        event_ids,
        deadline=started + budget_seconds * EVENT_BUDGET_SHARE,
        timer=timer,
    )
    runs_deleted, next_run_created = delete_emptied_runs(
        instance,
        older_than,
        cursor.run_created,
        max_runs,
        deadline=started + budget_seconds,
        timer=timer,
    )
    return RetentionTick(
        events_deleted, runs_deleted, RetentionCursor(next_event_id, next_run_created)
    )


def delete_superseded_events(
    instance: dg.DagsterInstance,
    older_than: datetime,
    after_id: int,
    event_ids: int,
    deadline: float = float("inf"),
    timer: Callable[[], float] = time.monotonic,
) -> tuple[int, int]:
    """Delete superseded asset events among ids (after_id, after_id + event_ids].

    Returns how many went and where the next tick starts: 0 once the walk
    reached events newer than `older_than` or the newest event.
    """
    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        return 0, 0
    horizon = _naive_utc(older_than)
    with storage.index_connection() as conn:
        newest = conn.execute(sa.select(sa.func.max(SqlEventLogStorageTable.c.id))).scalar() or 0
    end = min(after_id + event_ids, newest)
    deleted, low = 0, after_id
    while low < end and timer() < deadline:
        high = min(low + EVENT_IDS_PER_STATEMENT, end)
        # One transaction a window: event writers wait for one window at most.
        with storage.index_transaction() as conn:
            old_end = conn.execute(
                sa.select(sa.func.max(SqlEventLogStorageTable.c.id)).where(
                    SqlEventLogStorageTable.c.id > low,
                    SqlEventLogStorageTable.c.id <= high,
                    SqlEventLogStorageTable.c.timestamp < horizon,
                )
            ).scalar()
            if old_end is None:
                return deleted, 0
            ids = conn.execute(_superseded_ids(low, old_end, horizon)).scalars().all()
            deleted += _delete_events(conn, ids)
        if old_end < high:
            return deleted, 0
        low = high
    return deleted, (0 if low >= newest else low)


def _superseded_ids(low: int, high: int, horizon: datetime) -> sa.Select:
    event = SqlEventLogStorageTable
    newer = SqlEventLogStorageTable.alias("newer")

    def newer_with(partition_match, event_types):
        return (
            sa.select(newer.c.id)
            .where(
                newer.c.asset_key == event.c.asset_key,
                newer.c.dagster_event_type.in_(event_types),
                partition_match,
                newer.c.id > event.c.id,
            )
            .exists()
        )

    def newer_of(*event_types: str):
        # Not `IS NOT DISTINCT FROM`: Postgres never answers it from an index, and then
        # each event scans every newer one (bench/README.md, "Retention at 3,000").
        return sa.or_(
            sa.and_(
                event.c.partition.is_not(None),
                newer_with(newer.c.partition == event.c.partition, event_types),
            ),
            sa.and_(
                event.c.partition.is_(None),
                newer_with(newer.c.partition.is_(None), event_types),
            ),
        )

    return sa.select(event.c.id).where(
        event.c.id > low,
        event.c.id <= high,
        event.c.timestamp < horizon,
        event.c.asset_key.is_not(None),
        sa.or_(
            sa.and_(event.c.dagster_event_type == MATERIALIZATION, newer_of(MATERIALIZATION)),
            sa.and_(event.c.dagster_event_type == OBSERVATION, newer_of(OBSERVATION)),
            sa.and_(
                event.c.dagster_event_type == PLANNED, newer_of(PLANNED, MATERIALIZATION)
            ),
        ),
    )


def _delete_events(conn, ids) -> int:
    for start in range(0, len(ids), IDS_PER_DELETE):
        chunk = ids[start : start + IDS_PER_DELETE]
        conn.execute(AssetEventTagsTable.delete().where(AssetEventTagsTable.c.event_id.in_(chunk)))
        conn.execute(
            SqlEventLogStorageTable.delete().where(SqlEventLogStorageTable.c.id.in_(chunk))
        )
    return len(ids)


def delete_emptied_runs(
    instance: dg.DagsterInstance,
    older_than: datetime,
    created_after: datetime | None,
    limit: int,
    deadline: float = float("inf"),
    timer: Callable[[], float] = time.monotonic,
) -> tuple[int, datetime | None]:
    """Delete finished runs older than `older_than` that hold no asset event any more.

    Looks at up to `limit` runs created after `created_after`; returns how
    many went and where the next tick starts (None: from the oldest again).
    """
    records = instance.get_run_records(
        filters=dg.RunsFilter(
            statuses=FINISHED, updated_before=older_than, created_after=created_after
        ),
        limit=limit,
        ascending=True,
    )
    holding = _runs_holding_events(instance, [record.dagster_run.run_id for record in records])
    deleted = 0
    for number, record in enumerate(records):
        if timer() >= deadline:
            return deleted, (records[number - 1].create_timestamp if number else created_after)
        run_id = record.dagster_run.run_id
        if run_id in holding:
            continue
        instance.delete_run(run_id)
        _remove_run_shard(instance, run_id)
        deleted += 1
    if len(records) < limit:
        return deleted, None
    return deleted, records[-1].create_timestamp


def _runs_holding_events(instance: dg.DagsterInstance, run_ids: list[str]) -> set[str]:
    storage = instance.event_log_storage
    if not run_ids:
        return set()
    if not isinstance(storage, SqlEventLogStorage):
        return set(run_ids)
    event = SqlEventLogStorageTable
    # One probe a run, stopping at its first asset event: a single `run_id IN (...)` query
    # is answered from the event-type index and reads every asset event of the instance
    # (bench/README.md, "Retention at 3,000").
    holds = (
        sa.select(sa.literal(1))
        .where(
            event.c.run_id == sa.bindparam("run_id"),
            event.c.dagster_event_type.in_(PARTITION_EVENTS),
        )
        .limit(1)
    )
    with storage.index_connection() as conn:
        return {
            run_id for run_id in run_ids
            if conn.execute(holds, {"run_id": run_id}).first() is not None
        }


def _remove_run_shard(instance: dg.DagsterInstance, run_id: str) -> None:
    # SQLite keeps one event file per run, which delete_run leaves on disk.
    path_for_shard = getattr(instance.event_log_storage, "path_for_shard", None)
    if path_for_shard is not None:
        Path(path_for_shard(run_id)).unlink(missing_ok=True)


def _naive_utc(instant: datetime) -> datetime:
    # Dagster stores event timestamps as naive UTC.
    return instant.astimezone(UTC).replace(tzinfo=None)


def _retention_tick(context: dg.SensorEvaluationContext, rastro: RastroResource):
    refused = load_time_refusals().get("retention")
    if refused is not None:
        # A deletion is for good: it never runs on a default the operator did not choose.
        return dg.SkipReason(f"nothing is deleted: {refused}")
    now = rastro.clock()()
    tick = prune_instance(
        context.instance, now - RUN_RETENTION, RetentionCursor.from_json(context.cursor)
    )
    done = f"deleted {tick.events_deleted} superseded events and {tick.runs_deleted} old runs"
    try:
        with rastro.warehouse().connect() as con:
            pruned = prune_sync_runs(con, now - SYNC_RUN_RETENTION, GAP_AFTER)
    except WarehouseLocked as exc:
        return dg.SensorResult(
            skip_reason=f"{done}; the warehouse is busy: {exc}", cursor=tick.cursor.to_json()
        )
    return dg.SensorResult(
        skip_reason=f"{done} and {pruned} old meta_sync_runs rows", cursor=tick.cursor.to_json()
    )


def build_retention_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name="retention",
        minimum_interval_seconds=RETENTION_SENSOR_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Hourly: deletes asset events older than the retention age that a newer "
        "event of the same partition supersedes, then finished runs left holding none, and "
        "prunes old meta_sync_runs rows the planner no longer needs.",
    )
    def retention_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return _retention_tick(context, rastro)

    return retention_sensor


def location_defs(shard_count: int) -> dg.Definitions:
    return dg.Definitions(sensors=[build_retention_sensor()])

"""Spend runs the queue holds until the last day of their range begins in their account's zone.

The date axis ends on today in UTC+14, so a backfill over it asks accounts further west for a
day their clock has not reached. A run that read such a day would find nothing and record
nothing for it, and Dagster's backfill daemon ends a backfill whose finished runs left a
partition it targets without a status "Failed". The run queue (`instance/run_queue.py`) holds
such a run instead: `HOLD_TAG` set to `HELD`, which the instance's limit of 0 runs for that
value (`dagster.yaml`) keeps queued, and when and why in `BEGINS_AT_TAG` and `WAITS_FOR_TAG`.
A queued run is no finished one, so its backfill stays in progress; it holds no account, pool
slot or lease. A run over several accounts (one date picked for many in the UI) waits for
the one whose day begins last. `meta_cadence` calls `release_begun` every tick: each held run
whose day has begun gets `RELEASED`, and the queue launches it as any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta

import dagster as dg

from rastro_assets.outcomes import counted
from rastro_assets.timekeeping import local_date, local_midnight

HOLD_TAG = "rastro/waits_for_day"
HELD = "begins"
RELEASED = "begun"
BEGINS_AT_TAG = "rastro/day_begins_at"
"""The UTC instant the run's last day begins in its account's zone (ISO 8601)."""
WAITS_FOR_TAG = "rastro/waits_for"
"""Why the run waits and until when, in words: the account's local time and UTC."""
WESTERNMOST = "Etc/GMT+12"
"""UTC-12: a day begun there has begun in every zone, so no account's run waits for it."""


def begun_everywhere(day: date, now: datetime) -> bool:
    """Whether `day` has begun in every zone: no warehouse need be asked then."""
    return day <= local_date(now, WESTERNMOST)


def hold_tags(day: date, zones: Mapping[str, str], now: datetime) -> dict[str, str] | None:
    """The tags that hold a run whose range ends on `day` until `day` has begun in the zone
    of each of its accounts (`zones`: account -> timezone); None once it has everywhere.

    A range the UI cuts over several accounts (one date picked for many) is one run: it
    waits for the account whose day begins last, and reads every account then."""
    if not zones:
        return None
    begins = {account: local_midnight(day, timezone) for account, timezone in zones.items()}
    last = max(begins, key=lambda account: (begins[account], account))
    if begins[last] <= now:
        return None
    local, utc = begins[last], begins[last].astimezone(UTC)
    others = sum(1 for account in begins if account != last)
    return {
        HOLD_TAG: HELD,
        BEGINS_AT_TAG: utc.isoformat(timespec="seconds"),
        WAITS_FOR_TAG: (
            f"{last}'s {day} begins at {local:%Y-%m-%d %H:%M} {zones[last]}, "
            f"{utc:%Y-%m-%d %H:%M} UTC: Meta has no figures for it before"
            + (f"; the run's {counted(others, 'other account')} wait with it" if others else "")
        ),
    }


def held_message(tags: dict[str, str]) -> str:
    """The run log's line for a run the queue holds."""
    return (
        f"Held in the queue: {tags[WAITS_FOR_TAG]}. It runs once that day has begun (the "
        "meta_cadence sensor releases it within a tick); until then it holds nothing, its "
        'backfill stays in progress and the day shows missing (docs/cadence.md, "The date '
        'axis"). Cancel it to drop it.'
    )


def begins_at(run: dg.DagsterRun) -> datetime:
    """When the held run's day begins; a tag that does not say is read as begun, so that no
    run waits forever on it."""
    try:
        found = datetime.fromisoformat(run.tags.get(BEGINS_AT_TAG, ""))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def release_begun(instance: dg.DagsterInstance, now: datetime) -> list[dg.DagsterRun]:
    """Let the queue launch each held run whose day has begun by `now`; the runs released."""
    released = []
    held = instance.get_runs(
        dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED], tags={HOLD_TAG: HELD})
    )
    for run in held:
        began = begins_at(run)
        if began > now:
            continue
        instance.add_run_tags(run.run_id, {HOLD_TAG: RELEASED})
        late = max(now - began, timedelta(0))
        instance.report_engine_event(
            f"Released to the queue: the day it waited for began at "
            f"{began:%Y-%m-%d %H:%M} UTC ({int(late.total_seconds())} s ago)",
            run,
        )
        released.append(run)
    return released

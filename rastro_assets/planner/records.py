"""Records (planner layer): the stored account-days Dagster should show, and which accounts' fill.

Pure: the warehouse says which days finished ok syncs read completely
(`warehouse.complete_reads`); this module keeps those that are partitions (from the date
axis's first day to the account's local today), and says whether an account owes no fill.
Dagster's side is `defs/cadence/records.py` (what is recorded) and `recorder.py` (the
sensor recording the rest).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime

from rastro_assets.outcomes import FILL_KINDS
from rastro_assets.planner import cadence
from rastro_assets.planner.state import AccountState
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse.complete_reads import CompleteDay


@dataclass(frozen=True, slots=True)
class StoredDay:
    """A partition's account-day the warehouse holds from a complete read."""

    day: date
    run_id: str
    """The sync that read it last."""
    stored_since_us: int
    """When it was first read completely, in microseconds since the epoch."""


def stored_days(
    complete: Iterable[CompleteDay],
    timezones: Mapping[str, str],
    now: datetime,
    first_day: date,
) -> dict[str, list[StoredDay]]:
    """Per account of `timezones`, its completely read days that are partitions at `now`.

    A day before `first_day` (the date axis) is no partition, and a day after the account's
    local today has not begun there: neither is kept, whatever a read says. An account
    `timezones` does not name (unlinked) is left out.
    """
    todays: dict[str, date] = {}
    found: dict[str, list[StoredDay]] = {}
    for read in complete:
        timezone = timezones.get(read.ad_account_id)
        if timezone is None:
            continue
        today = todays.get(read.ad_account_id)
        if today is None:
            today = todays[read.ad_account_id] = local_date(now, timezone)
        if first_day <= read.day <= today:
            found.setdefault(read.ad_account_id, []).append(
                StoredDay(read.day, read.run_id, read.stored_since_us)
            )
    return found


def owes_no_fill(
    state: AccountState,
    now: datetime,
    reach_start: date,
    runs_in_flight: Collection[str] = (),
) -> bool:
    """Whether the planner owes the account no backfill and no gap fill at `now`, from the
    days `reach_start` on (a day before it can never be read), counting only syncs whose run
    has ended: a run still going records its own fill.

    A paused account is not known to owe nothing (its plan says only that it is paused).
    """
    if runs_in_flight:
        state = replace(state, runs=[r for r in state.runs if r.run_id not in runs_in_flight])
    plan = cadence.plan(state, now)
    if plan.kind == "paused":
        return False
    if plan.kind not in FILL_KINDS:
        return True
    since = max(plan.since, reach_start)
    return since > plan.until or cadence.first_unread_day(state.runs, since, plan.until) is None

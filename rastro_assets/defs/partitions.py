"""Spend is partitioned by ad account x account-local date, one asset pair per shard.

Also here: which of an account's owed days can be partitions (`reachable_fill`), and the
failure of a run whose account partition no site links (`not_linked`).

The date dimension runs on UTC+14 with one extra day so that every account's
local today already has a key, wherever the account is. A date key is only a
label for the account-local calendar date: never turn it into a time window.

The date axis starts on `FIRST_DATE` (`RASTRO_PARTITIONS_START`, default
2026-08-01), where this deployment can first need a day, not where Meta could
answer. The product never reads further back than 90
days before an account's link (its backfill) or before today (a gap fill after
a pause), and the first accounts are linked at release, in November 2026 (the
tests and benchmarks pin 2026-11-23 .. 2026-11-30), so its first day is in
August 2026. A deployment that wants older history as partitions (a backfill
from the UI of last year, say) sets an earlier start. Every day before it would only grow
Dagster's key space (accounts x dates), which the backfill daemon lists in
full for each backfill it takes up, in time and memory that grow with the keys
(bench/README.md); it grows by one day's keys a day. A day before an account's
reach (`reach_start`: the axis, or Meta's 37 months of insights) is never asked
of Dagster or Meta: the sensors leave it out.

Moving `FIRST_DATE` either way changes the date dimension's identity: Dagster then
rebuilds both spend assets' partition-status caches, and a backfill in flight
that targets a removed day fails. Move it only with no backfill in flight
(`docs/cadence.md`, "The date axis").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from functools import cache

import dagster as dg

from rastro_assets import shards
from rastro_assets.account_ids import normalize_account_id
from rastro_assets.defs.keys import ad_spend_key, site_spend_key
from rastro_assets.meta.insights import META_INSIGHTS_MONTHS
from rastro_assets.planner import cadence
from rastro_assets.planner.state import AccountState
from rastro_assets.settings import load_time
from rastro_assets.timekeeping import local_date, months_before

AXIS_START = load_time().partitions_start
FIRST_DATE = AXIS_START.isoformat()

date_partitions = dg.DailyPartitionsDefinition(
    start_date=FIRST_DATE, timezone="Etc/GMT-14", end_offset=1
)


def configured_shard_count() -> int:
    """How many spend pairs this process's code location defines (`RASTRO_ACCOUNT_SHARDS`,
    read once): asked where the location is built and by what runs outside the shards'
    factories (a wave, the run queue, the record count of `rastro check`)."""
    return load_time().account_shards


def shard_account_partitions(shard: int) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=shards.accounts_name(shard))


def shard_spend_partitions(shard: int) -> dg.MultiPartitionsDefinition:
    return dg.MultiPartitionsDefinition(
        {"account": shard_account_partitions(shard), "date": date_partitions}
    )


spend_partitions = shard_spend_partitions(0)


@dataclass(frozen=True)
class SpendShard:
    """One shard of the account axis: its spend pair and its partitions (the accounts' set is
    named by `shards.accounts_name`)."""

    index: int
    ad_key: dg.AssetKey
    site_key: dg.AssetKey
    partitions: dg.MultiPartitionsDefinition

    @property
    def keys(self) -> tuple[dg.AssetKey, dg.AssetKey]:
        return (self.ad_key, self.site_key)


@cache
def spend_shard(index: int) -> SpendShard:
    return SpendShard(
        index=index,
        ad_key=ad_spend_key(index),
        site_key=site_spend_key(index),
        partitions=spend_partitions if index == 0 else shard_spend_partitions(index),
    )


def spend_partition_key(ad_account_id: str, day: date) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"account": ad_account_id, "date": day.isoformat()})


def reach_start(today: date) -> date:
    """The first day an account whose local today is `today` can have read.

    Meta answers a range starting over 37 months back with an error (#3018),
    and a day before the axis is no partition: neither may become a failure.
    """
    return max(AXIS_START, months_before(today, META_INSIGHTS_MONTHS))


def not_linked(ad_account_id: str) -> str:
    """The failure of a spend, fill or catalog run of an account no site links.

    Anyone may add a partition in the UI; only `rastro link` links an account, and
    `meta_accounts` removes the partition at its next tick, so the failure names both.
    """
    return (
        f"{ad_account_id} is not linked to any site: link it with "
        f"`rastro link SITE_ID {ad_account_id} --connection CONNECTION_ID` "
        "(the meta_accounts sensor removes partitions of accounts that are not linked)"
    )


def checked_account_ids(raw_ids: list[str]) -> list[str]:
    """Account ids safe to become partitions: a `|` or stray text would break keys."""
    return [normalize_account_id(raw) for raw in raw_ids]


def account_date_ranges(keys) -> dict[str, list[tuple[date, date]]]:
    """Group multi-partition keys into contiguous date ranges per account."""
    days_by_account: dict[str, list[date]] = {}
    for key in keys:
        dims = key.keys_by_dimension
        days_by_account.setdefault(dims["account"], []).append(date.fromisoformat(dims["date"]))
    ranges: dict[str, list[tuple[date, date]]] = {}
    for account, days in days_by_account.items():
        days.sort()
        runs: list[tuple[date, date]] = []
        for day in days:
            if runs and (day - runs[-1][1]).days == 1:
                runs[-1] = (runs[-1][0], day)
            elif not runs or day != runs[-1][1]:
                runs.append((day, day))
        ranges[account] = runs
    return ranges


@dataclass(frozen=True)
class Fill:
    """The days of an account's backfill or gap fill that can be read and be partitions."""

    ad_account_id: str
    kind: str
    since: date
    until: date


def reachable_fill(plan: cadence.Plan, state: AccountState, now: datetime) -> Fill | None:
    """The plan's owed days from the account's reach on, or None when none are owed there.

    Days before `reach_start` (the date axis, or Meta's 37 months) are left
    out: a backfill targeting a day that is no partition fails, and Meta
    refuses a range starting beyond its 37 months. When the plan starts
    before the reach, the first day still unread from the reach on starts
    the fill, so days already read are not read again.
    """
    first = reach_start(local_date(now, state.timezone))
    since = plan.since
    if since < first:
        since = cadence.first_unread_day(state.runs, first, plan.until)
        if since is None:
            return None
    return Fill(plan.ad_account_id, plan.kind, since, plan.until)

"""Spend is partitioned by ad account x account-local date.

The date dimension runs on UTC+14 with one extra day so that every account's
local today already has a key, wherever the account is. A date key is only a
label for the account-local calendar date: never turn it into a time window.
"""

from __future__ import annotations

from datetime import date

import dagster as dg

from rastro_assets.accounts import normalize_account_id

ACCOUNT_PARTITIONS_NAME = "meta_ad_account"
FIRST_DATE = "2024-01-01"

account_partitions = dg.DynamicPartitionsDefinition(name=ACCOUNT_PARTITIONS_NAME)
date_partitions = dg.DailyPartitionsDefinition(
    start_date=FIRST_DATE, timezone="Etc/GMT-14", end_offset=1
)
spend_partitions = dg.MultiPartitionsDefinition(
    {"account": account_partitions, "date": date_partitions}
)


def spend_partition_key(ad_account_id: str, day: date) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"account": ad_account_id, "date": day.isoformat()})


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

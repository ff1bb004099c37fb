"""Accounts (instance layer): what the `rastro` command asks of the Dagster instance.

The command imports this module only when DAGSTER_HOME is set, so no other
command loads Dagster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.cadence.busy import move_blockers
from rastro_assets.defs.partitions import spend_shard

MOVED_FROM = "rastro/moved_from"


def add_account_partition(
    ad_account_id: str, shard: int, shard_count: int
) -> None:
    """Add `ad_account_id` to its shard's account partitions of the instance at DAGSTER_HOME
    (and, with several shards, to the catalog's set of every account)."""
    with dg.DagsterInstance.get() as instance:
        add_account_partitions(instance, {ad_account_id: shard}, shard_count)


def add_account_partitions(
    instance: dg.DagsterInstance, shard_of: Mapping[str, int], shard_count: int
) -> None:
    """Add each account to its shard's account partitions (and, with several shards, to the
    catalog's set of every account): one call per shard, whatever the number of accounts,
    since each call makes Dagster drop that shard's partition-status cache."""
    by_shard: dict[int, list[str]] = {}
    for account, shard in sorted(shard_of.items()):
        by_shard.setdefault(shard, []).append(account)
    for shard, accounts in sorted(by_shard.items()):
        instance.add_dynamic_partitions(shards.accounts_name(shard), accounts)
    if shard_count > 1 and shard_of:
        instance.add_dynamic_partitions(shards.all_accounts_name(shard_count), sorted(shard_of))


def instance_at_home() -> dg.DagsterInstance:
    """The instance at DAGSTER_HOME (a context manager)."""
    return dg.DagsterInstance.get()


@dataclass(frozen=True)
class Moved:
    ad_account_id: str
    old_shard: int
    new_shard: int
    partitions: int
    """Account-days of the account in each asset of the new pair."""
    recorded: int
    """Runless materializations this call added (0 when an earlier, killed run had made them)."""
    seconds: float


def busy(instance: dg.DagsterInstance) -> set[str]:
    """Accounts with a run or backfill in flight: moving them now would strand its events."""
    return move_blockers(instance)


def move_account(
    instance: dg.DagsterInstance,
    ad_account_id: str,
    old_shard: int,
    new_shard: int,
    materialized: dict[dg.AssetKey, set[str]] | None = None,
    *,
    store_shard: Callable[[], None] | None = None,
    shard_count: int,
) -> Moved:
    """Move the account's spend partitions from `old_shard`'s pair to `new_shard`'s.

    Each account-day materialized in the old `ad_spend_daily` (and `site_spend_daily`) and
    not yet in the new asset becomes one runless materialization of the same partition key
    there, its metadata naming where it came from; the old events stay in the event log.
    Then `store_shard` stores the new shard in the warehouse, then the account leaves the
    old shard's partitions and joins the new one's (`place_account`).

    The order is what makes a killed move safe to run again, and keeps the account in one
    shard's partitions at every instant:
    - the days are recorded before the account joins the new partitions, so no one sees
      the new shard half-filled, and a second run records only the days still missing;
    - the warehouse changes only once every day is recorded, and before the partitions:
      `meta_accounts` makes each shard's partitions follow the warehouse, so from then on
      the sensor and the move agree, and a run killed after it leaves only the partitions
      to switch, which the next run (or the sensor's next tick) does;
    - the account leaves the old partitions before joining the new ones: between those two
      calls it is in neither, never in both.
    A shard outside `shard_count` is no sensor's, so the account leaves it before the
    warehouse changes, while a second run still knows where it was.

    `materialized` caches each asset's materialized keys across the accounts of one move.
    """
    started = time.monotonic()
    cache: dict[dg.AssetKey, set[str]] = {} if materialized is None else materialized
    old, new = spend_shard(old_shard), spend_shard(new_shard)
    prefix = f"{ad_account_id}|"
    count = recorded = 0
    for old_key, new_key in zip(old.keys, new.keys, strict=True):
        mine = {key for key in _materialized(instance, old_key, cache) if key.startswith(prefix)}
        there = _materialized(instance, new_key, cache)
        for partition in sorted(mine - there):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=new_key,
                    partition=partition,
                    metadata={MOVED_FROM: old_key.to_user_string()},
                )
            )
            there.add(partition)
            recorded += 1
        count = max(count, len(mine))
    if old_shard >= shard_count:
        instance.delete_dynamic_partition(shards.accounts_name(old_shard), ad_account_id)
    if store_shard is not None:
        store_shard()
    place_account(instance, ad_account_id, new_shard, [old_shard])
    return Moved(
        ad_account_id, old_shard, new_shard, count, recorded, time.monotonic() - started
    )


def _materialized(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, cache: dict[dg.AssetKey, set[str]]
) -> set[str]:
    if asset_key not in cache:
        cache[asset_key] = set(instance.get_materialized_partitions(asset_key))
    return cache[asset_key]


def shards_holding(instance: dg.DagsterInstance, shard_count: int) -> dict[str, set[int]]:
    """The shards whose account partitions hold each account, for every account any holds."""
    holding: dict[str, set[int]] = {}
    for shard in range(shard_count):
        for account in instance.get_dynamic_partitions(shards.accounts_name(shard)):
            holding.setdefault(account, set()).add(shard)
    return holding


def place_account(
    instance: dg.DagsterInstance, ad_account_id: str, shard: int, others: Iterable[int]
) -> None:
    """The account in `shard`'s partitions and in none of `others`': it leaves them first,
    so it is never in two shards' partitions (for a moment, in none)."""
    for other in sorted(set(others) - {shard}):
        name = shards.accounts_name(other)
        if instance.has_dynamic_partition(name, ad_account_id):
            instance.delete_dynamic_partition(name, ad_account_id)
    name = shards.accounts_name(shard)
    if not instance.has_dynamic_partition(name, ad_account_id):
        instance.add_dynamic_partitions(name, [ad_account_id])

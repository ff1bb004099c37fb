"""What the `rastro` command asks of the Dagster instance at DAGSTER_HOME.

The command imports this module only when DAGSTER_HOME is set, so no other
command loads Dagster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import dagster as dg

from rastro_assets.defs.cadence.sensors import busy_accounts
from rastro_assets.defs.partitions import SHARD_COUNT, all_accounts_partitions_name
from rastro_assets.defs.spend.assets import spend_shard

MOVED_FROM = "rastro/moved_from"


def add_account_partition(
    ad_account_id: str, shard: int = 0, shard_count: int = SHARD_COUNT
) -> None:
    """Add `ad_account_id` to its shard's account partitions of the instance at DAGSTER_HOME
    (and, with several shards, to the catalog's set of every account)."""
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(spend_shard(shard).accounts_name, [ad_account_id])
        if shard_count > 1:
            instance.add_dynamic_partitions(
                all_accounts_partitions_name(shard_count), [ad_account_id]
            )


def instance_at_home() -> dg.DagsterInstance:
    """The instance at DAGSTER_HOME (a context manager)."""
    return dg.DagsterInstance.get()


@dataclass(frozen=True)
class Moved:
    ad_account_id: str
    old_shard: int
    new_shard: int
    partitions: int
    """Account-days re-recorded in each asset of the new pair."""
    seconds: float


def busy(instance: dg.DagsterInstance) -> set[str]:
    """Accounts with a run or backfill in flight: moving them now would strand its events."""
    return busy_accounts(instance)[0]


def move_account(
    instance: dg.DagsterInstance,
    ad_account_id: str,
    old_shard: int,
    new_shard: int,
    materialized: dict[dg.AssetKey, set[str]] | None = None,
) -> Moved:
    """Re-record the account's materialized spend partitions in `new_shard`'s pair, then
    remove the account from `old_shard`'s partitions.

    Each account-day materialized in the old `ad_spend_daily` (and `site_spend_daily`)
    becomes one runless materialization of the same partition key in the new asset,
    its metadata naming where it came from; the old events stay in the event log. A
    second run re-records them again, harmlessly. `materialized` caches each old
    asset's materialized keys across the accounts of one move.
    """
    started = time.monotonic()
    old, new = spend_shard(old_shard), spend_shard(new_shard)
    instance.add_dynamic_partitions(new.accounts_name, [ad_account_id])
    prefix = f"{ad_account_id}|"
    count = 0
    for old_key, new_key in zip(old.keys, new.keys, strict=True):
        if materialized is None or old_key not in materialized:
            keys = instance.get_materialized_partitions(old_key)
            if materialized is not None:
                materialized[old_key] = keys
        else:
            keys = materialized[old_key]
        mine = sorted(key for key in keys if key.startswith(prefix))
        for partition in mine:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    asset_key=new_key,
                    partition=partition,
                    metadata={MOVED_FROM: old_key.to_user_string()},
                )
            )
        count = max(count, len(mine))
    instance.delete_dynamic_partition(old.accounts_name, ad_account_id)
    return Moved(ad_account_id, old_shard, new_shard, count, time.monotonic() - started)

"""A shard of the account axis: its spend asset pair and its accounts' partitions."""

from dataclasses import dataclass
from functools import cache

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.partitions import shard_spend_partitions, spend_partitions


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
        ad_key=dg.AssetKey(shards.ad_spend_name(index)),
        site_key=dg.AssetKey(shards.site_spend_name(index)),
        partitions=spend_partitions if index == 0 else shard_spend_partitions(index),
    )

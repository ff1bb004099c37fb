"""The ad catalog (definitions layer): `ad_catalog` and `ad_thumbnails`, an account a partition.

A hand materialization of `ad_catalog` reads the account's whole catalog,
every status; `ad_thumbnails` copies every picture missing or stale since it
was stored. The daily re-sync and the last block of a backfill or gap fill do
the same inside their spend run (see `Syncer`); `catalog_materializations`
turns that outcome into events of these assets, so a wave or a spend run
records these partitions too. Every run that records an account of either
ends with that table's own figures, an event of no partition
(`catalog_table_materialization`), so the overview's row count is the table's.
"""

from collections.abc import Callable
from typing import TypeVar

import dagster as dg

from rastro_assets import shards
from rastro_assets.account_ids import normalize_account_id
from rastro_assets.defs.keys import (
    AD_CATALOG,
    AD_SPEND_DAILY,
    AD_THUMBNAILS,
    LEAD_DAILY_ROLLUPS,
    META_AD_ACCOUNTS,
    META_CONNECTIONS,
    OWNERS,
)
from rastro_assets.defs.metadata import (
    WAREHOUSE_KIND,
    catalog_materializations,
    catalog_metadata,
    catalog_table_materializations,
    table_metadata,
    thumbnail_metadata,
)
from rastro_assets.defs.partitions import not_linked
from rastro_assets.defs.publishing import publish_after_writes
from rastro_assets.defs.resources import RastroResource
from rastro_assets.outcomes import with_guide
from rastro_assets.sync.types import CatalogRefused

GROUP = "meta_catalog"

__all__ = [
    "AD_CATALOG",
    "AD_THUMBNAILS",
    "build_catalog_assets",
    "catalog_materializations",
    "catalog_metadata",
    "thumbnail_metadata",
]


def _account(context: dg.AssetExecutionContext) -> str:
    try:
        return normalize_account_id(context.partition_key)
    except ValueError as exc:
        raise dg.Failure(description=str(exc)) from None


Outcome = TypeVar("Outcome")


def _succeeded(account: str, sync: Callable[[], Outcome]) -> Outcome:
    """The sync's outcome, or the run's failure naming why the account was refused or
    the read failed."""
    try:
        outcome = sync()
    except CatalogRefused:  # the catalog refuses an account only when no site links it
        raise dg.Failure(description=not_linked(account)) from None
    if not outcome.ok:
        raise dg.Failure(description=with_guide(outcome.error or "the read failed"))
    return outcome


def _catalog_asset(
    partitions: dg.PartitionsDefinition,
    key: dg.AssetKey,
    *,
    deps: list[dg.AssetKey],
    description: str,
):
    """`dg.asset` with what both catalog assets share (partitions, kinds, group, owners, pool)."""
    return dg.asset(
        key=key,
        partitions_def=partitions,
        deps=deps,
        kinds={"meta", WAREHOUSE_KIND},
        metadata=table_metadata(key.path[-1]),
        group_name=GROUP,
        owners=OWNERS,
        tags={"domain": "marketing"},
        pool="meta_api",
        description=description,
    )


def build_catalog_assets(shard_count: int) -> list[dg.AssetsDefinition]:
    """The catalog pair, partitioned by every linked account whatever its shard.

    With several shards it depends on no spend shard: an upstream adds data-version tags
    to each of its downstream's events, and a dependency on every shard would add one per
    shard. The registry tables stay its upstreams.
    """
    partitions = dg.DynamicPartitionsDefinition(name=shards.all_accounts_name(shard_count))
    spend = [AD_SPEND_DAILY] if shard_count == 1 else []

    @_catalog_asset(
        partitions,
        AD_CATALOG,
        # The registry tables are this asset's upstreams in the lineage, not the spend assets':
        # each upstream adds data-version tags to every event of its downstream, and the spend
        # assets record an event per account-day.
        deps=[*spend, LEAD_DAILY_ROLLUPS, META_AD_ACCOUNTS, META_CONNECTIONS],
        description=(
            "Every ad of the account, any status (deleted and archived included), with the "
            "names analysts read spend by: ad, ad set and campaign, Meta's effective_status as "
            "ad_status, and the creative kind (video, image, carousel, other). Names arrive "
            "with each spend read; the full catalog is read once a local day and by this "
            "materialization. A field Meta leaves out keeps its stored value."
        ),
    )
    def ad_catalog(context: dg.AssetExecutionContext, rastro: RastroResource):
        """Reads the account's whole catalog from Meta and merges it into `ad_catalog`."""
        account = _account(context)
        outcome = _succeeded(
            account,
            lambda: rastro.syncer().catalog.sync_catalog(
                account, full=True, run_id=context.run_id, own_run=True
            )
        )
        context.log.info(
            f"{account}: {outcome.ads_read} ads read, {outcome.added} added, {outcome.renamed} "
            f"renamed, {outcome.status_changed} status changes; {outcome.total_ads} in the catalog"
        )
        yield dg.MaterializeResult(metadata=catalog_metadata(outcome))
        _record_table(context, rastro, AD_CATALOG)
        publish_after_writes(context, rastro)


    @_catalog_asset(
        partitions,
        AD_THUMBNAILS,
        deps=[AD_CATALOG],
        description=(
            "The picture of each catalogued ad that has one at Meta, copied as served (bytes, "
            "content type, sha256), because Meta's thumbnail URLs expire within days. Re-copied "
            "when the ad's creative changes. A failed download keeps the previous row and is "
            "retried on the next run; a broken image is never stored."
        ),
    )
    def ad_thumbnails(context: dg.AssetExecutionContext, rastro: RastroResource):
        """Copies every missing or stale thumbnail of the account (at most 300 a run)."""
        account = _account(context)
        outcome = _succeeded(
            account,
            lambda: rastro.syncer().catalog.sync_thumbnails(account, run_id=context.run_id)
        )
        if outcome.failed:
            # Single pictures failing is routine (URLs expire): the next run retries.
            context.log.warning(
                f"{account}: {outcome.failed} of {outcome.wanted} thumbnails failed and will be "
                f"retried; first: {outcome.failures[0] if outcome.failures else 'unknown'}"
            )
        context.log.info(f"{account}: {outcome.fetched} of {outcome.wanted} thumbnails fetched")
        yield dg.MaterializeResult(metadata=thumbnail_metadata(outcome))
        _record_table(context, rastro, AD_THUMBNAILS)
        publish_after_writes(context, rastro)

    return [ad_catalog, ad_thumbnails]


def location_defs(shard_count: int) -> dg.Definitions:
    return dg.Definitions(assets=build_catalog_assets(shard_count))


def _record_table(
    context: dg.AssetExecutionContext, rastro: RastroResource, asset_key: dg.AssetKey
) -> None:
    """The whole table's figures, after the account's event: the overview shows the latest."""
    with rastro.warehouse().connect(read_only=True) as con:
        for event in catalog_table_materializations(con, [asset_key]):
            context.log_event(event)

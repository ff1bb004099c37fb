"""What the UI shows of the warehouse: table schemas, and the events a run records.

Every run that writes (the spend assets, a fill, a wave) builds its account-day
materializations and its whole-table events here, so all record them alike.

Every materialization is a row in the instance's event log, kept for as long
as the run: a partition's event carries only that account-day's figures, and
a run's summary goes on one event of the run, never on each of its partitions.

An asset's overview shows its latest materialization's metadata (and row
count) as the asset's, whatever partition it names (ui-core's
`AssetNodeOverview`: the latest materialization, else the latest
observation). So a run that records partitions of a table ends with one
materialization of no partition that holds the whole table's figures
(`table_materialization`): the overview shows the table, each partition's
page its own figures. A backfill's runs report theirs as runless events
(`record_table_events`).
"""

from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import date
from decimal import Decimal
from functools import cache

import dagster as dg

from rastro_assets.defs.keys import AD_CATALOG, AD_THUMBNAILS
from rastro_assets.defs.partitions import spend_partition_key, spend_shard
from rastro_assets.defs.resources import RastroResource
from rastro_assets.process_settings import warehouse_engine
from rastro_assets.sync.types import CatalogOutcome, SyncOutcome, ThumbnailOutcome
from rastro_assets.warehouse.connection import Connection
from rastro_assets.warehouse.figures import (
    CatalogFigures,
    TableFigures,
    catalog_table_figures,
    spend_table_figures,
)
from rastro_assets.warehouse.schema import table_columns

TABLE_NAME_KEY = "dagster/table_name"
COLUMN_SCHEMA_KEY = "dagster/column_schema"
ROW_COUNT_KEY = "dagster/row_count"


# Meanings a column's name and type do not tell; the types come from the DDL itself.
COLUMN_MEANINGS = {
    "ad_account_id": "The Meta ad account, `act_<digits>`.",
    "ad_id": "The Meta ad.",
    "site_id": "The site the ad account is linked to.",
    "day": "The ad account's own local calendar date (its Meta timezone), not UTC.",
    "spend": "Spend in the ad account's currency, exactly as Meta reports it (DECIMAL(18,4)).",
    "impressions": "Impressions Meta counted that day.",
    "clicks": "Clicks Meta counted that day.",
    "conversations": "Messaging conversations started that day.",
    "synced_at": "When the sync that last read this ad-day started.",
    "ad_rows": "How many ad_spend_daily rows the sums cover.",
    "ad_status": "Meta's effective_status of the ad.",
    "creative_type": "'video' | 'image' | 'carousel' | 'other'.",
    "image": "The thumbnail's bytes, exactly as Meta served them.",
    "sha256": "sha256 of `image`, lower hex.",
    "leads": "Leads the host application counted for the ad that day.",
}


@cache
def _warehouse_columns() -> dict[str, list[tuple[str, str, bool]]]:
    return table_columns()


def table_schema(table: str) -> dg.TableSchema:
    """The warehouse table's columns as the DDL declares them, with their meanings."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=column,
                type=data_type,
                description=COLUMN_MEANINGS.get(column),
                constraints=dg.TableColumnConstraints(nullable=nullable),
            )
            for column, data_type, nullable in _warehouse_columns()[table]
        ]
    )


WAREHOUSE_KIND = warehouse_engine()
"""The engine the warehouse tables live in, as the UI's kind tag shows it."""


def table_metadata(table: str) -> dict[str, object]:
    """Definition metadata of an asset that is one warehouse table: its name and its columns
    (on PostgreSQL in whichever schema the connection's search path selects)."""
    return {
        TABLE_NAME_KEY: f"main.{table}" if WAREHOUSE_KIND == "duckdb" else table,
        COLUMN_SCHEMA_KEY: table_schema(table),
    }


DAY_ROWS_KEY = "day_ad_rows"
TABLE_DESCRIPTION = (
    "The whole table after this run (every account and day it holds); each partition's own "
    "figures are on that partition's event."
)


def day_metadata(outcome: SyncOutcome, day: date, *, row_count: bool) -> dict:
    """One account-day's own figures: `day_spend_<CURRENCY>`, and its ad rows as `day_ad_rows`.

    Named for the day, not `dagster/row_count`: that name is the table's, on
    the run's `table_materialization`. The currency is in the key, so the UI
    plots each currency apart and never adds BRL to JPY. Two entries at most
    on purpose: SQLite keeps two event rows on a page only while each stays
    under about half of it, and a range run's `site_spend_daily` event is
    already close to that bare, so one more entry cost a page per account-day
    (bench/README.md). The float is for the plot: its repr is the exact
    Decimal up to 15 digits, and the warehouse holds the Decimal. A
    site_spend_daily partition sums the same ad rows, so only ad_spend_daily
    (`row_count`) carries the count.
    """
    summary = outcome.days.get(day)
    spend = summary.spend if summary else Decimal(0)
    metadata: dict = {
        f"day_{spend_key(outcome.currency)}": dg.MetadataValue.float(float(spend))
    }
    if row_count:
        metadata[DAY_ROWS_KEY] = dg.MetadataValue.int(summary.rows if summary else 0)
    return metadata


def spend_key(currency: str | None) -> str:
    return f"spend_{currency}" if currency else "spend"


def table_materialization(asset_key: dg.AssetKey, figures: TableFigures) -> dg.AssetMaterialization:
    """The spend table's own figures, as the run's last event of the asset, of no partition.

    Of no partition, so no partition's status or figures change; last, so the
    overview's Row count and Metadata are the table's (the module's docstring).
    """
    return dg.AssetMaterialization(
        asset_key=asset_key,
        description=TABLE_DESCRIPTION,
        metadata={
            ROW_COUNT_KEY: dg.MetadataValue.int(figures.rows),
            "accounts": dg.MetadataValue.int(figures.accounts),
            "days": dg.MetadataValue.int(figures.days),
            "first_day": dg.MetadataValue.text(str(figures.first_day or "none")),
            "last_day": dg.MetadataValue.text(str(figures.last_day or "none")),
            # A table's total may pass a float's 15 exact digits: it is shown as the Decimal.
            **{
                spend_key(currency): dg.MetadataValue.text(str(total))
                for currency, total in figures.spend_by_currency.items()
            },
        },
    )


def catalog_table_materialization(
    asset_key: dg.AssetKey, figures: CatalogFigures
) -> dg.AssetMaterialization:
    """`ad_catalog`'s or `ad_thumbnails`' whole table, after a run that recorded accounts of it."""
    return dg.AssetMaterialization(
        asset_key=asset_key,
        description="The whole table after this run (every account's ads); each account's "
        "own read is on that account's event.",
        metadata={
            ROW_COUNT_KEY: dg.MetadataValue.int(figures.rows),
            "accounts": dg.MetadataValue.int(figures.accounts),
        },
    )


def run_summary(outcomes: Sequence[SyncOutcome]) -> dict:
    """What a run read, over every range it synced: once per run."""
    ranges = ", ".join(
        f"{outcome.request.ad_account_id} {outcome.request.since} .. {outcome.request.until}"
        for outcome in outcomes
    )
    incomplete = sorted({day for outcome in outcomes for day in outcome.incomplete_days})
    return {
        "run_ranges": dg.MetadataValue.text(ranges or "none"),
        "run_sync_kind": dg.MetadataValue.text(
            ", ".join(sorted({outcome.request.kind for outcome in outcomes})) or "none"
        ),
        "run_rows_written": dg.MetadataValue.int(sum(o.rows_written for o in outcomes)),
        "run_rows_deleted": dg.MetadataValue.int(sum(o.rows_deleted for o in outcomes)),
        "run_api_calls": dg.MetadataValue.int(sum(o.api_calls for o in outcomes)),
        "run_incomplete_days": dg.MetadataValue.text(
            ", ".join(map(str, incomplete)) or "none"
        ),
        "run_peak_usage_pct": dg.MetadataValue.float(
            max((float(outcome.usage.pct) for outcome in outcomes), default=0.0)
        ),
    }


# -- the catalog's events: written by its own assets and by the spend runs that read it --


def catalog_metadata(outcome: CatalogOutcome) -> dict[str, dg.MetadataValue]:
    """One account's catalog read. Its ad count is `ads_total`, never `dagster/row_count`: that
    name is the whole table's, on `catalog_table_materialization` (an account's read 20 of 60)."""
    return {
        "ad_account_id": dg.MetadataValue.text(outcome.ad_account_id),
        "read": dg.MetadataValue.text("full catalog" if outcome.full else "unnamed ads by id"),
        "ads_read": dg.MetadataValue.int(outcome.ads_read),
        "ads_added": dg.MetadataValue.int(outcome.added),
        "ads_renamed": dg.MetadataValue.int(outcome.renamed),
        "status_changes": dg.MetadataValue.int(outcome.status_changed),
        "ads_total": dg.MetadataValue.int(outcome.total_ads),
        "api_calls": dg.MetadataValue.int(outcome.api_calls),
    }


def thumbnail_metadata(outcome: ThumbnailOutcome) -> dict[str, dg.MetadataValue]:
    return {
        "ad_account_id": dg.MetadataValue.text(outcome.ad_account_id),
        "thumbnails_wanted": dg.MetadataValue.int(outcome.wanted),
        "thumbnails_fetched": dg.MetadataValue.int(outcome.fetched),
        "thumbnails_failed": dg.MetadataValue.int(outcome.failed),
        "thumbnails_removed": dg.MetadataValue.int(outcome.removed),
        "failures": dg.MetadataValue.text("\n".join(outcome.failures) or "none"),
        # Ids only: the pictures themselves live in DuckDB, and image bytes in an event
        # would stay in the instance's event log for as long as the run does.
        "latest_ads": dg.MetadataValue.text(
            ", ".join(preview.ad_id for preview in outcome.preview) or "none"
        ),
    }


def catalog_materializations(outcome: SyncOutcome) -> Iterator[dg.AssetMaterialization]:
    """Events for the catalog work a spend sync did (a full read, its thumbnails)."""
    account = outcome.request.ad_account_id
    if outcome.catalog is not None and outcome.catalog.ok and outcome.catalog.full:
        yield dg.AssetMaterialization(
            asset_key=AD_CATALOG, partition=account, metadata=catalog_metadata(outcome.catalog)
        )
        if outcome.thumbnails is not None and outcome.thumbnails.ok:
            yield dg.AssetMaterialization(
                asset_key=AD_THUMBNAILS,
                partition=account,
                metadata=thumbnail_metadata(outcome.thumbnails),
            )


def catalog_table_materializations(
    con: Connection, recorded: Iterable[dg.AssetKey]
) -> list[dg.AssetMaterialization]:
    """The table-level event of each catalog asset a run `recorded` account events of."""
    keys = set(recorded)
    figures = catalog_table_figures(con)
    return [
        catalog_table_materialization(key, figures[key.path[-1]])
        for key in (AD_CATALOG, AD_THUMBNAILS)
        if key in keys
    ]


def materializations(
    outcome: SyncOutcome, days: Iterable[date] | None = None, shard: int = 0
) -> Iterator[dg.AssetMaterialization]:
    """Materializations for the account-days this sync replaced completely (or `days`),
    in the spend pair of the account's `shard`."""
    ad_key, site_key = spend_shard(shard).keys
    for day in outcome.complete_days if days is None else days:
        key = spend_partition_key(outcome.request.ad_account_id, day)
        for asset_key in (ad_key, site_key):
            yield dg.AssetMaterialization(
                asset_key=asset_key,
                partition=key,
                metadata=day_metadata(outcome, day, row_count=asset_key == ad_key),
            )


def table_materializations(
    rastro: RastroResource,
    shard: int,
    shard_count: int,
    outcomes: Iterable[SyncOutcome] = (),
) -> list[dg.AssetMaterialization]:
    """The whole-table events a run ends with: the spend pair's, and the catalog's and
    thumbnails' when `outcomes` recorded account events of them. Once per run, recorded
    by `record_table_events`.

    With several shards each pair holds its own accounts, so its figures are theirs.
    """
    only = None if shard_count == 1 and shard == 0 else shard
    catalog = {
        event.asset_key for outcome in outcomes for event in catalog_materializations(outcome)
    }
    with rastro.warehouse().connect(read_only=True) as con:
        return [
            *(
                table_materialization(asset_key, spend_table_figures(con, table, only))
                for asset_key, table in zip(
                    spend_shard(shard).keys, ("ad_spend_daily", "site_spend_daily"), strict=True
                )
            ),
            *catalog_table_materializations(con, catalog),
        ]


RECORDED_BY_RUN = "recorded_by_run"


def record_table_events(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    events: Iterable[dg.AssetMaterialization],
    backfill_targets: Collection[dg.AssetKey] = (),
) -> None:
    """Record a run's whole-table events: in the run, but runless for `backfill_targets`.

    The backfill daemon fails the whole backfill on a materialization of no partition of
    an asset it targets from one of its runs (`DagsterBackfillFailedError`), and reads
    only its runs' events. Reported runless, with the run named in its metadata, the
    table's figures stay the asset's latest materialization there too, so the overview
    shows the table's after a backfill's run as after any other run.
    """
    for event in events:
        if event.asset_key not in backfill_targets:
            context.log_event(event)
            continue
        context.instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=event.asset_key,
                description=event.description,
                metadata={
                    **event.metadata,
                    RECORDED_BY_RUN: dg.MetadataValue.text(context.run_id),
                },
            )
        )

"""`ad_spend_daily` and `site_spend_daily`: one account-day per partition.

Both tables are written by the spend writer in one transaction, so they are
one multi-asset: the site aggregate costs no run of its own and can never
disagree with the ad rows it sums. A run may select either asset alone (the
CLI, `dg launch`, the UI): it still writes both tables, so it records the
other asset's partitions as materialized too.
"""

from collections.abc import Iterable, Iterator
from datetime import date

import dagster as dg

from rastro_assets.defs.metadata import day_metadata, run_summary, table_metadata
from rastro_assets.defs.partitions import account_date_ranges, spend_partition_key, spend_partitions
from rastro_assets.defs.publishing import publish_after_writes
from rastro_assets.defs.resources import RastroResource
from rastro_assets.outcomes import FILL_KINDS
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.sync.types import SyncOutcome, SyncRefused, SyncRequest
from rastro_assets.timekeeping import days_between

GROUP = "meta_spend"
OWNERS = ["team:data-engineering"]
SYNC_KIND_TAG = "rastro/sync_kind"
ACCOUNT_TAG = "meta_account"
BACKFILL_ID_TAG = "dagster/backfill"
MAX_DAYS_PER_RUN = 30

AD_SPEND_DAILY = dg.AssetKey("ad_spend_daily")
SITE_SPEND_DAILY = dg.AssetKey("site_spend_daily")

ad_spend_spec = dg.AssetSpec(
    AD_SPEND_DAILY,
    description=(
        "Spend, impressions, clicks and messaging conversations per ad and account-local day, "
        "exactly as Meta reports them (spend in the account currency, DECIMAL(18,4)). "
        "A materialized partition equals Meta's answer for that account-day: ad-days Meta no "
        "longer returns are deleted after a complete read, never after a partial one."
    ),
    kinds={"meta", "duckdb"},
    group_name=GROUP,
    owners=OWNERS,
    tags={"domain": "marketing"},
    metadata=table_metadata("ad_spend_daily"),
)
site_spend_spec = dg.AssetSpec(
    SITE_SPEND_DAILY,
    description=(
        "Per site, ad account and local day: the exact sums of ad_spend_daily over the site's "
        "linked accounts. Written in the same transaction as the ad rows."
    ),
    deps=[AD_SPEND_DAILY],
    kinds={"meta", "duckdb"},
    group_name=GROUP,
    owners=OWNERS,
    tags={"domain": "marketing"},
    metadata=table_metadata("site_spend_daily"),
)


SPEND_ASSETS = (AD_SPEND_DAILY, SITE_SPEND_DAILY)


def materializations(
    outcome: SyncOutcome, days: Iterable[date] | None = None
) -> Iterator[dg.AssetMaterialization]:
    """Materializations for the account-days this sync replaced completely (or `days`)."""
    for day in outcome.complete_days if days is None else days:
        key = spend_partition_key(outcome.request.ad_account_id, day)
        for asset_key in SPEND_ASSETS:
            yield dg.AssetMaterialization(
                asset_key=asset_key,
                partition=key,
                metadata=day_metadata(outcome, day, row_count=asset_key == AD_SPEND_DAILY),
            )


@dg.multi_asset(
    name="meta_spend",
    specs=[ad_spend_spec, site_spend_spec],
    partitions_def=spend_partitions,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_DAYS_PER_RUN),
    pool="meta_api",
    can_subset=True,
)
def meta_spend(context: dg.AssetExecutionContext, rastro: RastroResource):
    """Reads Meta for the run's account-days and replaces them in the warehouse."""
    try:
        outcomes = _sync_partitions(context, rastro)
    except BaseException:
        # A failed range may follow ranges that were written: they are published all the same.
        publish_after_writes(context, rastro)
        raise
    yield from _record(context, outcomes)
    publish_after_writes(context, rastro)


def _record(
    context: dg.AssetExecutionContext, outcomes: list[SyncOutcome]
) -> Iterator[dg.MaterializeResult]:
    """Each partition's own figures, and the run's summary once: on its last event.

    The writer wrote both tables whatever the run selected, and Dagster takes a
    result only for a selected asset: the other one's partitions are logged as
    materializations of their own.
    """
    by_key = {
        spend_partition_key(outcome.request.ad_account_id, day): (outcome, day)
        for outcome in outcomes
        for day in days_between(outcome.request.since, outcome.request.until)
    }
    keys = [key for key in context.partition_keys if key in by_key]
    selected = [asset_key for asset_key in SPEND_ASSETS if asset_key in context.selected_asset_keys]
    for asset_key in SPEND_ASSETS:
        for key in keys:
            outcome, day = by_key[key]
            metadata = day_metadata(outcome, day, row_count=asset_key == AD_SPEND_DAILY)
            if asset_key not in selected:
                context.log_event(
                    dg.AssetMaterialization(asset_key=asset_key, partition=key, metadata=metadata)
                )
                continue
            if asset_key == selected[-1] and key == keys[-1]:
                metadata = {**metadata, **run_summary(outcomes)}
            context.add_asset_metadata(metadata, asset_key=asset_key, partition_key=key)
    for asset_key in selected:
        yield dg.MaterializeResult(asset_key=asset_key)


def _sync_partitions(
    context: dg.AssetExecutionContext, rastro: RastroResource
) -> list[SyncOutcome]:
    syncer = rastro.syncer()
    kind = context.run.tags.get(SYNC_KIND_TAG, "manual")
    outcomes: list[SyncOutcome] = []
    for account, ranges in account_date_ranges(context.partition_keys).items():
        for since, until in ranges:
            if kind in FILL_KINDS:
                _wait_out_back_off(rastro, account)
            request = SyncRequest(account, since, until, kind=kind, run_id=context.run_id)
            context.log.info(
                f"{account}: reading {since} .. {until} ({_days(since, until)} days)"
                f"{_backfill_position(context, account, since)}"
            )
            try:
                outcome = syncer.sync(request, synced_at=rastro.run_started_at(context))
            except SyncRefused as exc:
                raise dg.Failure(description=str(exc)) from None
            outcomes.append(outcome)
            if not outcome.ok:
                for event in materializations(outcome):
                    context.log_event(event)
                raise dg.Failure(
                    description=outcome.error,
                    metadata={"unread_days": ", ".join(map(str, outcome.unread_days))},
                )
            if outcome.error:
                context.log.warning(outcome.error)
            context.log.info(
                f"{account}: {outcome.rows_written} rows written, {outcome.rows_deleted} deleted, "
                f"{outcome.api_calls} Meta calls"
            )
    return outcomes


def _wait_out_back_off(rastro: RastroResource, account: str) -> None:
    """Refuse a fill's block while the account's back-off holds, as any sync would wait.

    A partition backfill launches its blocks one after another: without this,
    a block that ended throttled or above 75 % of Meta's usage would be followed
    at once by the next. The refused block reads nothing and records no sync; the
    days stay owed, and `meta_accounts` starts them again when the planner says so.
    """
    now = rastro.clock()()
    with rastro.warehouse().connect() as con:
        found = planned_accounts(con, [account])
    if not found:
        return  # unlinked: the sync refuses it with its own message
    owed = cadence.plan(found[0].state, now)
    if owed.kind in FILL_KINDS and not owed.is_due(now):
        raise dg.Failure(
            description=f"{account}: this block waits until {owed.due_at:%Y-%m-%d %H:%M %Z}: "
            f"{owed.reason}"
        )


def _backfill_position(context: dg.AssetExecutionContext, account: str, since: date) -> str:
    """", block 2 of 3 of backfill <id>" when this run is one range of a partition backfill.

    A backfill's runs each see only their own range; an engineer watching a
    new account's 90 days wants to know how far along it is.
    """
    backfill_id = context.run.tags.get(BACKFILL_ID_TAG)
    backfill = context.instance.get_backfill(backfill_id) if backfill_id else None
    data = backfill.asset_backfill_data if backfill else None
    target = data.target_subset if data else None
    if target is None or AD_SPEND_DAILY not in target.asset_keys:
        return ""
    keys = target.get_partitions_subset(AD_SPEND_DAILY).get_partition_keys()
    ranges = account_date_ranges(spend_partitions.get_partition_key_from_str(key) for key in keys)
    days = [day for first, last in ranges.get(account, []) for day in days_between(first, last)]
    if since not in days:
        return ""
    block = days.index(since) // MAX_DAYS_PER_RUN + 1
    blocks = -(-len(days) // MAX_DAYS_PER_RUN)
    return f", block {block} of {blocks} of backfill {backfill_id}"


def _days(since: date, until: date) -> int:
    return (until - since).days + 1

"""`ad_spend_daily` and `site_spend_daily`: one account-day per partition.

Both tables are written by the spend writer in one transaction, so they are
one multi-asset: the site aggregate costs no run of its own and can never
disagree with the ad rows it sums. A run may select either asset alone (the
CLI, `dg launch`, the UI): it still writes both tables, so it records the
other asset's partitions as materialized too.
"""

from collections.abc import Generator
from datetime import date, timedelta

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.account_health import freshness_evaluation
from rastro_assets.defs.keys import (
    BACKFILL_ID_TAG,
    MAX_DAYS_PER_RUN,
    OWNERS,
)
from rastro_assets.defs.metadata import (
    WAREHOUSE_KIND,
    catalog_materializations,
    day_metadata,
    materializations,
    record_table_events,
    run_summary,
    table_materializations,
    table_metadata,
)
from rastro_assets.defs.partitions import (
    SpendShard,
    account_date_ranges,
    not_linked,
    spend_partition_key,
    spend_shard,
)
from rastro_assets.defs.publishing import publish_after_writes
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.sum_check import evaluate_sum_checks
from rastro_assets.outcomes import SyncKind, with_guide
from rastro_assets.planner.history import planned_accounts
from rastro_assets.sync.types import SyncOutcome, SyncRefused, SyncRequest
from rastro_assets.timekeeping import days_between, local_date
from rastro_assets.warehouse import registry

GROUP = "meta_spend"


FIGURES_NOTE = (
    " The row count and Metadata on this overview are the whole table's (rows, accounts, "
    "days, spend per currency): each run that records partitions ends with a materialization "
    "of no partition that holds them (a backfill's runs report it runless, naming the run in "
    "`recorded_by_run`). A partition's own event carries only its account-day's "
    "`day_spend_<CURRENCY>` and `day_ad_rows`; one the `meta_records` sensor recorded from "
    "the warehouse after a crash carries `recorded_from` instead, and shows here until the "
    "next run's figures.\n\n"
    "Missing counts every empty date, owed or not: one date axis serves accounts with "
    "different windows and local todays. An account's days before its window (the 90 days up "
    "to its link) are read only when asked for; the newest date is today in UTC+14, and an "
    "account further west leaves it missing until its own day begins: a day not begun is "
    "never read nor recorded, even when a backfill asks for it. See "
    'docs/cadence.md, "The date axis".'
)


def _holds(shard: SpendShard, shard_count: int) -> str:
    if shard_count == 1:
        return ""
    return (
        f" Shard {shard.index} of {shard_count}: holds the accounts of its "
        f"`{shards.accounts_name(shard.index)}` partitions, listed by `rastro status` "
        "(SHARD column; `spend_asset` in `--json`)."
    )


def spend_specs(shard: SpendShard, shard_count: int) -> list[dg.AssetSpec]:
    group = shards.named(GROUP, shard.index)
    metadata = {} if shard_count == 1 else {"rastro/shard": shard.index}
    ad_spec = dg.AssetSpec(
        shard.ad_key,
        description=(
            "Spend, impressions, clicks and messaging conversations per ad and account-local "
            "day, exactly as Meta reports them (spend in the account currency, DECIMAL(18,4)). "
            "A materialized partition equals Meta's answer for that account-day: ad-days Meta "
            "no longer returns are deleted after a complete read, never after a partial one."
            + FIGURES_NOTE
            + _holds(shard, shard_count)
        ),
        kinds={"meta", WAREHOUSE_KIND},
        group_name=group,
        owners=OWNERS,
        tags={"domain": "marketing"},
        metadata={**table_metadata("ad_spend_daily"), **metadata},
    )
    site_spec = dg.AssetSpec(
        shard.site_key,
        description=(
            "Per site, ad account and local day: the exact sums of ad_spend_daily over the "
            "site's linked accounts. Written in the same transaction as the ad rows."
            + FIGURES_NOTE
            + _holds(shard, shard_count)
        ),
        deps=[shard.ad_key],
        kinds={"meta", WAREHOUSE_KIND},
        group_name=group,
        owners=OWNERS,
        tags={"domain": "marketing"},
        metadata={**table_metadata("site_spend_daily"), **metadata},
    )
    return [ad_spec, site_spec]


def build_meta_spend(index: int, shard_count: int) -> dg.AssetsDefinition:
    """The spend multi-asset of one shard: `meta_spend` for shard 0, `meta_spend_shard_k`."""
    shard = spend_shard(index)

    @dg.multi_asset(
        name=shards.named("meta_spend", index),
        specs=spend_specs(shard, shard_count),
        partitions_def=shard.partitions,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_DAYS_PER_RUN),
        pool="meta_api",
        can_subset=True,
    )
    def meta_spend(context: dg.AssetExecutionContext, rastro: RastroResource):
        """Reads Meta for the run's account-days and replaces them in the warehouse."""
        outcomes: list[SyncOutcome] = []
        not_begun: set[dg.MultiPartitionKey] = set()
        try:
            _sync_partitions(context, rastro, shard, outcomes, not_begun)
        except BaseException:
            # A failed range may follow ranges that were written: they are published all the
            # same, and the good days it recorded are followed by the tables' figures.
            if any(outcome.complete_days for outcome in outcomes):
                _record_tables_after_failure(context, rastro, shard.index, shard_count, outcomes)
            publish_after_writes(context, rastro)
            raise
        unchecked, days = yield from _record(context, rastro, outcomes, shard, not_begun)
        record_table_events(
            context,
            table_materializations(rastro, shard.index, shard_count, outcomes),
            _backfill_targets(context, shard),
        )
        # After the tables' figures: a check's evaluation older than its asset's latest
        # materialization reads "not evaluated" in the UI.
        if days and unchecked:
            _evaluate_checks_of(context, rastro, shard, unchecked, days)
        publish_after_writes(context, rastro)

    return meta_spend


def shard_defs(shard: int, shard_count: int) -> dg.Definitions:
    return dg.Definitions(assets=[build_meta_spend(shard, shard_count)])


def _backfill_targets(context: dg.AssetExecutionContext, shard: SpendShard) -> list[dg.AssetKey]:
    """The spend pair, when the run is one of a backfill (which may target either)."""
    return list(shard.keys) if BACKFILL_ID_TAG in context.run.tags else []


def _record_tables_after_failure(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    shard: int,
    shard_count: int,
    outcomes: list[SyncOutcome],
) -> None:
    try:
        events = table_materializations(rastro, shard, shard_count, outcomes)
    except Exception as exc:  # the run's own failure is what it reports
        context.log.warning(f"the tables' figures could not be read after the failure: {exc}")
        return
    record_table_events(context, events, _backfill_targets(context, spend_shard(shard)))


AccountDay = tuple[str, date]


def _record(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    outcomes: list[SyncOutcome],
    shard: SpendShard,
    not_begun: set[dg.MultiPartitionKey],
) -> Generator[dg.MaterializeResult, None, tuple[list[dg.AssetKey], list[AccountDay]]]:
    """Each partition's own figures, and the run's summary once: on its last event.
    Returns the assets whose checks the run must evaluate itself, and the days to check.

    The writer wrote both tables whatever the run selected, and Dagster takes a
    result only for a selected asset: the other one's partitions are logged as
    materializations of their own.

    A day not begun in the account's zone is recorded as nothing at all: a result
    would record every partition of the run's range, that day's too, so a run that
    holds one logs the days it read as events of their own and returns no result.
    """
    by_key = {
        spend_partition_key(outcome.request.ad_account_id, day): (outcome, day)
        for outcome in outcomes
        for day in days_between(outcome.request.since, outcome.request.until)
    }
    keys = [key for key in context.partition_keys if key in by_key]
    selected = [asset_key for asset_key in shard.keys if asset_key in context.selected_asset_keys]
    results = [] if any(key in not_begun for key in context.partition_keys) else selected
    for asset_key in shard.keys:
        for key in keys:
            outcome, day = by_key[key]
            metadata = day_metadata(outcome, day, row_count=asset_key == shard.ad_key)
            if selected and asset_key == selected[-1] and key == keys[-1]:
                metadata = {**metadata, **run_summary(outcomes)}
            if asset_key in results:
                context.add_asset_metadata(metadata, asset_key=asset_key, partition_key=key)
            else:
                context.log_event(
                    dg.AssetMaterialization(asset_key=asset_key, partition=key, metadata=metadata)
                )
    for asset_key in results:
        yield dg.MaterializeResult(asset_key=asset_key)
    # Dagster evaluates a selected asset's checks only after its result: without one, they
    # are the run's to evaluate, as for the asset the run wrote without selecting it.
    unchecked = [asset_key for asset_key in shard.keys if asset_key not in results]
    return unchecked, [(by_key[key][0].request.ad_account_id, by_key[key][1]) for key in keys]


def _evaluate_checks_of(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    shard: SpendShard,
    unselected: list[dg.AssetKey],
    days: list[tuple[str, date]],
) -> None:
    """The checks of the asset a run wrote without selecting it, evaluated here: Dagster runs
    only the selected assets' checks, and a partition recorded since a check's evaluation
    reads "Not evaluated" in the UI, with nothing that can evaluate it there."""
    if shard.site_key in unselected:
        evaluate_sum_checks(context, rastro, days, {account: shard.index for account, _ in days})
    if shard.ad_key in unselected:
        with rastro.warehouse().connect(read_only=True) as con:
            members = [a for a in planned_accounts(con) if a.shard == shard.index]
        # Named: in a backfill the table's figures are its latest materialization, recorded
        # outside the run, and an evaluation that names none belongs to the run's own.
        [latest] = context.instance.fetch_materializations(shard.ad_key, limit=1).records or [None]
        context.log_event(
            freshness_evaluation(members, rastro.clock()(), shard.index, target=latest)
        )


def _sync_partitions(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    shard: SpendShard,
    outcomes: list[SyncOutcome],
    not_begun: set[dg.MultiPartitionKey],
) -> None:
    """Syncs the run's ranges, each outcome appended to `outcomes` as it comes (a failure
    raises after its range's complete days are recorded). Days the account's own clock has
    not reached are read from no one and go into `not_begun`."""
    syncer = rastro.syncer()
    for account, ranges in account_date_ranges(context.partition_keys).items():
        today = _local_today(rastro, account)
        for since, until in ranges:
            if today is not None and until > today[0]:
                first = max(since, today[0] + timedelta(days=1))
                not_begun.update(
                    spend_partition_key(account, day) for day in days_between(first, until)
                )
                context.log.info(
                    f"{account}: {first} .. {until} not begun in {today[1]} (today there is "
                    f"{today[0]}): nothing to read, so nothing is recorded; the live syncs "
                    "read it once it begins"
                )
                if since > today[0]:
                    continue
                until = today[0]
            # Always `manual`, whatever the run's tags say: anyone in the UI sets any tag, and
            # the planner trusts the cadence's kinds (`spend_backfill` reads the fills).
            request = SyncRequest(
                account, since, until, kind=SyncKind.MANUAL, run_id=context.run_id
            )
            context.log.info(
                f"{account}: reading {since} .. {until} ({_days(since, until)} days)"
                f"{_backfill_position(context, shard, account, since)}"
            )
            try:
                outcome = syncer.sync(request, synced_at=rastro.run_started_at(context))
            except SyncRefused as exc:
                raise dg.Failure(description=_refusal(rastro, account, exc)) from None
            outcomes.append(outcome)
            if not outcome.ok:
                for event in materializations(outcome, shard=shard.index):
                    context.log_event(event)
                raise dg.Failure(
                    description=with_guide(outcome.error or outcome.outcome),
                    metadata={"unread_days": ", ".join(map(str, outcome.unread_days))},
                )
            if outcome.error:
                context.log.warning(outcome.error)
            # A fill's last block reads the account's full catalog and thumbnails (`Syncer`):
            # recorded as theirs, or the catalog would read "never materialized" after a backfill.
            for event in catalog_materializations(outcome):
                context.log_event(event)
            if outcome.catalog_error:
                context.log.warning(f"{account}: {outcome.catalog_error}")
            context.log.info(
                f"{account}: {outcome.rows_written} rows written, {outcome.rows_deleted} deleted, "
                f"{outcome.api_calls} Meta calls"
            )


def _refusal(rastro: RastroResource, account: str, refused: SyncRefused) -> str:
    """Why the sync refused the range, with the way to link the account when that is why.

    The sync refuses a range past local today too: the registry, not its words, tells
    the two apart.
    """
    with rastro.warehouse().connect(read_only=True) as con:
        linked = registry.get_account(con, account) is not None
    return str(refused) if linked else not_linked(account)


def _local_today(rastro: RastroResource, account: str) -> tuple[date, str] | None:
    """The account's local today and its timezone; None when no site links it (the sync
    then refuses it with its own words)."""
    with rastro.warehouse().connect(read_only=True) as con:
        linked = registry.get_account(con, account)
    if linked is None:
        return None
    return local_date(rastro.clock()(), linked.timezone), linked.timezone


def _backfill_position(
    context: dg.AssetExecutionContext, shard: SpendShard, account: str, since: date
) -> str:
    """", block 2 of 3 of backfill <id>" when this run is one range of a partition backfill.

    A backfill's runs each see only their own range; an engineer watching a
    new account's 90 days wants to know how far along it is.
    """
    backfill_id = context.run.tags.get(BACKFILL_ID_TAG)
    backfill = context.instance.get_backfill(backfill_id) if backfill_id else None
    data = backfill.asset_backfill_data if backfill else None
    target = data.target_subset if data else None
    if target is None or shard.ad_key not in target.asset_keys:
        return ""
    keys = target.get_partitions_subset(shard.ad_key).get_partition_keys()
    ranges = account_date_ranges(
        shard.partitions.get_partition_key_from_str(key) for key in keys
    )
    days = [day for first, last in ranges.get(account, []) for day in days_between(first, last)]
    if since not in days:
        return ""
    block = days.index(since) // MAX_DAYS_PER_RUN + 1
    blocks = -(-len(days) // MAX_DAYS_PER_RUN)
    return f", block {block} of {blocks} of backfill {backfill_id}"


def _days(since: date, until: date) -> int:
    return (until - since).days + 1

"""`equals_sum_of_ad_spend`'s evaluation: whether a site-day equals the sums of its ad rows.

The check's definitions (`spend/checks.py`) run it for the partitions a run of the spend
assets targets; the runs that record account-days without running the check (a wave, a
fill) report the same evaluations through `evaluate_sum_checks`.
"""

from collections.abc import Collection, Mapping, Sequence
from datetime import date

import dagster as dg

from rastro_assets.defs.dagster_private import (
    AssetCheckExecutionRecordStatus,
    PartitionKeyFilter,
)
from rastro_assets.defs.keys import SUM_CHECK, sum_check_key
from rastro_assets.defs.partitions import spend_partition_key, spend_shard
from rastro_assets.defs.resources import RastroResource
from rastro_assets.outcomes import counted
from rastro_assets.warehouse.audit import site_spend_mismatches

MAX_SHOWN_MISMATCHES = 20
FAILURES_LOOKED_AT = 1000


def sum_check_evaluations(
    con, account_days, failing: Collection[str] = (), shard_of: Mapping[str, int] | None = None
) -> list[dg.AssetCheckEvaluation]:
    """`equals_sum_of_ad_spend` for the account-days a wave records.

    A wave is no run of the asset, so the check would never run for what it
    writes. Every day the wave records is checked here, but an evaluation is a
    stored event that costs the run more than the materialization beside it
    (evaluating all seven days of a daily re-sync made it markedly dearer,
    bench/README.md), so one is kept only where it says something: each
    day that fails, each day whose last evaluation failed (`failing`, so it turns
    green again), and each account's newest recorded day, which shows the waves
    are checked. Each evaluation goes to the check of the account's shard
    (`shard_of`; shard 0 when absent).
    """
    days_by_account: dict[str, list[date]] = {}
    for account, day in account_days:
        days_by_account.setdefault(account, []).append(day)
    evaluations = []
    for account, days in days_by_account.items():
        found: dict[date, list] = {}
        for mismatch in site_spend_mismatches(con, account, days):
            found.setdefault(mismatch[2], []).append(mismatch)
        newest = max(days)
        site_key = spend_shard((shard_of or {}).get(account, 0)).site_key
        for day in days:
            partition = spend_partition_key(account, day)
            if day in found or day == newest or partition in failing:
                evaluations.append(
                    sum_evaluation(site_key, partition, found.get(day, []))
                )
    return evaluations


def failing_sum_check_partitions(
    instance: dg.DagsterInstance, partitions, shard: int = 0
) -> set[str]:
    """Of `partitions`, those whose latest `equals_sum_of_ad_spend` evaluation failed
    (the check of `shard`'s site spend asset).

    One query for the check's recent failures; only a partition among them is
    then asked for its latest evaluation (failures are rare, waves are not).
    """
    storage = instance.event_log_storage
    check_key = sum_check_key(shard)
    recently_failed = {
        record.partition
        for record in storage.get_asset_check_execution_history(
            check_key, limit=FAILURES_LOOKED_AT, status={AssetCheckExecutionRecordStatus.FAILED}
        )
    }
    failing = set()
    for partition in recently_failed.intersection(partitions):
        latest = storage.get_asset_check_execution_history(
            check_key, limit=1, partition_filter=PartitionKeyFilter(key=partition)
        )
        if latest and latest[0].status == AssetCheckExecutionRecordStatus.FAILED:
            failing.add(partition)
    return failing


def evaluate_sum_checks(
    context: dg.OpExecutionContext | dg.AssetExecutionContext,
    rastro: RastroResource,
    checked: Sequence[tuple[str, date]],
    shard_of: Mapping[str, int],
) -> None:
    """`equals_sum_of_ad_spend` for account-days a run recorded without running the check
    (a wave, a fill), each in its account's shard."""
    failing: set[str] = set()
    for shard in sorted({shard_of.get(account, 0) for account, _ in checked}):
        failing |= failing_sum_check_partitions(
            context.instance,
            [
                spend_partition_key(account, day)
                for account, day in checked
                if shard_of.get(account, 0) == shard
            ],
            shard,
        )
    with rastro.warehouse().connect(read_only=True) as con:
        for evaluation in sum_check_evaluations(con, checked, failing, shard_of):
            context.log_event(evaluation)


def sum_evaluation(site_key: dg.AssetKey, partition, mismatches: list) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=site_key,
        check_name=SUM_CHECK,
        passed=not mismatches,
        partition=str(partition),
        metadata=mismatch_metadata(mismatches),
        description=mismatch_line(mismatches, str(partition)),
    )


def mismatch_line(mismatches: list, what: str) -> str:
    """One line for the check's result: what differs, or that nothing does."""
    if not mismatches:
        return f"{what}: the site rows equal the sums of their ad rows"
    shown = ", ".join(f"{site} {account} {day}" for site, account, day, *_ in mismatches[:3])
    more = f" and {len(mismatches) - 3} more" if len(mismatches) > 3 else ""
    verb = "differs" if len(mismatches) == 1 else "differ"
    return f"{counted(len(mismatches), 'site-day')} {verb} from the ad rows' sums: {shown}{more}"


def mismatch_metadata(mismatches: list) -> dict:
    return {
        "mismatches": len(mismatches),
        "examples": dg.MetadataValue.text(
            "\n".join(map(str, mismatches[:MAX_SHOWN_MISMATCHES])) or "none"
        ),
    }

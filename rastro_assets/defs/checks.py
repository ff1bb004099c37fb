"""Asset checks: invariants proven per partition, visible in the UI."""

from datetime import date

import dagster as dg

from rastro_assets.defs.partitions import spend_partition_key, spend_partitions
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.spend_assets import AD_SPEND_DAILY, SITE_SPEND_DAILY
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.warehouse.audit import site_spend_mismatches

MAX_SHOWN_MISMATCHES = 20
SUM_CHECK = "equals_sum_of_ad_spend"


def sum_check_evaluations(con, account_days) -> list[dg.AssetCheckEvaluation]:
    """`equals_sum_of_ad_spend` for each (account, day): how a wave reports the days it wrote.

    A wave is no run of the asset, so its check would never run; each account-day it
    records as materialized gets the check's evaluation beside its materialization.
    """
    days_by_account: dict[str, list[date]] = {}
    for account, day in account_days:
        days_by_account.setdefault(account, []).append(day)
    evaluations = []
    for account, days in days_by_account.items():
        found: dict[date, list] = {}
        for mismatch in site_spend_mismatches(con, account, days):
            found.setdefault(mismatch[2], []).append(mismatch)
        evaluations += [
            dg.AssetCheckEvaluation(
                asset_key=SITE_SPEND_DAILY,
                check_name=SUM_CHECK,
                passed=day not in found,
                partition=spend_partition_key(account, day),
                metadata=_mismatch_metadata(found.get(day, [])),
            )
            for day in days
        ]
    return evaluations


def _mismatch_metadata(mismatches: list) -> dict:
    return {
        "mismatches": len(mismatches),
        "examples": dg.MetadataValue.text(
            "\n".join(map(str, mismatches[:MAX_SHOWN_MISMATCHES])) or "none"
        ),
    }


@dg.asset_check(
    asset=SITE_SPEND_DAILY,
    name=SUM_CHECK,
    description="site_spend_daily equals the sums of ad_spend_daily over the site's links.",
    partitions_def=spend_partitions,
)
def site_spend_equals_ad_sums(
    context: dg.AssetCheckExecutionContext, rastro: RastroResource
) -> dg.AssetCheckResult:
    keys = context.partition_keys if context.has_partition_key_range else [context.partition_key]
    mismatches = []
    with rastro.warehouse().connect(read_only=True) as con:
        for key in keys:
            dims = key.keys_by_dimension
            mismatches += site_spend_mismatches(
                con, dims["account"], [date.fromisoformat(dims["date"])]
            )
    return dg.AssetCheckResult(passed=not mismatches, metadata=_mismatch_metadata(mismatches))


ACCOUNTS_FRESH = "accounts_fresh"


def freshness_evaluation(accounts: list[PlannedAccount], now) -> dg.AssetCheckEvaluation:
    """Which accounts' today is older than the freshness limit, as a check result."""
    stale = [account for account in accounts if cadence.is_stale(account.state, now)]
    rows = [
        f"| {account.state.ad_account_id} | {_age(cadence.today_synced_at(account.state), now)} "
        f"| {cadence.status(account.state, now).state} |"
        for account in stale
    ]
    table = "\n".join(["| account | today synced | state |", "|---|---|---|", *rows])
    return dg.AssetCheckEvaluation(
        asset_key=AD_SPEND_DAILY,
        check_name=ACCOUNTS_FRESH,
        passed=not stale,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "accounts": len(accounts),
            "stale_accounts": len(stale),
            "stale": dg.MetadataValue.md(table if stale else "every account is fresh"),
            "limit_minutes": int(cadence.FRESHNESS_LIMIT.total_seconds() // 60),
        },
    )


def _age(synced_at, now) -> str:
    if synced_at is None:
        return "never"
    return f"{int((now - synced_at).total_seconds() // 60)} min ago"


@dg.asset_check(
    asset=AD_SPEND_DAILY,
    name=ACCOUNTS_FRESH,
    description="Every linked account's local today was read within the last 50 minutes. "
    "The cadence sensor re-evaluates it whenever the set of stale accounts changes.",
)
def accounts_fresh(rastro: RastroResource) -> dg.AssetCheckResult:
    with rastro.warehouse().connect() as con:
        accounts = planned_accounts(con)
    evaluation = freshness_evaluation(accounts, rastro.clock()())
    return dg.AssetCheckResult(
        passed=evaluation.passed, severity=evaluation.severity, metadata=evaluation.metadata
    )

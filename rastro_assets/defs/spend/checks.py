"""The spend pair's asset checks: the site rows equal their ad rows' sums, and every
account's local today is fresh."""

from datetime import date

import dagster as dg

from rastro_assets.defs.account_health import freshness_evaluation
from rastro_assets.defs.keys import ACCOUNTS_FRESH, SUM_CHECK
from rastro_assets.defs.partitions import spend_shard
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.sum_check import mismatch_line, mismatch_metadata, sum_evaluation
from rastro_assets.planner.history import planned_accounts
from rastro_assets.warehouse.audit import site_spend_mismatches


def build_sum_check(shard: int) -> dg.AssetChecksDefinition:
    spend = spend_shard(shard)

    @dg.asset_check(
        asset=spend.site_key,
        name=SUM_CHECK,
        description=(
            f"{spend.site_key.to_user_string()} equals the sums of "
            f"{spend.ad_key.to_user_string()} over the site's links."
        ),
        partitions_def=spend.partitions,
    )
    def site_spend_equals_ad_sums(
        context: dg.AssetCheckExecutionContext, rastro: RastroResource
    ) -> dg.AssetCheckResult:
        in_range = context.has_partition_key_range
        keys = context.partition_keys if in_range else [context.partition_key]
        mismatches = []
        with rastro.warehouse().connect(read_only=True) as con:
            for key in keys:
                dims = key.keys_by_dimension
                found = site_spend_mismatches(
                    con, dims["account"], [date.fromisoformat(dims["date"])]
                )
                if in_range:
                    # Dagster plans this check once per partition of a range run but stores
                    # the result below under no partition: without an evaluation of its own,
                    # every partition would read "Skipped" once the run ends.
                    context.op_execution_context.log_event(
                        sum_evaluation(spend.site_key, key, found)
                    )
                mismatches += found
        what = f"{len(keys)} account-days" if in_range else str(keys[0])
        return dg.AssetCheckResult(
            passed=not mismatches,
            metadata=mismatch_metadata(mismatches),
            description=mismatch_line(mismatches, what),
        )

    return site_spend_equals_ad_sums


def build_freshness_check(shard: int, shard_count: int) -> dg.AssetChecksDefinition:
    which = "" if shard_count == 1 else f" of shard {shard}"

    @dg.asset_check(
        asset=spend_shard(shard).ad_key,
        name=ACCOUNTS_FRESH,
        description=f"Every linked account{which}'s local today was read within the last 50 "
        "minutes (an idle account's, read live every 3 hours, within 3 h 5 min). The cadence "
        "sensor re-evaluates it whenever the set of stale accounts changes.",
    )
    def accounts_fresh(rastro: RastroResource) -> dg.AssetCheckResult:
        with rastro.warehouse().connect() as con:
            accounts = planned_accounts(con)
        if shard_count > 1:
            accounts = [account for account in accounts if account.shard == shard]
        evaluation = freshness_evaluation(accounts, rastro.clock()(), shard)
        return dg.AssetCheckResult(
            passed=evaluation.passed,
            severity=evaluation.severity,
            metadata=evaluation.metadata,
            description=evaluation.description,
        )

    return accounts_fresh


def shard_defs(shard: int, shard_count: int) -> dg.Definitions:
    return dg.Definitions(
        asset_checks=[build_sum_check(shard), build_freshness_check(shard, shard_count)]
    )

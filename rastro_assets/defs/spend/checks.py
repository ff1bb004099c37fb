"""Asset checks: invariants proven per partition, visible in the UI."""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date

import dagster as dg

from rastro_assets.defs.dagster_private import (
    AssetCheckEvaluationTargetMaterializationData,
    AssetCheckExecutionRecordStatus,
    PartitionKeyFilter,
)
from rastro_assets.defs.keys import SITE_SPEND_DAILY
from rastro_assets.defs.partitions import SHARD_COUNT, spend_partition_key
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.spend.shard import spend_shard
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.warehouse.audit import site_spend_mismatches

MAX_SHOWN_MISMATCHES = 20
SUM_CHECK = "equals_sum_of_ad_spend"
SUM_CHECK_KEY = dg.AssetCheckKey(SITE_SPEND_DAILY, SUM_CHECK)
FAILURES_LOOKED_AT = 1000


def sum_check_key(shard: int = 0) -> dg.AssetCheckKey:
    return dg.AssetCheckKey(spend_shard(shard).site_key, SUM_CHECK)


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
                    _sum_evaluation(site_key, partition, found.get(day, []))
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


def _sum_evaluation(site_key: dg.AssetKey, partition, mismatches: list) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=site_key,
        check_name=SUM_CHECK,
        passed=not mismatches,
        partition=str(partition),
        metadata=_mismatch_metadata(mismatches),
        description=_mismatch_line(mismatches, str(partition)),
    )


def _mismatch_line(mismatches: list, what: str) -> str:
    """One line for the check's result: what differs, or that nothing does."""
    if not mismatches:
        return f"{what}: the site rows equal the sums of their ad rows"
    shown = ", ".join(f"{site} {account} {day}" for site, account, day, *_ in mismatches[:3])
    more = f" and {len(mismatches) - 3} more" if len(mismatches) > 3 else ""
    verb = "differs" if len(mismatches) == 1 else "differ"
    return f"{_count(len(mismatches), 'site-day')} {verb} from the ad rows' sums: {shown}{more}"


def _mismatch_metadata(mismatches: list) -> dict:
    return {
        "mismatches": len(mismatches),
        "examples": dg.MetadataValue.text(
            "\n".join(map(str, mismatches[:MAX_SHOWN_MISMATCHES])) or "none"
        ),
    }


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
                        _sum_evaluation(spend.site_key, key, found)
                    )
                mismatches += found
        what = f"{len(keys)} account-days" if in_range else str(keys[0])
        return dg.AssetCheckResult(
            passed=not mismatches,
            metadata=_mismatch_metadata(mismatches),
            description=_mismatch_line(mismatches, what),
        )

    return site_spend_equals_ad_sums


site_spend_equals_ad_sums = build_sum_check(0)


ACCOUNTS_FRESH = "accounts_fresh"


MAX_HEALTH_ROWS = 200
"""Accounts shown in the health table, the least healthy first: the rest are counted."""

HEALTH_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("ad_account_id", "string"),
        dg.TableColumn("state", "string", description="backfilling | live | error | paused"),
        dg.TableColumn(
            "today_fresh",
            "bool",
            description="local today read within its limit (50 min; idle: 3 h 5 min)",
        ),
        dg.TableColumn("last_good_sync", "string", description="last successful sync's end"),
        dg.TableColumn("next_due", "string", description="when the cadence reads it next"),
        dg.TableColumn(
            "backfill", "string", description="days read of the backfill or gap fill owed"
        ),
        dg.TableColumn("last_error", "string", description="CODE: message"),
        dg.TableColumn("meta_usage_pct", "float", description="Meta's usage after its last sync"),
    ]
)
_STATE_RANK = {"paused": 0, "error": 1, "waiting": 2, "backfilling": 3, "live": 4}


@dataclass(frozen=True)
class Freshness:
    """Every account's health row, and which accounts the check names."""

    rows: list[dict]
    stale: list[str]
    paused: list[str]
    backfilling: list[str]

    @property
    def passed(self) -> bool:
        return not self.stale and not self.paused

    def line(self) -> str:
        """The check's one-line description: what is wrong, or that nothing is."""
        total = len(self.rows)
        if not total:
            return "no linked accounts"
        waiting = f"; {len(self.backfilling)} backfilling" if self.backfilling else ""
        problems = [
            f"{len(names)} {what}: {_names(names)}"
            for what, names in (("paused (token invalid)", self.paused), ("stale", self.stale))
            if names
        ]
        if problems:
            return f"{'; '.join(problems)} (of {_count(total, 'account')}{waiting})"
        fresh = total - len(self.backfilling)
        if not fresh:
            return f"nothing stale: {_count(total, 'account')} backfilling"
        return f"{_count(fresh, 'account')} fresh, none stale{waiting}"

    def cursor_entry(self) -> dict:
        """What the cadence sensor compares to decide whether to report a new evaluation."""
        return {"stale": self.stale, "paused": self.paused, "backfilling": len(self.backfilling)}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _names(accounts: list[str], shown: int = 5) -> str:
    more = f" and {len(accounts) - shown} more" if len(accounts) > shown else ""
    return ", ".join(accounts[:shown]) + more


def freshness(
    accounts: list[PlannedAccount],
    now,
    statuses: Mapping[str, cadence.AccountStatus] | None = None,
) -> Freshness:
    """Which accounts are stale, paused or still backfilling at `now`.

    An account whose first backfill (or a gap fill after a pause) is under way
    has no today yet by design: it is "backfilling", not stale, unless its
    last sync failed (then its state is "error" and it counts as stale).
    `statuses`: each account's `cadence.status` at `now`, when the caller has them.
    """
    statuses = statuses or {}
    rows = [_health(account, now, statuses.get(account.state.ad_account_id))
            for account in accounts]
    rows.sort(key=lambda row: (_STATE_RANK.get(row["state"], 0), row["today_fresh"],
                               row["ad_account_id"]))
    return Freshness(
        rows=rows,
        stale=[
            row["ad_account_id"]
            for row in rows
            if not row["today_fresh"] and row["state"] not in ("backfilling", "paused")
        ],
        paused=[row["ad_account_id"] for row in rows if row["state"] == "paused"],
        backfilling=[
            row["ad_account_id"]
            for row in rows
            if row["state"] == "backfilling" and not row["today_fresh"]
        ],
    )


def freshness_evaluation(
    accounts: list[PlannedAccount],
    now,
    shard: int = 0,
    found: Freshness | None = None,
    target: dg.EventLogRecord | None = None,
) -> dg.AssetCheckEvaluation:
    """Which accounts' today is older than the freshness limit, with every account's health.

    The evaluation belongs to `shard`'s check; `accounts` are that shard's, and
    `found` their `freshness` when the caller has it; `target` the asset's latest
    materialization when the evaluation is reported outside a run.

    A paused account (its token is dead) syncs nothing until someone connects a
    new token, so it is an ERROR; stale accounts that retry on their own, a WARN.
    """
    found = found or freshness(accounts, now)
    rows = found.rows
    shown = rows[:MAX_HEALTH_ROWS]
    return dg.AssetCheckEvaluation(
        asset_key=spend_shard(shard).ad_key,
        check_name=ACCOUNTS_FRESH,
        passed=found.passed,
        severity=dg.AssetCheckSeverity.ERROR if found.paused else dg.AssetCheckSeverity.WARN,
        description=found.line(),
        target_materialization_data=target
        and AssetCheckEvaluationTargetMaterializationData(
            storage_id=target.storage_id, run_id=target.run_id, timestamp=target.timestamp
        ),
        metadata={
            "accounts": len(accounts),
            "stale_accounts": len(found.stale),
            "paused_accounts": len(found.paused),
            "backfilling_accounts": len(found.backfilling),
            "stale": dg.MetadataValue.text(", ".join(found.stale[:MAX_HEALTH_ROWS]) or "none"),
            "health": health_table(shown),
            "accounts_not_shown": len(rows) - len(shown),
            "limit_minutes": int(cadence.FRESHNESS_LIMIT.total_seconds() // 60),
            "idle_limit_minutes": int(
                (cadence.FRESHNESS_LIMIT + cadence.IDLE_LIVE_INTERVAL - cadence.LIVE_INTERVAL)
                .total_seconds() // 60
            ),
        },
    )


def health_table(rows: list[dict]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[dg.TableRecord(row) for row in rows], schema=HEALTH_SCHEMA
    )


def _health(account: PlannedAccount, now, status: cadence.AccountStatus | None = None) -> dict:
    state = account.state
    status = status or cadence.status(state, now)
    usage = next((run.usage_pct for run in reversed(state.runs) if run.usage_pct is not None), None)
    return {
        "ad_account_id": state.ad_account_id,
        "state": status.state,
        "today_fresh": not cadence.is_stale(state, now),
        "last_good_sync": _instant(status.last_sync_at),
        "next_due": _instant(status.next_sync_at),
        "backfill": (
            f"{status.backfill[0]} of {status.backfill[1]} days" if status.backfill else ""
        ),
        "last_error": status.last_error or "",
        "meta_usage_pct": float(usage) if usage is not None else 0.0,
    }


def _instant(value) -> str:
    """ISO 8601 in UTC, so the column sorts as time."""
    return value.astimezone(UTC).isoformat(timespec="minutes") if value else ""


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


accounts_fresh = build_freshness_check(0, SHARD_COUNT)

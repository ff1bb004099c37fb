"""Every linked account's health: the rows the cadence computes, and the two tables that
show them.

`accounts_fresh` (each spend pair's check) shows the wide table, with Meta's usage;
`meta_account_health` the narrow one its overview fits. Both are the same rows
(`freshness`), the least healthy first, as `rastro status` prints them.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC

import dagster as dg

from rastro_assets.defs.dagster_private import AssetCheckEvaluationTargetMaterializationData
from rastro_assets.defs.keys import ACCOUNTS_FRESH, ad_spend_key
from rastro_assets.outcomes import counted
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount

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
        dg.TableColumn(
            "rate_limit",
            "string",
            description="the Meta limit holding it: ads_insights | ads_management | "
            "ad_account_score | account_insights_load | app_insights_load | app_platform | "
            "abuse; empty when none holds it",
        ),
        dg.TableColumn("held_until", "string", description="when that limit lets it go"),
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
            return f"{'; '.join(problems)} (of {counted(total, 'account')}{waiting})"
        fresh = total - len(self.backfilling)
        if not fresh:
            return f"nothing stale: {counted(total, 'account')} backfilling"
        return f"{counted(fresh, 'account')} fresh, none stale{waiting}"

    def cursor_entry(self) -> dict:
        """What the cadence sensor compares to decide whether to report a new evaluation."""
        return {"stale": self.stale, "paused": self.paused, "backfilling": len(self.backfilling)}


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
        asset_key=ad_spend_key(shard),
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
        "rate_limit": _held_by(status),
        "held_until": _instant(status.rate_limit.until) if status.rate_limit else "",
    }


def _held_by(status: cadence.AccountStatus) -> str:
    held = status.rate_limit
    if held is None:
        return ""
    # A throttle whose answer named no limit still holds the account.
    return held.limit or "unnamed"


def _instant(value) -> str:
    """ISO 8601 in UTC, so the column sorts as time."""
    return value.astimezone(UTC).isoformat(timespec="minutes") if value else ""


HEALTH_COLUMNS = [
    dg.TableColumn("account", "string", description="the Meta ad account"),
    dg.TableColumn(
        "state",
        "string",
        description="backfilling | live | error | paused | waiting (for the first sync with a "
        "new token); \", stale\" when its local today "
        "was not read within its limit (50 min; idle: 3 h 5 min)",
    ),
    dg.TableColumn("synced", "string", description="last good sync's end, UTC (MM-DD HH:MM)"),
    dg.TableColumn(
        "due",
        "string",
        description="when the cadence reads it next, UTC; \", held by\" the Meta limit that "
        "holds it until then (its business use case, its score, the app's load, abuse)",
    ),
    dg.TableColumn(
        "backfill", "string", description="days read of the backfill or gap fill owed"
    ),
    dg.TableColumn("error", "string", description="last error: CODE: message"),
]


def _short_instant(value: str) -> str:
    """`2026-12-02T14:22+00:00` (UTC) as `12-02 14:22`: it sorts, and breaks at the space."""
    return f"{value[5:10]} {value[11:16]}" if value else ""


def _due(row: dict) -> str:
    # A sixth column would not fit the overview: the hold shares the time it ends.
    due = _short_instant(row["next_due"])
    return f"{due}, held by {row['rate_limit']}" if row["rate_limit"] else due


def _state(row: dict) -> str:
    stale = not row["today_fresh"] and row["state"] not in ("backfilling", "paused")
    return f"{row['state']}, stale" if stale else row["state"]


def narrow_health_table(rows: list[dict], *, with_shard: bool = False) -> dg.TableMetadataValue:
    """The accounts' rows (`checks.freshness`) in the narrow form the overview fits."""
    columns = [*HEALTH_COLUMNS, *([dg.TableColumn("shard", "int")] if with_shard else [])]
    records = [
        dg.TableRecord(
            {
                "account": row["ad_account_id"],
                "state": _state(row),
                "synced": _short_instant(row["last_good_sync"]),
                "due": _due(row),
                "backfill": row["backfill"],
                "error": row["last_error"],
                **({"shard": row["shard"]} if with_shard else {}),
            }
        )
        for row in rows
    ]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=columns))

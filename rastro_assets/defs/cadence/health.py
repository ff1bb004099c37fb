"""`meta_account_health`: every linked account's state where a Dagster user looks.

The same figures as `rastro status`: state, last good sync, next due, backfill
progress and last error, one row per account, as the latest observation of an
asset of its own. The cadence sensor observes it (it already plans every account
each tick); an observation is a stored event, so it is written when an account's
state, backfill progress or error changes, and at most every
`HEALTH_REFRESH_MINUTES` otherwise.
"""

import hashlib
import json
from datetime import datetime, timedelta

import dagster as dg

from rastro_assets.defs.spend.checks import MAX_HEALTH_ROWS, freshness, health_table
from rastro_assets.planner.history import PlannedAccount

META_ACCOUNT_HEALTH = dg.AssetKey("meta_account_health")
HEALTH_REFRESH_MINUTES = 30
SIGNATURE_FIELDS = ("ad_account_id", "state", "backfill", "last_error", "today_fresh")

meta_account_health = dg.AssetSpec(
    META_ACCOUNT_HEALTH,
    description=(
        "One row per linked account, the least healthy first: its state (backfilling | live | "
        "error | paused), whether its local today is fresh, its last good sync, when the "
        "cadence reads it next, its backfill progress and its last error; the same as "
        "`rastro status`. Observed by the meta_cadence sensor whenever an account's state, "
        f"progress or error changes, and every {HEALTH_REFRESH_MINUTES} minutes. It is "
        "observed, never materialized: the overview's \"Never materialized\" and \"No "
        "automations\" are how Dagster shows a sensor's observations; the table is the "
        "`health` row under Metadata, and each observation's under Events."
    ),
    group_name="meta_spend",
    kinds={"meta"},
    owners=["team:data-engineering"],
    tags={"domain": "marketing"},
)


def health_observation(
    accounts: list[PlannedAccount], now: datetime, shard_count: int = 1
) -> tuple[dg.AssetObservation, str]:
    """The observation of every account's health, and the signature of what it says."""
    found = freshness(accounts, now)
    rows = found.rows
    if shard_count > 1:
        shard_of = {account.state.ad_account_id: account.shard for account in accounts}
        rows = [{**row, "shard": shard_of[row["ad_account_id"]]} for row in rows]
    states: dict[str, int] = {}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    summary = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    shown = rows[:MAX_HEALTH_ROWS]
    observation = dg.AssetObservation(
        asset_key=META_ACCOUNT_HEALTH,
        description=f"{len(rows)} accounts: {summary}" if rows else "no linked accounts",
        metadata={
            "accounts": len(rows),
            **{f"accounts_{state}": count for state, count in sorted(states.items())},
            "health": health_table(shown, with_shard=shard_count > 1),
            "accounts_not_shown": len(rows) - len(shown),
            "checked_at": now.isoformat(timespec="minutes"),
        },
    )
    signature = hashlib.sha256(
        json.dumps([[row[field] for field in SIGNATURE_FIELDS] for row in rows]).encode()
    ).hexdigest()[:16]
    return observation, signature


def health_due(before: dict, signature: str, now: datetime) -> bool:
    """Whether the health changed since the last observation, or that one is too old."""
    if before.get("signature") != signature:
        return True
    try:
        observed_at = datetime.fromisoformat(before["observed_at"])
    except (KeyError, TypeError, ValueError):
        return True
    return now - observed_at >= timedelta(minutes=HEALTH_REFRESH_MINUTES)

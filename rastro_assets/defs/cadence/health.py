"""`meta_account_health`: every linked account's state where a Dagster user looks.

The same figures as `rastro status`: state, last good sync, next due, backfill
progress and last error, one row per account, as the latest materialization
of an asset of its own. The cadence sensor records it (it already plans every
account each tick) as a reported materialization, so the asset's overview
shows when it was last refreshed; a run of the asset (Materialize in the UI, or
the `meta_account_health_refresh` job) computes the same table at once. Its
`unrecorded` entry counts the account-days the warehouse holds from a complete read that
Dagster does not show as materialized: as `meta_records` last found them when the sensor
records it, counted at once by a run. Each
recording is a stored event, so the sensor writes one when an account's state,
backfill progress or error changes, and at most every `HEALTH_REFRESH_MINUTES`
otherwise.

The table is narrow on purpose: the overview shows it inside its Metadata
table's value column (about 460 px at 1440 px), where a column is never
narrower than its longest unbroken word. So the headers are short single
words, the times `MM-DD HH:MM` in UTC, and every long value breaks at spaces.
"""

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta

import dagster as dg

from rastro_assets.defs.account_health import MAX_HEALTH_ROWS, freshness, narrow_health_table
from rastro_assets.defs.cadence.records import UNRECORDED, stored_not_recorded
from rastro_assets.defs.keys import META_ACCOUNT_HEALTH
from rastro_assets.defs.resources import RastroResource
from rastro_assets.outcomes import counted
from rastro_assets.planner.cadence import AccountStatus
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.warehouse import shard_store

HEALTH_REFRESH_MINUTES = 30
HEALTH_JOB = "meta_account_health_refresh"
SIGNATURE_FIELDS = (
    "ad_account_id", "state", "backfill", "last_error", "today_fresh", "rate_limit"
)
STATES = ("backfilling", "error", "live", "paused", "waiting")

meta_account_health_description = (
    "One row per linked account, the least healthy first: its state (backfilling | live | "
    "error | paused | waiting, \", stale\" when its local today is not fresh), its last good "
    "sync, when "
    "the cadence reads it next (both UTC; \", held by\" the Meta limit that holds it until "
    "then: its business use case, its score, the app's load, abuse prevention), its backfill "
    "progress and its last error; the "
    "same as `rastro status` (the accounts_fresh check's table adds Meta's usage, the "
    "limit holding it and until when). The table "
    "is the `health` row under Metadata. The meta_cadence sensor keeps it fresh: it records "
    "a materialization whenever an account's state, progress or error changes, and every "
    f"{HEALTH_REFRESH_MINUTES} minutes (see Automation). Materialize computes it at once. "
    "`unrecorded` counts the account-days the warehouse holds from a complete read that the "
    "spend assets do not show as materialized yet (meta_records records them)."
)


def health_metadata(
    accounts: list[PlannedAccount],
    now: datetime,
    shard_count: int = 1,
    statuses: Mapping[str, AccountStatus] | None = None,
    unrecorded: int | None = None,
) -> tuple[dict, str, str]:
    """Every account's health as metadata, a one-line summary, and the signature of what
    it says. Keys are short: the overview's key column is as wide as the longest.

    `statuses`: each account's `cadence.status` at `now`, when the caller has them.
    `unrecorded`: the account-days the warehouse holds that Dagster does not record as
    materialized (`records`), when known.
    """
    rows = freshness(accounts, now, statuses).rows
    if shard_count > 1:
        shard_of = shard_store.shard_of(accounts)
        rows = [{**row, "shard": shard_of[row["ad_account_id"]]} for row in rows]
    states = {state: 0 for state in STATES}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    summary = ", ".join(f"{count} {state}" for state, count in sorted(states.items()) if count)
    shown = rows[:MAX_HEALTH_ROWS]
    metadata = {
        "accounts": len(rows),
        **states,
        "health": narrow_health_table(shown, with_shard=shard_count > 1),
        "not_shown": len(rows) - len(shown),
    }
    said = [[row[field] for field in SIGNATURE_FIELDS] for row in rows]
    line = f"{len(rows)} accounts: {summary}" if rows else "no linked accounts"
    if unrecorded is not None:
        metadata[UNRECORDED] = unrecorded
        said.append(unrecorded)
        if unrecorded:
            line += f"; {counted(unrecorded, 'stored account-day')} not recorded in Dagster yet"
    signature = hashlib.sha256(json.dumps(said).encode()).hexdigest()[:16]
    return metadata, line, signature


def health_materialization(
    accounts: list[PlannedAccount],
    now: datetime,
    shard_count: int = 1,
    statuses: Mapping[str, AccountStatus] | None = None,
    unrecorded: int | None = None,
) -> tuple[dg.AssetMaterialization, str]:
    """The sensor's recording of every account's health, and the signature of what it says."""
    metadata, line, signature = health_metadata(
        accounts, now, shard_count, statuses, unrecorded
    )
    return (
        dg.AssetMaterialization(asset_key=META_ACCOUNT_HEALTH, description=line, metadata=metadata),
        signature,
    )


def health_due(before: dict, signature: str, now: datetime) -> bool:
    """Whether the health changed since the last recording, or that one is too old."""
    if before.get("signature") != signature:
        return True
    try:
        recorded_at = datetime.fromisoformat(before["recorded_at"])
    except (KeyError, TypeError, ValueError):
        return True
    return now - recorded_at >= timedelta(minutes=HEALTH_REFRESH_MINUTES)


def build_meta_account_health(shard_count: int) -> dg.AssetsDefinition:
    """`meta_account_health` over the accounts of `shard_count` shards."""

    @dg.asset(
        key=META_ACCOUNT_HEALTH,
        description=meta_account_health_description,
        group_name="meta_spend",
        kinds={"meta"},
        owners=["team:data-engineering"],
        tags={"domain": "marketing"},
    )
    def meta_account_health(
        context: dg.AssetExecutionContext, rastro: RastroResource
    ) -> dg.MaterializeResult:
        """Every linked account's health now, read from the warehouse as the cadence reads
        it, and the account-days it holds that the instance does not record, counted now."""
        with rastro.warehouse().connect(read_only=True) as con:
            accounts = planned_accounts(con)
        now = rastro.clock()()
        missing = stored_not_recorded(context.instance, rastro.warehouse(), now, shard_count)
        unrecorded = sum(missing.account_days().values())
        metadata, line, _ = health_metadata(accounts, now, shard_count, unrecorded=unrecorded)
        context.log.info(line)
        return dg.MaterializeResult(metadata=metadata)

    return meta_account_health


def build_health_job():
    return dg.define_asset_job(
        HEALTH_JOB,
        selection=[META_ACCOUNT_HEALTH],
        description="Every linked account's health, computed now. The meta_cadence sensor "
        f"records it whenever a state changes and every {HEALTH_REFRESH_MINUTES} minutes; "
        "launch this job to refresh it by hand.",
    )


def location_defs(shard_count: int) -> dg.Definitions:
    return dg.Definitions(assets=[build_meta_account_health(shard_count)])

"""The sync wave: one Dagster run syncs every account that fell due together.

A run costs seconds of Dagster overhead (bench/README.md); a live sync of
one account costs a few Meta calls. Grouping the accounts due in one sensor tick into one run,
with bounded concurrency inside, keeps the 45-minute cadence cheap at a
thousand accounts. Each account-day the wave replaced completely is still
recorded as a materialization of its partition, so the partition grid and
freshness stay true.

Only the cadence's sensors record the cadence's kinds (`live`, `daily`, `weekly`, and a
first-data run's `backfill` or `gap`), which the planner trusts: they seal each wave's plan
(`planner.wave_seal`, which says why a seal), and a wave launched by hand from the Launchpad
syncs with kind `manual` or is refused in one line. Either way its accounts are each synced
once, and a range Meta cannot answer is refused before anything is read or written.
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

import dagster as dg

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.defs.cadence.busy import busy_accounts
from rastro_assets.defs.dagster_private import log_materialization_batches
from rastro_assets.defs.keys import MAX_RUNTIME_TAG, WAVE_TAG
from rastro_assets.defs.metadata import (
    catalog_materializations,
    materializations,
    table_materializations,
)
from rastro_assets.defs.partitions import (
    configured_shard_count,
    spend_partition_key,
    spend_shard,
)
from rastro_assets.defs.publishing import publish_after_writes
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.sum_check import evaluate_sum_checks
from rastro_assets.outcomes import GUIDED_CODES, error_code, guide_reference
from rastro_assets.planner import cadence
from rastro_assets.planner.wave_seal import (
    HAND_KIND,
    PLAN_LIFETIME,
    SEALED_FIELDS,
    plan_is_stale,
    seal,
    seal_refusal,
)
from rastro_assets.sync.spend_read import range_refusal
from rastro_assets.sync.types import SyncOutcome, SyncRequest
from rastro_assets.timekeeping import local_date, zone
from rastro_assets.vault import SecretsKeyError
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.shard_store import account_shards

WAVE_JOB = "meta_sync_wave"
WAVE_MAX_RUNTIME_SECONDS = int(cadence.LEASE.total_seconds())
"""A sync's lease: by then the planner takes the wave's accounts again, and the spend
writer refuses what the old wave still writes."""

# Accounts a wave syncs at once. A live sync mostly waits on Meta's answers, so this many
# side by side keep a live wave of thousands of accounts within its goal while the CPU goes
# to the writer (bench/latency.py; its figures in bench/README.md).
WAVE_CONCURRENCY = 16


class WaveSync(dg.Config):
    ad_account_id: str
    kind: str
    since: str
    until: str
    catalog: bool = False


class WaveConfig(dg.Config):
    syncs: list[WaveSync]
    planned_at: str = ""
    """When a sensor planned the wave (ISO 8601); empty in a wave launched by hand."""
    seal: str = ""
    """The sensor's seal over the syncs and `planned_at` (`planner.wave_seal`): a wave
    launched by hand has none, and its kinds may only be `manual`."""


def sealed_wave_config(
    syncs: Sequence[Mapping], now: datetime, key: bytes | None = None
) -> dict:
    """The `sync_wave` op's config for a sensor's `syncs`, sealed as planned at `now` (with
    the key of the environment's secrets key unless given)."""
    planned_at = now.isoformat()
    return {"syncs": list(syncs), "planned_at": planned_at, "seal": seal(syncs, planned_at, key)}


LIVE_RECORD_BLOCK_MINUTES = 180
"""Live waves mark a changed partition once per this many local minutes."""


def days_worth_recording(outcome: SyncOutcome, recorded: Collection[str] = ()) -> list[date]:
    """The completely read days whose partition a materialization should mark.

    A materialization costs CPU and instance storage (bench/README.md), and
    live waves re-read today and yesterday of every account every 45 minutes:
    recording each would be most of the cadence's cost. So a day unchanged
    since its last write is not recorded (the materialization that wrote its
    rows still shows it), and a live wave records changed days only in the
    first 45 minutes of each three-hour block of the account's local clock.
    An empty day has no write to mark it read: a live wave records it while
    its partition has no materialization yet (`recorded` holds those that
    have one), whatever the block, since an idle account's reads three hours
    apart may never fall in one. Daily, weekly and backfill reads record every
    day they changed and every empty day. Freshness to the minute is the
    `accounts_fresh` check's job, and the DuckDB rows themselves are replaced
    on every wave.
    """
    changed = set(outcome.changed_days)
    live = outcome.request.kind == "live"
    recording_block = not live or _first_wave_of_block(outcome)
    empty = set(empty_days(outcome))
    account = outcome.request.ad_account_id
    return [
        day
        for day in outcome.complete_days
        if (day in changed and recording_block)
        or (day in empty and not (live and spend_partition_key(account, day) in recorded))
    ]


def empty_days(outcome: SyncOutcome) -> list[date]:
    """Completely read days on which Meta reported no delivery."""
    return [
        day
        for day in outcome.complete_days
        if day not in outcome.days or outcome.days[day].rows == 0
    ]


def materialized_partitions(
    instance: dg.DagsterInstance, partitions, shard_of: Mapping[str, int] | None = None
) -> set[str]:
    """Of `partitions`, those their account's shard's `ad_spend_daily` already has a
    materialization of (one query a shard)."""
    by_shard: dict[int, set[str]] = {}
    for partition in partitions:
        account = str(partition).split("|", 1)[0]
        by_shard.setdefault((shard_of or {}).get(account, 0), set()).add(partition)
    found: set[str] = set()
    for shard, keys in sorted(by_shard.items()):
        found.update(
            instance.get_latest_storage_id_by_partition(
                spend_shard(shard).ad_key,
                dg.DagsterEventType.ASSET_MATERIALIZATION,
                partitions=keys,
            )
        )
    return found


def _first_wave_of_block(outcome: SyncOutcome) -> bool:
    if outcome.started_at is None:
        return True
    local = outcome.started_at.astimezone(zone(outcome.timezone))
    minutes = local.hour * 60 + local.minute
    return minutes % LIVE_RECORD_BLOCK_MINUTES < cadence.LIVE_INTERVAL.total_seconds() // 60


@dg.op(
    description="Syncs each account of the wave, a few at a time; one account's failure "
    "is recorded for its back-off and does not stop the others.",
    pool="meta_api",
)
def sync_wave(
    context: dg.OpExecutionContext, config: WaveConfig, rastro: RastroResource
) -> None:
    # Returns nothing, so no IO manager stores an output: a run pod keeps no file of its own.
    requests = _not_held(context, _requests(context, config, rastro))
    wave = rastro.syncer().sync_wave(
        requests, synced_at=rastro.run_started_at(context), concurrency=WAVE_CONCURRENCY
    )
    for request, reason in wave.refused:
        context.log.warning(f"{request.ad_account_id}: skipped: {reason}")
    outcomes = wave.outcomes
    # Read when recording, not from the sensor's tick: a `rastro shard move` meanwhile
    # must not leave this wave's days in the account's old shard.
    with rastro.warehouse().connect(read_only=True) as con:
        shard_of = account_shards(con, [request.ad_account_id for request in requests])
    tally = _record_outcomes(context, outcomes, shard_of)
    if tally.checked:
        evaluate_sum_checks(context, rastro, tally.checked, shard_of)
    if tally.recorded:
        # Each table's figures after the partitions: the overview shows the latest event's.
        shards = sorted({shard_of.get(o.request.ad_account_id, 0) for o in outcomes})
        shard_count = configured_shard_count()
        for shard in shards:
            with_catalog = outcomes if shard == shards[0] else ()
            for event in table_materializations(rastro, shard, shard_count, with_catalog):
                context.log_event(event)
    _report(context, tally, accounts=len(requests), skipped=len(wave.refused))
    publish_after_writes(context, rastro)
    if outcomes and tally.failed == len(outcomes):
        raise dg.Failure(description=all_failed(outcomes), allow_retries=False)


# Accounts a wave's failure names for each cause; the run's log names every one.
NAMED_ACCOUNTS = 5


def all_failed(outcomes: Sequence[SyncOutcome]) -> str:
    """One line for a wave whose every account failed: the accounts by cause, and where the
    guide says what to do."""
    by_cause: dict[str, list[str]] = {}
    for outcome in outcomes:
        cause = error_code(outcome.error) or (outcome.error or "failed").split(":", 1)[0]
        by_cause.setdefault(cause, []).append(outcome.request.ad_account_id)
    parts = []
    for cause, accounts in by_cause.items():
        named = ", ".join(accounts[:NAMED_ACCOUNTS])
        more = len(accounts) - NAMED_ACCOUNTS
        parts.append(f"{cause} on {named}" + (f" and {more} more" if more > 0 else ""))
    line = f"every account of the wave failed ({len(outcomes)}): {'; '.join(parts)}"
    codes = [cause for cause in by_cause if cause in GUIDED_CODES]
    return f"{line} ({guide_reference(codes)})" if codes else line


def _not_held(context: dg.OpExecutionContext, requests: list[SyncRequest]) -> list[SyncRequest]:
    """The requests whose account no other run holds now.

    The accounts were chosen when the run was asked for, and a wave may wait in the queue
    behind a backfill's runs while the queue launches some of them. A sync started now would
    be the later one, so the spend writer would refuse the backfill run's writes and fail its
    partitions: the wave leaves that account to the planner's next tick instead.
    """
    held, _ = busy_accounts(context.instance, besides=context.run_id)
    for request in requests:
        if request.ad_account_id in held:
            context.log.warning(f"{request.ad_account_id}: skipped: another run holds it now")
    return [request for request in requests if request.ad_account_id not in held]


def _requests(
    context: dg.OpExecutionContext, config: WaveConfig, rastro: RastroResource
) -> list[SyncRequest]:
    """The wave's syncs, each account once, or `dg.Failure` with one line before anything is
    read or written: kinds only the cadence's sensors may record without their seal, an
    account id or a date that cannot be read, an account listed twice with two different
    syncs, or a range Meta cannot answer (`sync.spend_read.range_refusal`)."""
    syncs = [
        {name: getattr(item, name) for name in SEALED_FIELDS} for item in config.syncs
    ]
    try:
        refusal = seal_refusal(syncs, config.planned_at, config.seal, rastro.clock()())
    except SecretsKeyError as exc:
        refusal = f"this wave's seal cannot be checked: {exc}"
    if refusal is not None:
        raise dg.Failure(description=f"meta_sync_wave refused: {refusal}")
    stale = config.seal and plan_is_stale(config.planned_at, rastro.clock()())
    if stale:
        context.log.warning(
            f"this wave was planned at {config.planned_at}, over "
            f"{int(PLAN_LIFETIME.total_seconds() // 60)} minutes ago: its reads record "
            f"{HAND_KIND.value}, not the cadence's kinds"
        )
    requests: dict[str, SyncRequest] = {}
    for item in config.syncs:
        request = _request(item, context.run_id, HAND_KIND.value if stale else None)
        known = requests.setdefault(request.ad_account_id, request)
        if known != request:
            raise dg.Failure(
                description=f"meta_sync_wave refused: {request.ad_account_id} is listed twice "
                "with different syncs; list each account once"
            )
    with rastro.warehouse().connect(read_only=True) as con:
        linked = {account.ad_account_id: account for account in registry.linked_accounts(con)}
    now = rastro.clock()()
    for request in requests.values():
        account = linked.get(request.ad_account_id)
        if account is None:
            continue  # the sync skips it, saying it is not linked
        refusal = range_refusal(request, local_date(now, account.timezone), account.timezone)
        if refusal is not None:
            raise dg.Failure(description=f"meta_sync_wave refused: {refusal}")
    return list(requests.values())


def _request(item: WaveSync, run_id: str, kind: str | None = None) -> SyncRequest:
    try:
        account = normalize_account_id(item.ad_account_id)
    except ValueError as exc:
        raise dg.Failure(description=f"meta_sync_wave refused: {exc}") from None
    try:
        since, until = date.fromisoformat(item.since), date.fromisoformat(item.until)
    except ValueError:
        shown = f"{item.since!r}..{item.until!r}"[:60]
        raise dg.Failure(
            description=f"meta_sync_wave refused: {account}: dates {shown} are not YYYY-MM-DD"
        ) from None
    return SyncRequest(
        account, since, until, kind=kind or item.kind, run_id=run_id, catalog=item.catalog
    )


@dataclass
class _WaveTally:
    """What a wave's outcomes added up to, for its log line, metadata and checks."""

    synced: int = 0
    failed: int = 0
    recorded: int = 0
    """Materializations logged."""
    rows_written: int = 0
    rows_deleted: int = 0
    checked: list[tuple[str, date]] = field(default_factory=list)
    """The account-days recorded, whose site sums are checked."""


def _record_outcomes(
    context: dg.OpExecutionContext, outcomes: Sequence[SyncOutcome], shard_of: Mapping[str, int]
) -> _WaveTally:
    """Log each outcome's materializations, and a warning for each failure: accounts that
    synced fine are summed up in one line and the run's metadata, since each log line is an
    event the instance stores, one write each."""
    tally = _WaveTally()
    already_recorded = materialized_partitions(
        context.instance,
        [
            spend_partition_key(outcome.request.ad_account_id, day)
            for outcome in outcomes
            if outcome.request.kind == "live"
            for day in empty_days(outcome)
        ],
        shard_of,
    )
    recorded: list[dg.AssetMaterialization] = []
    for outcome in outcomes:
        account = outcome.request.ad_account_id
        days = days_worth_recording(outcome, already_recorded)
        tally.checked += [(account, day) for day in days]
        recorded += materializations(outcome, days, shard_of.get(account, 0))
        recorded += catalog_materializations(outcome)
        if outcome.catalog_error:
            context.log.warning(f"{account}: {outcome.catalog_error}")
        if outcome.ok:
            tally.synced += 1
            tally.rows_written += outcome.rows_written
            tally.rows_deleted += outcome.rows_deleted
        else:
            tally.failed += 1
            context.log.warning(f"{account}: {outcome.error}")
    log_materialization_batches(context, recorded)
    tally.recorded = len(recorded)
    return tally


def _report(
    context: dg.OpExecutionContext, tally: _WaveTally, *, accounts: int, skipped: int
) -> None:
    context.log.info(
        f"{tally.synced} of {accounts} accounts synced: {tally.rows_written} rows "
        f"written, {tally.rows_deleted} deleted; {tally.failed} failed, {skipped} skipped"
    )
    context.add_output_metadata(
        {
            "accounts": accounts,
            "synced": tally.synced,
            "failed": tally.failed,
            "skipped": skipped,
            "rows_written": tally.rows_written,
            "rows_deleted": tally.rows_deleted,
            "materializations": tally.recorded,
        }
    )


def build_sync_wave_job() -> dg.JobDefinition:
    """`meta_sync_wave`, the job of the wave runs `meta_cadence` starts."""

    @dg.job(
        name=WAVE_JOB,
        description="Live, daily and weekly syncs of every account due at one sensor tick.",
        tags={WAVE_TAG: "true", MAX_RUNTIME_TAG: str(WAVE_MAX_RUNTIME_SECONDS)},
    )
    def sync_wave_job():
        sync_wave()

    return sync_wave_job

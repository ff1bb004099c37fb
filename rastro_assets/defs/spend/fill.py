"""`spend_backfill`: an account's owed days (its backfill or a gap fill), many accounts a run.

A partition backfill of the spend pair cuts the account x date grid into runs of
one account or one date, and every run costs seconds of Dagster before any work
(`bench/README.md`). This asset is partitioned by account alone, so a backfill of
it runs many accounts per run. A run reads its accounts side by side, a 30-day
block each at a time, newest block first, and records every spend account-day as
its block is committed: the spend grid fills while the run goes, and whatever the
run does not finish stays owed and is read by the next run, never twice.

An account's partition is materialized once the planner owes it no fill: it then
holds every day of its backfill or gap fill. An account that is throttled, paused
or fails waits out its own back-off: the run goes on with the others and fails at
its end naming each such account and why, so the backfill shows that account's
partition failed and the rest materialized.
"""


import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.account_health import freshness_evaluation
from rastro_assets.defs.ended_runs import close_syncs_of_ended_runs
from rastro_assets.defs.keys import (
    FILL_ACCOUNTS_PER_RUN,
    FILL_NAME,
    OWNERS,
    fill_key,
)
from rastro_assets.defs.metadata import (
    WAREHOUSE_KIND,
    catalog_materializations,
    materializations,
    record_table_events,
    table_materializations,
)
from rastro_assets.defs.partitions import not_linked, reachable_fill, shard_account_partitions
from rastro_assets.defs.publishing import publish_after_writes
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.spend.assets import GROUP
from rastro_assets.defs.sum_check import evaluate_sum_checks
from rastro_assets.outcomes import FILL_KINDS, with_guide
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.sync.syncer import Syncer
from rastro_assets.sync.types import SyncOutcome, SyncRequest

"""Accounts a run of a fill backfill reads: enough that Dagster's cost per run is small
beside the work, few enough that a shard's accounts spread over runs going side by side."""
FILL_CONCURRENCY = 16
"""Accounts a run reads at once: a read mostly waits on Meta, the CPU is the writer's."""
MAX_ROUNDS = 12
"""Blocks a run reads of one account at most: three for a new account's 90 days; more
only when days left incomplete split them."""


def build_spend_fill(index: int, shard_count: int) -> dg.AssetsDefinition:
    """The fill asset of one shard, over the shard's account partitions."""
    group = shards.named(GROUP, index)

    spec = dg.AssetSpec(
        fill_key(index),
        group_name=group,
        kinds={"meta", WAREHOUSE_KIND},
        owners=OWNERS,
        metadata={"rastro/shard": index} if shard_count > 1 else None,
        # A run records an account only once it owes nothing: an account left owing
        # records nothing, and fails the run at its end.
        skippable=True,
        description=(
            "An account's backfill (the 90 days up to its link) or gap fill (the days after a "
            "long pause): materialized once every owed day is read. `meta_accounts` starts "
            "one partition backfill of it for the accounts owing days, a run reading up to "
            f"{FILL_ACCOUNTS_PER_RUN} accounts side by side in 30-day blocks, newest first; "
            "each block's account-days show in the spend assets' grid as it is written. A "
            "failed partition names why in its run's failure (a throttle, a dead token): the "
            "account waits out its back-off and is started again. Materializing an account "
            "by hand reads what it still owes, and nothing when it owes nothing."
        ),
    )

    @dg.multi_asset(
        name=shards.named(FILL_NAME, index),
        specs=[spec],
        partitions_def=shard_account_partitions(index),
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=FILL_ACCOUNTS_PER_RUN),
        pool="meta_api",
    )
    def spend_backfill(context: dg.AssetExecutionContext, rastro: RastroResource):
        yield from fill_accounts(
            context, rastro, list(context.partition_keys), index, shard_count
        )

    return spend_backfill


def shard_defs(shard: int, shard_count: int) -> dg.Definitions:
    return dg.Definitions(assets=[build_spend_fill(shard, shard_count)])


@dataclass
class _Progress:
    """What a fill run has done so far, per account."""

    done: set[str] = field(default_factory=set)
    """Accounts owed nothing more."""
    refused: dict[str, str] = field(default_factory=dict)
    """Accounts left owing, with why: a failure, a back-off, not linked."""
    unlinked: set[str] = field(default_factory=set)
    """Of `refused`, the accounts no site links: no back-off ends their refusal."""
    read_days: dict[str, int] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)
    outcomes: list[SyncOutcome] = field(default_factory=list)

    def pending(self, accounts: Sequence[str]) -> list[str]:
        return [a for a in accounts if a not in self.done and a not in self.refused]


def fill_accounts(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    accounts: list[str],
    shard: int,
    shard_count: int,
) -> Iterator[dg.AssetMaterialization]:
    """Read each account's owed blocks, newest first, round after round, as events come."""
    syncer = rastro.syncer()
    synced_at = rastro.run_started_at(context)
    # A run retried after its worker was killed takes its accounts back from the dead one.
    close_syncs_of_ended_runs(context.instance, rastro.warehouse(), rastro.clock()(), accounts)
    progress = _Progress()
    checked: list[tuple[str, date]] = []
    shard_of: dict[str, int] = {}
    for _ in range(MAX_ROUNDS):
        requests, finished = _next_blocks(context, rastro, accounts, progress, shard_of)
        yield from finished
        if not requests:
            break
        context.log.info(
            f"reading {len(requests)} accounts: "
            + ", ".join(f"{r.ad_account_id} {r.since}..{r.until}" for r in requests[:10])
            + (f" and {len(requests) - 10} more" if len(requests) > 10 else "")
        )
        for what, value in _sync_round(syncer, requests, synced_at, rastro.clock()()):
            if what == "refused":
                request, reason = value
                progress.refused[request.ad_account_id] = reason
                continue
            account = value.request.ad_account_id
            if what == "written":
                days = list(value.complete_days)
                checked += [(account, day) for day in days]
                yield from materializations(value, days, shard_of.get(account, shard))
                continue
            progress.outcomes.append(value)
            yield from catalog_materializations(value)
            if value.catalog_error:
                context.log.warning(f"{account}: {value.catalog_error}")
            if not value.ok:
                progress.refused[account] = value.error or value.outcome
                context.log.warning(f"{account}: {value.error}")
    else:
        _, finished = _next_blocks(context, rastro, accounts, progress, shard_of, read=False)
        yield from finished
    _finish(context, rastro, shard, shard_count, progress, checked, shard_of)


def _next_blocks(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    accounts: list[str],
    progress: _Progress,
    shard_of: dict[str, int],
    *,
    read: bool = True,
) -> tuple[list[SyncRequest], list[dg.AssetMaterialization]]:
    """Each pending account's newest unread block, and the fill materialization of each
    account now owed nothing."""
    now = rastro.clock()()
    pending = progress.pending(accounts)
    with rastro.warehouse().connect(read_only=True) as con:
        found = {p.state.ad_account_id: p for p in planned_accounts(con, pending)}
    requests, finished = [], []
    for account in pending:
        planned = found.get(account)
        if planned is None:
            progress.refused[account] = not_linked(account)
            progress.unlinked.add(account)
            continue
        shard_of[account] = planned.shard
        block = _newest_unread_block(planned, now)
        if isinstance(block, str):
            progress.refused[account] = block
        elif block is None:
            progress.done.add(account)
            finished.append(_fill_materialization(context, account, progress))
        elif read:
            since, until, kind = block
            progress.blocks[account] = progress.blocks.get(account, 0) + 1
            progress.read_days[account] = (
                progress.read_days.get(account, 0) + (until - since).days + 1
            )
            requests.append(SyncRequest(account, since, until, kind=kind, run_id=context.run_id))
        else:
            progress.refused[account] = (
                f"still owes {block[0]}..{block[1]} after {MAX_ROUNDS} blocks in this run"
            )
    return requests, finished


def _newest_unread_block(planned: PlannedAccount, now: datetime):
    """(since, until, kind) of the account's newest unread owed block; None when it owes
    no fill (or only days no read may reach); why, when the block is not due yet."""
    state = planned.state
    plan = cadence.plan(state, now)
    if plan.kind == "paused":
        return plan.reason
    if plan.kind not in FILL_KINDS:
        return None
    fill = reachable_fill(plan, state, now)
    blocks = cadence.unread_blocks(state.runs, fill.since, fill.until) if fill else []
    if not blocks:
        return None
    if not plan.is_due(now):
        return f"waits until {plan.due_at:%Y-%m-%d %H:%M} UTC: {plan.reason}"
    since, until = blocks[0]
    return since, until, plan.kind


def _sync_round(
    syncer: Syncer, requests: list[SyncRequest], synced_at: datetime, started_at: datetime
) -> Iterator[tuple[str, object]]:
    """("written", outcome) as each block is committed, ("refused", (request, why)) for a
    request the sync refused, then ("ended", outcome) for each once its catalog is read.

    The round runs on a thread of its own so that this generator, on the run's thread,
    hands Dagster each block's events while the others still read: Dagster stores the
    events an asset logs only when it yields.
    """
    events: queue.Queue = queue.Queue()
    end = ("end", None)
    failure: list[BaseException] = []

    def sync() -> None:
        try:
            wave = syncer.sync_wave(
                requests,
                synced_at=synced_at,
                started_at=started_at,
                concurrency=FILL_CONCURRENCY,
                on_written=lambda outcome: events.put(("written", outcome)),
            )
            for refused in wave.refused:
                events.put(("refused", refused))
            for outcome in wave.outcomes:
                events.put(("ended", outcome))
        except BaseException as exc:  # noqa: BLE001 - raised again on the run's thread
            failure.append(exc)
        finally:
            events.put(end)

    worker = threading.Thread(target=sync, name="fill-round", daemon=True)
    worker.start()
    while (item := events.get()) is not end:
        yield item
    worker.join()
    if failure:
        raise failure[0]


def _fill_materialization(
    context: dg.AssetExecutionContext, account: str, progress: _Progress
) -> dg.AssetMaterialization:
    blocks, days = progress.blocks.get(account, 0), progress.read_days.get(account, 0)
    return dg.AssetMaterialization(
        asset_key=context.asset_key,
        partition=account,
        metadata={
            "blocks_read": blocks,
            "days_read": days,
            "holds": "every owed day"
            + ("" if blocks else " (nothing was owed when this run reached it)"),
        },
    )


def _finish(
    context: dg.AssetExecutionContext,
    rastro: RastroResource,
    shard: int,
    shard_count: int,
    progress: _Progress,
    checked: list[tuple[str, date]],
    shard_of: dict[str, int],
) -> None:
    """The tables' figures, the sum checks of the days written, the snapshot, and the
    run's failure when an account is left owing.

    Each is logged as it comes, so Dagster has stored them all before a failure ends the
    run. The figures go first: they are the spend pair's latest materialization, which the
    checks' evaluations must not be older than ("not evaluated" in the UI otherwise). The
    spend pair is no target of the fill's backfill, so they are the run's own events.
    """
    if progress.outcomes:
        record_table_events(
            context, table_materializations(rastro, shard, shard_count, progress.outcomes)
        )
    if checked:
        evaluate_sum_checks(context, rastro, checked, shard_of)
    if progress.outcomes:
        # In the run that recorded the days, so the check's latest evaluation is its
        # asset's latest materialization's, as when the spend pair's own runs ran it.
        with rastro.warehouse().connect(read_only=True) as con:
            members = [a for a in planned_accounts(con) if a.shard == shard]
        context.log_event(freshness_evaluation(members, rastro.clock()(), shard))
    publish_after_writes(context, rastro)
    context.log.info(
        f"{len(progress.done)} accounts hold every owed day; {len(progress.refused)} left owing"
    )
    if progress.refused:
        owing = sorted(set(progress.refused) - progress.unlinked)
        parts = [progress.refused[account] for account in sorted(progress.unlinked)]
        if owing:
            parts.insert(
                0,
                f"{len(owing)} of this run's accounts still owe days; the others are "
                "recorded. Each waits out its own back-off and is started again:\n"
                + "\n".join(
                    f"{account}: {with_guide(progress.refused[account])}" for account in owing
                ),
            )
        raise dg.Failure(
            description="\n".join(parts),
            metadata={
                "accounts_left_owing": len(owing),
                "accounts_not_linked": len(progress.unlinked),
                "accounts_done": len(progress.done),
            },
        )

"""What the sensors ask of Dagster for owed backfills and gap fills: each shard's account
partitions, a partition backfill of the shard's `spend_backfill` over the accounts owing
days, and, when many accounts owe their newest days at once, first-data runs for those."""

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.cadence.wave import (
    WAVE_JOB,
    WAVE_MAX_RUNTIME_SECONDS,
    sealed_wave_config,
)
from rastro_assets.defs.dagster_private import AssetGraphSubset
from rastro_assets.defs.keys import (
    FILL_ACCOUNTS_PER_RUN,
    FILL_ACCOUNTS_TAG,
    FIRST_DATA_TAG,
    MAX_RUNTIME_TAG,
    PARTITION_RUN_MAX_RUNTIME_SECONDS,
    SYNC_KIND_TAG,
    fill_key,
)
from rastro_assets.defs.partitions import Fill, reachable_fill, shard_account_partitions
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount
from rastro_assets.planner.state import SyncRun

BACKFILL_KINDS = ("backfill", "gap")


def startable_fill(
    account: PlannedAccount, plan: cadence.Plan, busy: Collection[str], now: datetime,
    shard_count: int,
) -> Fill | str | None:
    """The fill a sensor may start for `account` now (`plan` is its plan at `now`); why not,
    when one is owed but cannot start; None when none is owed.

    Both sensors ask this, so `first_data` splits the same fills in each."""
    account_id = account.state.ad_account_id
    if account.shard >= shard_count:
        # Never moved silently: the operator lowered the count below this shard.
        return (
            f"{account_id}: its shard {account.shard} is not among the"
            f" {shard_count} of {shards.SHARDS_SETTING}; raise it again"
        )
    if plan.kind not in BACKFILL_KINDS:
        return None
    if account_id in busy:
        return f"{account_id}: a run or backfill is in flight"
    if not plan.is_due(now):
        return f"{account_id}: {plan.reason}"
    fill = reachable_fill(plan, account.state, now)
    if fill is None:
        return (
            f"{account_id}: every owed day from {plan.since} is before the "
            "account's reach (the date axis or Meta's 37 months); nothing to read"
        )
    return fill


FIRST_DATA_ACCOUNTS_PER_RUN = 100
"""Accounts a first-data run reads: their newest block each, side by side."""


@dataclass(frozen=True)
class FirstData:
    """An account's newest owed block, read before any account's older ones."""

    fill: Fill
    since: date
    until: date


def first_data(fills: Sequence[Fill], runs_of: Mapping[str, Sequence[SyncRun]]) -> list[FirstData]:
    """The fills whose newest block (the one reaching today) is unread, when more are owed
    together than one fill run reads (`FILL_ACCOUNTS_PER_RUN`); otherwise none.

    A fill run reads its own accounts' newest blocks first, but a backfill's runs go a few
    at a time: with hundreds of accounts linked together, the last run's accounts would
    wait for every other account's 90 days. Their newest blocks are read first instead,
    by `meta_cadence` in runs of their own, and `meta_accounts` then starts the older
    blocks as the fill backfill. Both sensors decide with this one rule.
    """
    newest = []
    for fill in fills:
        blocks = cadence.unread_blocks(runs_of.get(fill.ad_account_id, ()), fill.since, fill.until)
        if blocks and blocks[0][1] == fill.until:
            newest.append(FirstData(fill, *blocks[0]))
    return newest if len(newest) > FILL_ACCOUNTS_PER_RUN else []


def first_data_requests(reads: Sequence[FirstData], now: datetime) -> list[dg.RunRequest]:
    """`meta_sync_wave` runs of `FIRST_DATA_ACCOUNTS_PER_RUN` newest blocks each, tagged
    `FIRST_DATA_TAG`: the run queue starts them before the fill backfills queued after."""
    requests = []
    for start in range(0, len(reads), FIRST_DATA_ACCOUNTS_PER_RUN):
        chunk = reads[start : start + FIRST_DATA_ACCOUNTS_PER_RUN]
        requests.append(
            dg.RunRequest(
                run_key=f"first-data:{now.isoformat()}:{start}",
                job_name=WAVE_JOB,
                run_config={
                    "ops": {
                        "sync_wave": {
                            "config": sealed_wave_config(
                                [
                                    {
                                        "ad_account_id": read.fill.ad_account_id,
                                        "kind": read.fill.kind,
                                        "since": read.since.isoformat(),
                                        "until": read.until.isoformat(),
                                        "catalog": False,
                                    }
                                    for read in chunk
                                ],
                                now,
                            )
                        }
                    }
                },
                tags={
                    FIRST_DATA_TAG: str(len(chunk)),
                    SYNC_KIND_TAG: "+".join(sorted({read.fill.kind for read in chunk})),
                    MAX_RUNTIME_TAG: str(WAVE_MAX_RUNTIME_SECONDS),
                },
            )
        )
    return requests


def fill_request(fills: Sequence[Fill], shard: int) -> dg.RunRequest:
    """One partition backfill of the shard's `spend_backfill` over the fills' accounts.

    Dagster cuts it into runs of `FILL_ACCOUNTS_PER_RUN` accounts (the asset's backfill
    policy), each reading its accounts' owed blocks side by side. No `meta_account` tag:
    the queue's limit of one run per value would hold the backfill's runs to one at a
    time, and each run's accounts are its own (the backfill stays requested, so the
    sensors start nothing else for them, and the leases fence off anything else).
    """
    key = fill_key(shard)
    accounts = sorted(fill.ad_account_id for fill in fills)
    subset = shard_account_partitions(shard).empty_subset().with_partition_keys(accounts)
    group = accounts[0] if len(accounts) == 1 else f"{accounts[0]} and {len(accounts) - 1} more"
    return dg.RunRequest.for_asset_graph_subset(
        AssetGraphSubset(partitions_subsets_by_asset_key={key: subset}),
        tags={
            FILL_ACCOUNTS_TAG: group,
            SYNC_KIND_TAG: "+".join(sorted({fill.kind for fill in fills})),
            MAX_RUNTIME_TAG: str(PARTITION_RUN_MAX_RUNTIME_SECONDS),
        },
    )


def _partition_changes(
    existing: Iterable[str], linked: Iterable[str], name: str
) -> list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest]:
    existing, linked = set(existing), set(linked)
    changes: list = []
    if linked - existing:
        changes.append(dg.AddDynamicPartitionsRequest(name, sorted(linked - existing)))
    if existing - linked:
        changes.append(dg.DeleteDynamicPartitionsRequest(name, sorted(existing - linked)))
    return changes


NAMED_ACCOUNTS_MAX = 10
"""Accounts a tick's note names before it counts the rest."""


def partition_change_notes(
    changes: Sequence[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest],
    accounts: Sequence[PlannedAccount],
) -> list[str]:
    """What `changes` do to the account partitions, in words for the sensor's tick.

    A tick that only changes partitions is otherwise "Sensor function returned an empty
    result" in the UI: someone who added a partition by hand would see it vanish with no
    reason. Accounts are counted once, however many shards' sets they enter or leave.
    """
    linked = {account.state.ad_account_id for account in accounts}
    added = _accounts_in(changes, dg.AddDynamicPartitionsRequest)
    removed = _accounts_in(changes, dg.DeleteDynamicPartitionsRequest)
    unlinked = sorted(removed - linked)
    moved = sorted(removed & added)
    notes = []
    if unlinked:
        what = (
            "1 partition of an account" if len(unlinked) == 1
            else f"{len(unlinked)} partitions of accounts"
        )
        notes.append(
            f"removed {what} not linked to any site: {_named(unlinked)} "
            "(partitions follow the links: add accounts with `rastro link`)"
        )
    if new := sorted(added - removed):
        notes.append(f"added partitions of {_count(new, 'linked account')}: {_named(new)}")
    if moved:
        notes.append(
            f"moved partitions of {_count(moved, 'account')} between shards: {_named(moved)}"
        )
    if unplaced := sorted((removed & linked) - added):
        notes.append(
            f"removed partitions of {_count(unplaced, 'account')} of shards not configured: "
            + _named(unplaced)
        )
    return notes


def _accounts_in(changes: Iterable, kind: type) -> set[str]:
    return {key for change in changes if isinstance(change, kind) for key in change.partition_keys}


def _count(accounts: Sequence[str], noun: str) -> str:
    return f"{len(accounts)} {noun}" + ("" if len(accounts) == 1 else "s")


def _named(accounts: Sequence[str]) -> str:
    named = ", ".join(accounts[:NAMED_ACCOUNTS_MAX])
    rest = len(accounts) - NAMED_ACCOUNTS_MAX
    return named + (f" and {rest} more" if rest > 0 else "")


def shard_partition_changes(
    instance: dg.DagsterInstance, accounts: Sequence[PlannedAccount], shard_count: int
) -> list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest]:
    """Each shard's account partitions equal to its linked accounts, and, with several
    shards, the catalog's set equal to every linked account of a configured shard.

    Every removal comes before any addition (Dagster applies them in order): an account
    that changed shards leaves the old one before it joins the new, so it is never in two
    shards' partitions, whichever shard's number is lower."""
    placed = [account for account in accounts if account.shard < shard_count]
    changes: list = []
    for shard in range(shard_count):
        name = shards.accounts_name(shard)
        changes += _partition_changes(
            instance.get_dynamic_partitions(name),
            [account.state.ad_account_id for account in placed if account.shard == shard],
            name,
        )
    if shard_count > 1:
        name = shards.all_accounts_name(shard_count)
        changes += _partition_changes(
            instance.get_dynamic_partitions(name),
            [account.state.ad_account_id for account in placed],
            name,
        )
    return sorted(changes, key=lambda change: isinstance(change, dg.AddDynamicPartitionsRequest))

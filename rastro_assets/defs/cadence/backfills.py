"""What `meta_accounts` asks of Dagster: each shard's account partitions, and the owed
backfills and gap fills as partition backfills of the account's own spend pair."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.dagster_private import AssetGraphSubset
from rastro_assets.defs.keys import (
    ACCOUNT_TAG,
    MAX_RUNTIME_TAG,
    PARTITION_RUN_MAX_RUNTIME_SECONDS,
    SYNC_KIND_TAG,
)
from rastro_assets.defs.partitions import (
    ACCOUNT_PARTITIONS_NAME,
    all_accounts_partitions_name,
    reach_start,
    spend_partition_key,
)
from rastro_assets.defs.spend.assets import spend_shard
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount
from rastro_assets.planner.state import AccountState
from rastro_assets.timekeeping import days_between, local_date

BACKFILL_KINDS = ("backfill", "gap")


@dataclass(frozen=True)
class Fill:
    """The days of an account's backfill or gap fill that can be read and be partitions."""

    ad_account_id: str
    kind: str
    since: date
    until: date


def reachable_fill(plan: cadence.Plan, state: AccountState, now: datetime) -> Fill | None:
    """The plan's owed days from the account's reach on, or None when none are owed there.

    Days before `reach_start` (the date axis, or Meta's 37 months) are left
    out: a backfill targeting a day that is no partition fails, and Meta
    refuses a range starting beyond its 37 months. When the plan starts
    before the reach, the first day still unread from the reach on starts
    the fill, so days already read are not read again.
    """
    first = reach_start(local_date(now, state.timezone))
    since = plan.since
    if since < first:
        since = cadence.first_unread_day(state.runs, first, plan.until)
        if since is None:
            return None
    return Fill(plan.ad_account_id, plan.kind, since, plan.until)


def shared_backfills(fills: Sequence[Fill]) -> list[list[Fill]]:
    """Fills grouped into shared backfills: one kind each, fewer accounts than days.

    Dagster cuts a backfill of a multi-partition subset into ranges along the
    dimension with fewer distinct keys. With fewer accounts than days, each
    range is one account's days, so the 30-day runs never mix accounts.
    """
    groups: list[list[Fill]] = []
    for kind in BACKFILL_KINDS:
        group: list[Fill] = []
        days: set[date] = set()
        for fill in sorted((f for f in fills if f.kind == kind), key=lambda f: f.since):
            own_days = set(days_between(fill.since, fill.until))
            if group and len(group) + 1 >= len(days | own_days):
                groups.append(group)
                group, days = [], set()
            group.append(fill)
            days |= own_days
        if group:
            groups.append(group)
    return groups


def backfill_request(
    fills: Sequence[Fill], shard_of: Mapping[str, int] | None = None
) -> dg.RunRequest:
    """One partition backfill over the fills' days, each account's in its own shard's pair
    (`shard_of`; shard 0 for an account it does not name).

    Dagster cuts the runs per spend pair (each shard's pair has partitions of its own),
    so one backfill may span shards; `meta_accounts` asks one per shard all the same, which
    its daemon iterates faster (bench/README.md).

    Every run of a backfill carries the backfill's tags; the run queue
    (`run_queue.AccountRunCoordinator`) then sets each range run's `meta_account`
    tag to the one account its range covers, so its limit of one run at a time
    (`dagster.yaml`) keeps an account's 30-day runs from running together, where
    the spend writer would refuse the older run's writes (`RUN_TIMEOUT: ... holds
    the account`), while the group's other accounts run beside it.
    """
    shard_of = shard_of or {}
    keys_by_shard: dict[int, list[dg.MultiPartitionKey]] = {}
    for fill in fills:
        keys_by_shard.setdefault(shard_of.get(fill.ad_account_id, 0), []).extend(
            spend_partition_key(fill.ad_account_id, day)
            for day in days_between(fill.since, fill.until)
        )
    subsets = {}
    for shard, keys in sorted(keys_by_shard.items()):
        spend = spend_shard(shard)
        subset = spend.partitions.empty_subset().with_partition_keys(keys)
        subsets[spend.ad_key] = subsets[spend.site_key] = subset
    accounts = sorted(fill.ad_account_id for fill in fills)
    group = accounts[0] if len(accounts) == 1 else f"{accounts[0]} and {len(accounts) - 1} more"
    return dg.RunRequest.for_asset_graph_subset(
        AssetGraphSubset(partitions_subsets_by_asset_key=subsets),
        tags={
            ACCOUNT_TAG: group,
            SYNC_KIND_TAG: fills[0].kind,
            MAX_RUNTIME_TAG: str(PARTITION_RUN_MAX_RUNTIME_SECONDS),
        },
    )


def _partition_changes(
    existing: Iterable[str], linked: Iterable[str], name: str = ACCOUNT_PARTITIONS_NAME
) -> list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest]:
    existing, linked = set(existing), set(linked)
    changes: list = []
    if linked - existing:
        changes.append(dg.AddDynamicPartitionsRequest(name, sorted(linked - existing)))
    if existing - linked:
        changes.append(dg.DeleteDynamicPartitionsRequest(name, sorted(existing - linked)))
    return changes


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
        name = all_accounts_partitions_name(shard_count)
        changes += _partition_changes(
            instance.get_dynamic_partitions(name),
            [account.state.ad_account_id for account in placed],
            name,
        )
    return sorted(changes, key=lambda change: isinstance(change, dg.AddDynamicPartitionsRequest))

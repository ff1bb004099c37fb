"""Shards (leaf layer): the account axis's shards, names and sizes, for Dagster and the CLI.

Dagster's cost of a partitioned asset follows the materialized keys of that one
asset (its status cache is read, rebuilt after every link and rewritten after every
materialization), so the spend pair exists once per shard and each shard holds about
`RASTRO_SHARD_ACCOUNTS` accounts (100 unless set). Shard 0 keeps
the names an install with one shard has always had; shard k >= 1 appends `_shard_k`
to every name, so a glob such as `ad_spend_daily*` selects every shard and no key
needs a path prefix. Every shard-dependent name is built here (`named`), so a name and the
test of it (`of_any_shard`) cannot drift apart. Which shard an account is in is the
warehouse's to say (`warehouse/shard_store.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

from rastro_assets.settings import RASTRO_ACCOUNT_SHARDS, RASTRO_SHARD_ACCOUNTS

SHARDS_SETTING = RASTRO_ACCOUNT_SHARDS.name
SHARD_SIZE_SETTING = RASTRO_SHARD_ACCOUNTS.name
MOVE_COMMAND = "rastro shard move"
AD_SPEND = "ad_spend_daily"
SITE_SPEND = "site_spend_daily"
ACCOUNTS = "meta_ad_account"
_MARK = "_shard_"


def suffix(shard: int) -> str:
    return "" if shard == 0 else f"{_MARK}{shard}"


def named(base: str, shard: int) -> str:
    """`base` as shard `shard` names it: an asset, op, job, group or partitions set."""
    return base + suffix(shard)


def of_any_shard(name: str, base: str) -> bool:
    """Whether `name` is `base` as some shard names it."""
    return name == base or name.startswith(base + _MARK)


def ad_spend_name(shard: int) -> str:
    return named(AD_SPEND, shard)


def site_spend_name(shard: int) -> str:
    return named(SITE_SPEND, shard)


def accounts_name(shard: int) -> str:
    """The dynamic partitions holding the shard's accounts (shard 0's is `meta_ad_account`,
    the name the UI, the docs and every existing instance know)."""
    return named(ACCOUNTS, shard)


def all_accounts_name(shard_count: int) -> str:
    """The dynamic partitions holding every linked account, which the catalog is
    partitioned by. With one shard that is the shard's own set; with several, a set of its
    own, so no shard's status cache is rebuilt by another shard's link."""
    return accounts_name(0) if shard_count == 1 else f"{ACCOUNTS}_all"


def least_filled(counts: Mapping[int, int], shards: int) -> int:
    """The shard holding fewest accounts, the lowest on a tie."""
    return min(range(shards), key=lambda shard: (counts.get(shard, 0), shard))


def shard_for_new_account(counts: Mapping[int, int], shards: int, size: int) -> int:
    """The shard a newly linked account goes to: the lowest holding fewer than `size`.

    Shards fill in turn, so accounts linked together share a shard: Dagster pays per shard
    touched (a link rebuilds that shard's status cache; each shard's backfill costs the
    backfill daemon time every iteration, bench/README.md).
    Once every shard holds `size`, they grow by a tenth of `size` in turn, which keeps
    them even until the operator adds shards.
    """
    step = max(size // 10, 1)
    fewest = min(counts.get(shard, 0) for shard in range(shards))
    level = size if fewest < size else (fewest // step + 1) * step
    return next(shard for shard in range(shards) if counts.get(shard, 0) < level)


def crowded(counts: Mapping[int, int], size: int) -> dict[int, int]:
    """The shards holding more accounts than `size`, what their pages serve fast."""
    return {shard: n for shard, n in sorted(counts.items()) if n > size}


def crowded_warning(counts: Mapping[int, int], shards: int, size: int) -> str | None:
    """What to tell the operator when a shard is crowded, naming the setting and the command."""
    full = crowded(counts, size)
    if not full:
        return None
    which = ", ".join(f"{ad_spend_name(shard)} holds {n}" for shard, n in full.items())
    total = sum(counts.values())
    wanted = -(-total // size)
    if wanted > shards:
        advice = (
            f"set {SHARDS_SETTING}={wanted} (now {shards}), restart the code location,"
            f" then run `{MOVE_COMMAND}`"
        )
    else:
        advice = f"{SHARDS_SETTING} is {shards}: run `{MOVE_COMMAND}` to spread them"
    return (
        f"{which} accounts, more than the {size} ({SHARD_SIZE_SETTING}) a shard's Dagster"
        f" pages serve fast; {advice}"
    )


def planned_moves(shard_of: Mapping[str, int], shard_count: int) -> dict[str, int]:
    """Which accounts move, and where, so every shard holds at most its even share.

    An account outside the configured shards always moves; otherwise only accounts
    above their shard's share do (the newest ids of that shard), each to the
    least-filled shard, so a second run moves nothing.
    """
    share = -(-len(shard_of) // shard_count) if shard_of else 0
    counts = {shard: 0 for shard in range(shard_count)}
    stay: dict[str, int] = {}
    leaving: list[str] = []
    for account in sorted(shard_of):
        shard = shard_of[account]
        if shard < shard_count and counts[shard] < share:
            counts[shard] += 1
            stay[account] = shard
        else:
            leaving.append(account)
    moves = {}
    for account in leaving:
        target = least_filled(counts, shard_count)
        counts[target] += 1
        if target != shard_of[account]:
            moves[account] = target
    return moves

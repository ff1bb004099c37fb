"""Each account's shard in the warehouse: chosen at its first link, stored, and read back.

An account linked before shards existed has no `ad_account_shards` row and is in shard 0,
the pair every install had. A query that read the column alone would put such an account
in no shard, so every query joins `SHARD_JOIN` and reads `SHARD`, and the rule lives here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import duckdb

from rastro_assets.settings import DEFAULT_SHARD_ACCOUNTS
from rastro_assets.shards import shard_for_new_account
from rastro_assets.warehouse.connection import transaction

SHARD_JOIN = "LEFT JOIN ad_account_shards s USING (ad_account_id)"
"""Joined to a query whose rows carry `ad_account_id`, so it may read `SHARD`."""
SHARD = "coalesce(s.shard, 0)"
"""The account's shard, in a query that joins `SHARD_JOIN`."""


def shard_counts(con: duckdb.DuckDBPyConnection) -> dict[int, int]:
    """Linked accounts per shard (shards holding none are absent)."""
    rows = con.execute(
        f"SELECT {SHARD} AS shard, count(*) FROM meta_ad_accounts a {SHARD_JOIN}"
        " WHERE a.ad_account_id IN (SELECT ad_account_id FROM site_ad_accounts) GROUP BY 1"
    ).fetchall()
    return {int(shard): int(count) for shard, count in rows}


def account_shards(
    con: duckdb.DuckDBPyConnection, ad_account_ids: Iterable[str] | None = None
) -> dict[str, int]:
    """The stored shard of each account (of those named, or of every account)."""
    query = f"SELECT a.ad_account_id, {SHARD} FROM meta_ad_accounts a {SHARD_JOIN}"
    params: list[object] = []
    if ad_account_ids is not None:
        query += " WHERE a.ad_account_id = ANY(?::VARCHAR[])"
        params.append(sorted(set(ad_account_ids)))
    return {account: int(shard) for account, shard in con.execute(query, params).fetchall()}


def shard_of(accounts: Iterable) -> dict[str, int]:
    """Each account's shard, by id, of accounts already read with theirs (`.ad_account_id`
    and `.shard`, as `LinkedAccount` and `PlannedAccount` carry them)."""
    return {account.ad_account_id: account.shard for account in accounts}


class Placement:
    """Where the accounts one link transaction names go: a linked account keeps its shard;
    each new one goes where `shard_for_new_account` says, counting those placed before it
    in the same transaction."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        ad_account_ids: Iterable[str],
        shards: int = 1,
        shard_size: int = DEFAULT_SHARD_ACCOUNTS,
    ) -> None:
        self._counts = shard_counts(con)
        self._known = account_shards(con, ad_account_ids)
        self._shards = max(shards, 1)
        self._size = shard_size

    def kept(self, ad_account_id: str) -> int:
        return self._known.get(ad_account_id, 0)

    def new(self) -> int:
        shard = shard_for_new_account(self._counts, self._shards, self._size)
        self._counts[shard] = self._counts.get(shard, 0) + 1
        return shard


def store_shards(con: duckdb.DuckDBPyConnection, shard_of: Mapping[str, int]) -> None:
    """Store each account's shard, in one statement whatever their number (in the caller's
    transaction)."""
    if not shard_of:
        return
    con.execute(
        "INSERT INTO ad_account_shards (ad_account_id, shard)"
        " SELECT unnest(?::VARCHAR[]), unnest(?::INTEGER[])"
        " ON CONFLICT (ad_account_id) DO UPDATE SET shard = excluded.shard",
        [list(shard_of), list(shard_of.values())],
    )


def set_account_shard(con: duckdb.DuckDBPyConnection, ad_account_id: str, shard: int) -> None:
    """Store the account's new shard (`rastro shard move`, once Dagster holds its partitions)."""
    with transaction(con):
        store_shards(con, {ad_account_id: shard})

"""Links between sites and ad accounts: linking (one account or a batch), unlinking, and
the most links one Meta connection may hold.

An account is created on its first link and goes with its last: `unlink_account` purges
everything synced for it. Every function takes an open connection. Each mutating one runs in
its own transaction, or joins the caller's when one is already open on `con`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import duckdb

from rastro_assets.account_ids import normalize_account_id
from rastro_assets.settings import DEFAULT_SHARD_ACCOUNTS
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.names import normalize_currency, validate_timezone
from rastro_assets.warehouse.registry import (
    Connection,
    RegistryError,
    get_connection,
    sites_linking,
    take_registry_turn,
)
from rastro_assets.warehouse.shard_store import Placement, store_shards
from rastro_assets.warehouse.site_spend import rebuild_site_spend
from rastro_assets.warehouse.site_store import site_exists

MAX_LINKS_PER_CONNECTION = 500
"""Site-account links one connection may hold: the reference product's limit, which an
agency's Business Manager reaches before its token's rate limits hurt."""


class LinkResult(StrEnum):
    LINKED = "linked"
    ALREADY_LINKED = "already_linked"


@dataclass(frozen=True)
class Linked:
    """What `link_account` did, and the shard holding the account."""

    result: LinkResult
    shard: int


@dataclass(frozen=True)
class AccountToLink:
    """An account a batch links, with what its days mean (as Meta or the operator says)."""

    ad_account_id: str
    timezone: str
    currency: str
    name: str | None = None


@dataclass(frozen=True)
class LinkRefusal:
    ad_account_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.ad_account_id}: {self.reason}"


@dataclass
class LinkBatch:
    """What `link_accounts` did: accounts newly linked, already linked to the site (no-op),
    refused with why, and the shard of every account linked now or before."""

    linked: list[str] = field(default_factory=list)
    already_linked: list[str] = field(default_factory=list)
    refused: list[LinkRefusal] = field(default_factory=list)
    shards: dict[str, int] = field(default_factory=dict)


def link_account(
    con: duckdb.DuckDBPyConnection,
    site_id: str,
    ad_account_id: str,
    connection_id: str,
    timezone: str,
    currency: str,
    now: datetime,
    name: str | None = None,
    shards: int = 1,
    shard_size: int = DEFAULT_SHARD_ACCOUNTS,
) -> Linked:
    """Link a site to an ad account synced through `connection_id` (`link_accounts` for one);
    RegistryError with the refusal's line when it is refused."""
    ad_account_id = normalize_account_id(ad_account_id)
    account = AccountToLink(
        ad_account_id, validate_timezone(timezone), normalize_currency(currency), name
    )
    batch = link_accounts(
        con, site_id, connection_id, [account], now, shards=shards, shard_size=shard_size
    )
    if batch.refused:
        raise RegistryError(str(batch.refused[0]))
    result = LinkResult.ALREADY_LINKED if batch.already_linked else LinkResult.LINKED
    return Linked(result, batch.shards[ad_account_id])


def link_accounts(
    con: duckdb.DuckDBPyConnection,
    site_id: str,
    connection_id: str,
    accounts: Sequence[AccountToLink],
    now: datetime,
    *,
    shards: int = 1,
    shard_size: int = DEFAULT_SHARD_ACCOUNTS,
    max_links: int = MAX_LINKS_PER_CONNECTION,
) -> LinkBatch:
    """Link a site to each of `accounts`, synced through `connection_id`, in one transaction.

    Each account is created on its first link, in the first of `shards` shards holding fewer
    than `shard_size` accounts (`shard_for_new_account`, counting the accounts this batch
    placed before it); a linked account keeps its shard. Refused, each on its own while the
    others link: an account synced through another connection (until every site has
    unlinked it), one stored with another timezone or currency, a bad timezone or currency,
    and every new link past the connection's `max_links`. Linking an existing link again is
    a no-op. A new link to an account that already has spend gets its `site_spend_daily`
    rows in the same transaction. An unknown site or connection refuses the whole batch
    (RegistryError).
    """
    wanted = list({normalize_account_id(a.ad_account_id): a for a in accounts}.items())
    with transaction(con):
        take_registry_turn(con)
        require_site_and_connection(con, site_id, connection_id)
        linking = _BatchLinking(
            con, site_id, connection_id, [act for act, _ in wanted], shards, shard_size, max_links
        )
        for act, account in wanted:
            linking.decide(act, account)
        linking.write(con, now)
    return linking.batch


class _BatchLinking:
    """One `link_accounts` batch: each account decided in turn, against what is stored and
    what the batch decided before it, then every change written in a few statements."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        site_id: str,
        connection_id: str,
        ids: list[str],
        shards: int,
        shard_size: int,
        max_links: int,
    ) -> None:
        self.site_id = site_id
        self.connection_id = connection_id
        self.max_links = max_links
        self.stored = {
            row[0]: (row[1], row[2], row[3])
            for row in con.execute(
                "SELECT ad_account_id, connection_id, timezone, currency FROM meta_ad_accounts"
                " WHERE ad_account_id = ANY(?::VARCHAR[])",
                [ids],
            ).fetchall()
        }
        self.linked_sites = _sites_linking_each(con, ids)
        self.links = links_through(con, connection_id)
        self.placement = Placement(con, ids, shards, shard_size)
        self.batch = LinkBatch()
        self.new_accounts: list[tuple[AccountToLink, int]] = []
        self.named: list[tuple[str, str]] = []
        self.new_links: list[str] = []
        self.respread: list[str] = []

    def decide(self, act: str, account: AccountToLink) -> None:
        """Refuse, keep or link `act`, and note what linking it writes."""
        batch = self.batch
        try:
            timezone = validate_timezone(account.timezone)
            currency = normalize_currency(account.currency)
        except ValueError as exc:
            batch.refused.append(LinkRefusal(act, str(exc)))
            return
        sites = self.linked_sites.get(act, [])
        if sites:
            asked = (self.connection_id, timezone, currency)
            problem = _different_account(self.stored[act], asked, sites)
            if problem is not None:
                batch.refused.append(LinkRefusal(act, problem))
                return
            if account.name is not None:
                self.named.append((act, account.name))
            if self.site_id in sites:
                batch.already_linked.append(act)
                batch.shards[act] = self.placement.kept(act)
                return
        if self.links >= self.max_links:
            batch.refused.append(LinkRefusal(
                act, f"connection {self.connection_id!r} already holds {self.links} links, the"
                " most one connection may hold; unlink some first",
            ))
            return
        self.links += 1
        if sites:
            shard = self.placement.kept(act)
            self.respread.append(act)
        else:
            shard = self.placement.new()
            self.new_accounts.append((AccountToLink(act, timezone, currency, account.name), shard))
        self.new_links.append(act)
        batch.linked.append(act)
        batch.shards[act] = shard

    def write(self, con: duckdb.DuckDBPyConnection, now: datetime) -> None:
        """Store what `decide` noted: new accounts, names, links, and the spend of each new
        link to an account that already has some."""
        _insert_accounts(con, self.connection_id, self.new_accounts, now)
        if self.named:
            con.execute(
                "UPDATE meta_ad_accounts a SET name = coalesce(a.name, n.name)"
                " FROM (SELECT unnest(?::VARCHAR[]) AS id, unnest(?::VARCHAR[]) AS name) n"
                " WHERE a.ad_account_id = n.id",
                [[act for act, _ in self.named], [name for _, name in self.named]],
            )
        if self.new_links:
            con.execute(
                "INSERT INTO site_ad_accounts (site_id, ad_account_id, linked_at)"
                " SELECT ?, unnest(?::VARCHAR[]), ?",
                [self.site_id, self.new_links, now],
            )
        for act in self.respread:
            rebuild_site_spend(con, act, site_ids=[self.site_id])


def links_through(con: duckdb.DuckDBPyConnection, connection_id: str) -> int:
    """Site-account links whose account is synced through `connection_id`."""
    row = con.execute(
        "SELECT count(*) FROM site_ad_accounts l JOIN meta_ad_accounts a USING (ad_account_id)"
        " WHERE a.connection_id = ?",
        [connection_id],
    ).fetchone()
    return int(row[0]) if row else 0


def _insert_accounts(
    con: duckdb.DuckDBPyConnection,
    connection_id: str,
    accounts: Sequence[tuple[AccountToLink, int]],
    now: datetime,
) -> None:
    """Store new accounts and their shards, in two statements whatever their number."""
    if not accounts:
        return
    columns = [
        [account.ad_account_id for account, _ in accounts],
        [account.timezone for account, _ in accounts],
        [account.currency for account, _ in accounts],
        [account.name for account, _ in accounts],
    ]
    con.execute(
        """
        INSERT INTO meta_ad_accounts
            (ad_account_id, connection_id, timezone, currency, name, created_at)
        SELECT unnest(?::VARCHAR[]), ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[]),
               unnest(?::VARCHAR[]), ?
        ON CONFLICT (ad_account_id) DO UPDATE SET
            connection_id = excluded.connection_id, timezone = excluded.timezone,
            currency = excluded.currency, name = excluded.name
        """,
        [columns[0], connection_id, columns[1], columns[2], columns[3], now],
    )
    store_shards(con, {account.ad_account_id: shard for account, shard in accounts})


def require_site_and_connection(
    con: duckdb.DuckDBPyConnection, site_id: str, connection_id: str
) -> Connection:
    """The connection a link of `site_id` goes through; RegistryError when either is unknown."""
    if not site_exists(con, site_id):
        raise RegistryError(f"unknown site {site_id!r}: add it first with `rastro site add`")
    connection = get_connection(con, connection_id)
    if connection is None:
        raise RegistryError(
            f"unknown connection {connection_id!r}: connect it first with `rastro connect`"
        )
    return connection


def _different_account(
    stored: tuple[str, str, str], asked: tuple[str, str, str], linked_sites: list[str]
) -> str | None:
    """Why a linked account may not be linked as asked, or None: it is linked again only
    through its connection, in its timezone and currency (its spend is filed under them)."""
    stored_connection, stored_timezone, stored_currency = stored
    connection_id, timezone, currency = asked
    if stored_connection != connection_id:
        return (
            f"already synced through connection {stored_connection!r} (linked to"
            f" {', '.join(linked_sites)}); unlink it from every site before linking it"
            " through another connection"
        )
    if (stored_timezone, stored_currency) != (timezone, currency):
        return (
            f"stored with timezone {stored_timezone} and currency {stored_currency}, not"
            f" {timezone} and {currency}"
        )
    return None


def unlink_account(con: duckdb.DuckDBPyConnection, site_id: str, ad_account_id: str) -> bool:
    """Remove a link and that site's spend for the account. True when the account was purged.

    When no site links the account any more, everything synced for it goes:
    spend, catalog, thumbnails of its catalogued ads, sync history and the
    account row, so a later link starts again with a fresh backfill.
    """
    ad_account_id = normalize_account_id(ad_account_id)
    with transaction(con):
        take_registry_turn(con)
        if site_id not in sites_linking(con, ad_account_id):
            raise RegistryError(f"site {site_id!r} is not linked to {ad_account_id}")
        con.execute(
            "DELETE FROM site_ad_accounts WHERE site_id = ? AND ad_account_id = ?",
            [site_id, ad_account_id],
        )
        con.execute(
            "DELETE FROM site_spend_daily WHERE site_id = ? AND ad_account_id = ?",
            [site_id, ad_account_id],
        )
        if sites_linking(con, ad_account_id):
            return False
        for statement in (
            "DELETE FROM site_spend_daily WHERE ad_account_id = ?",
            "DELETE FROM ad_spend_daily WHERE ad_account_id = ?",
            "DELETE FROM ad_thumbnails WHERE ad_id IN"
            " (SELECT ad_id FROM ad_catalog WHERE ad_account_id = ?)",
            "DELETE FROM ad_catalog WHERE ad_account_id = ?",
            "DELETE FROM meta_sync_runs WHERE ad_account_id = ?",
            "DELETE FROM ad_account_shards WHERE ad_account_id = ?",
            "DELETE FROM meta_ad_accounts WHERE ad_account_id = ?",
        ):
            con.execute(statement, [ad_account_id])
    return True


def _sites_linking_each(
    con: duckdb.DuckDBPyConnection, ad_account_ids: Sequence[str]
) -> dict[str, list[str]]:
    """The sites linking each of the accounts named that any site links."""
    rows = con.execute(
        "SELECT ad_account_id, array_agg(site_id ORDER BY site_id) FROM site_ad_accounts"
        " WHERE ad_account_id = ANY(?::VARCHAR[]) GROUP BY ad_account_id",
        [list(ad_account_ids)],
    ).fetchall()
    return {account: list(sites) for account, sites in rows}

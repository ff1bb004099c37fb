"""Sites, Meta connections (sealed tokens), ad accounts and the links between them.

Every function takes an open connection. Each mutating one runs in its own
transaction, or joins the caller's when one is already open on `con`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import duckdb

from rastro_assets.accounts import normalize_account_id
from rastro_assets.outcomes import RESTATED_INVALID, ConnectionStatus
from rastro_assets.settings import DEFAULT_SHARD_ACCOUNTS
from rastro_assets.warehouse.connection import in_transaction, transaction

# Named here too (`registry.validate_identifier`, ...): callers check input through the registry.
from rastro_assets.warehouse.names import MAX_IDENTIFIER_CHARS as MAX_IDENTIFIER_CHARS
from rastro_assets.warehouse.names import MAX_NAME_CHARS as MAX_NAME_CHARS
from rastro_assets.warehouse.names import normalize_currency as normalize_currency
from rastro_assets.warehouse.names import validate_identifier as validate_identifier
from rastro_assets.warehouse.names import validate_site_name as validate_site_name
from rastro_assets.warehouse.names import validate_timezone as validate_timezone
from rastro_assets.warehouse.shard_store import SHARD, SHARD_JOIN, Placement, store_shards
from rastro_assets.warehouse.site_spend import rebuild_site_spend

MAX_LINKS_PER_CONNECTION = 500
"""Site-account links one connection may hold: the reference product's limit, which an
agency's Business Manager reaches before its token's rate limits hurt."""
SITE_ACCOUNTS_SHOWN = 5
"""Accounts a refused `remove_site` names before it says how many more: one line still."""
MARK_CONFLICT_ATTEMPTS = 5
MARK_CONFLICT_PAUSE_SECONDS = 0.01


class RegistryError(Exception):
    """A registry change that the current state refuses (unknown site, taken account...)."""


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


@dataclass(frozen=True)
class Connection:
    connection_id: str
    status: ConnectionStatus
    sealed_token: bytes | None = field(repr=False)
    sealed_at: datetime | None
    invalid_since: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class Site:
    site_id: str
    name: str | None
    created_at: datetime | None
    linked_accounts: int


@dataclass(frozen=True)
class LinkedAccount:
    ad_account_id: str
    connection_id: str
    timezone: str
    currency: str
    name: str | None
    created_at: datetime | None
    sync_requested_at: datetime | None
    sites: tuple[str, ...]
    connection_status: str | None
    connection_sealed_at: datetime | None
    shard: int = 0


def add_site(con: duckdb.DuckDBPyConnection, site_id: str, name: str | None, now: datetime) -> None:
    """Create the site, or rename it when it exists."""
    with transaction(con):
        con.execute(
            """
            INSERT INTO sites (site_id, name, created_at) VALUES (?, ?, ?)
            ON CONFLICT (site_id) DO UPDATE SET name = coalesce(excluded.name, sites.name)
            """,
            [site_id, name, now],
        )


def site_exists(con: duckdb.DuckDBPyConnection, site_id: str) -> bool:
    return _exists(con, "SELECT 1 FROM sites WHERE site_id = ?", [site_id])


def list_sites(con: duckdb.DuckDBPyConnection) -> list[Site]:
    """Every site with how many accounts it links, sorted by id."""
    rows = con.execute(
        "SELECT s.site_id, s.name, s.created_at, count(l.ad_account_id) FROM sites s"
        " LEFT JOIN site_ad_accounts l USING (site_id) GROUP BY ALL ORDER BY s.site_id"
    ).fetchall()
    return [
        Site(site_id, name, created_at, int(linked)) for site_id, name, created_at, linked in rows
    ]


def rename_site(con: duckdb.DuckDBPyConnection, site_id: str, name: str) -> str | None:
    """Give the site a new name; its old one. RegistryError when the site is unknown."""
    with transaction(con):
        row = con.execute("SELECT name FROM sites WHERE site_id = ?", [site_id]).fetchone()
        if row is None:
            raise RegistryError(_unknown_site(site_id))
        con.execute("UPDATE sites SET name = ? WHERE site_id = ?", [name, site_id])
    return row[0]


def remove_site(con: duckdb.DuckDBPyConnection, site_id: str) -> None:
    """Remove a site that links no account. RegistryError when it is unknown or still links
    accounts: its spend lives through its links, so each is undone by `unlink`, which also
    decides what of an account's data goes."""
    with transaction(con):
        if not site_exists(con, site_id):
            raise RegistryError(_unknown_site(site_id))
        linked = [
            row[0]
            for row in con.execute(
                "SELECT ad_account_id FROM site_ad_accounts WHERE site_id = ?"
                " ORDER BY ad_account_id",
                [site_id],
            ).fetchall()
        ]
        if linked:
            shown = ", ".join(linked[:SITE_ACCOUNTS_SHOWN])
            if len(linked) > SITE_ACCOUNTS_SHOWN:
                shown += f" and {len(linked) - SITE_ACCOUNTS_SHOWN} more"
            accounts = "1 ad account" if len(linked) == 1 else f"{len(linked)} ad accounts"
            each = "it" if len(linked) == 1 else "each"
            raise RegistryError(
                f"site {site_id!r} still links {accounts} ({shown}): unlink {each} first with"
                f" `rastro unlink {site_id} AD_ACCOUNT_ID`"
            )
        con.execute("DELETE FROM sites WHERE site_id = ?", [site_id])


def _unknown_site(site_id: str) -> str:
    return f"unknown site {site_id!r}: `rastro site list` shows the sites"


def save_connection(
    con: duckdb.DuckDBPyConnection, connection_id: str, sealed_token: bytes, now: datetime
) -> None:
    """Store a (new) sealed token; the connection becomes active again.

    `sealed_at` is the token's version: accounts paused by a dead token resume
    because the planner reads the status, and a run still holding the old
    token can no longer mark this one invalid (see `mark_connection_invalid`).
    """
    with transaction(con):
        con.execute(
            """
            INSERT INTO meta_connections
                (connection_id, status, invalid_since, last_error, sealed_token, sealed_at,
                 created_at, updated_at)
            VALUES (?, ?, NULL, NULL, ?, ?, ?, ?)
            ON CONFLICT (connection_id) DO UPDATE SET
                status = excluded.status, invalid_since = NULL, last_error = NULL,
                sealed_token = excluded.sealed_token, sealed_at = excluded.sealed_at,
                updated_at = excluded.updated_at
            """,
            [connection_id, ConnectionStatus.ACTIVE, sealed_token, now, now, now],
        )


_CONNECTION_QUERY = """
    SELECT connection_id, status, sealed_token, sealed_at, invalid_since, last_error
    FROM meta_connections
"""


def get_connection(con: duckdb.DuckDBPyConnection, connection_id: str) -> Connection | None:
    row = con.execute(f"{_CONNECTION_QUERY} WHERE connection_id = ?", [connection_id]).fetchone()
    return _connection(row) if row else None


def _connection(row: tuple) -> Connection:
    return Connection(
        connection_id=row[0],
        status=ConnectionStatus(row[1]),
        sealed_token=bytes(row[2]) if row[2] is not None else None,
        sealed_at=row[3],
        invalid_since=row[4],
        last_error=row[5],
    )


def get_connections(
    con: duckdb.DuckDBPyConnection, connection_ids: Iterable[str]
) -> dict[str, Connection]:
    """The connections among `connection_ids` that exist, by id."""
    wanted = sorted(set(connection_ids))
    if not wanted:
        return {}
    rows = con.execute(
        f"{_CONNECTION_QUERY} WHERE list_contains(?::VARCHAR[], connection_id)", [wanted]
    ).fetchall()
    return {row[0]: _connection(row) for row in rows}


def mark_connection_invalid(
    con: duckdb.DuckDBPyConnection,
    connection_id: str,
    message: str,
    now: datetime,
    *,
    token_sealed_at: datetime | None,
) -> bool:
    """Mark the connection's token dead, if it is still the token the caller used.

    A run that started with an older token must not condemn one connected
    since: only a stored `sealed_at` equal to `token_sealed_at` is marked. The
    first `invalid_since` is kept, and so is the stored error when `message`
    only restates it: a run refused before asking Meta, because the token was
    already marked, says "the connection's token is invalid: <stored error>",
    and writing that back would nest the error one level deeper each run.

    Syncs of several accounts of one connection run at once (a wave) and may
    all find the token dead together: their updates of this one row conflict
    in DuckDB, so a conflict is retried (only when this call owns its
    transaction). True when the row was marked.
    """
    if token_sealed_at is None:
        return False
    attempts = 1 if in_transaction(con) else MARK_CONFLICT_ATTEMPTS
    invalid = ConnectionStatus.INVALID
    for attempt in range(1, attempts + 1):
        try:
            with transaction(con):
                row = con.execute(
                    """
                    UPDATE meta_connections SET
                        status = ?, invalid_since = coalesce(invalid_since, ?),
                        last_error = CASE
                            WHEN status = ? AND last_error IS NOT NULL
                                 AND (contains(?, last_error) OR contains(?, ?))
                            THEN last_error ELSE ? END,
                        updated_at = ?
                    WHERE connection_id = ? AND sealed_at = ?
                    """,
                    [invalid, now, invalid, message, message, RESTATED_INVALID, message, now,
                     connection_id, token_sealed_at],
                ).fetchone()
            return bool(row and row[0])
        except duckdb.TransactionException as exc:
            if "conflict" not in str(exc).lower() or attempt == attempts:
                raise
            time.sleep(MARK_CONFLICT_PAUSE_SECONDS * attempt)
    raise AssertionError("unreachable")


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
    batch = LinkBatch()
    wanted = list({normalize_account_id(a.ad_account_id): a for a in accounts}.items())
    ids = [act for act, _ in wanted]
    with transaction(con):
        require_site_and_connection(con, site_id, connection_id)
        stored = {
            row[0]: (row[1], row[2], row[3])
            for row in con.execute(
                "SELECT ad_account_id, connection_id, timezone, currency FROM meta_ad_accounts"
                " WHERE list_contains(?::VARCHAR[], ad_account_id)",
                [ids],
            ).fetchall()
        }
        linked_sites = _sites_linking_each(con, ids)
        links = links_through(con, connection_id)
        placement = Placement(con, ids, shards, shard_size)
        new_accounts: list[tuple[AccountToLink, int]] = []
        named: list[tuple[str, str]] = []
        new_links: list[str] = []
        respread: list[str] = []
        for act, account in wanted:
            try:
                timezone = validate_timezone(account.timezone)
                currency = normalize_currency(account.currency)
            except ValueError as exc:
                batch.refused.append(LinkRefusal(act, str(exc)))
                continue
            sites = linked_sites.get(act, [])
            if sites:
                asked = (connection_id, timezone, currency)
                problem = _different_account(stored[act], asked, sites)
                if problem is not None:
                    batch.refused.append(LinkRefusal(act, problem))
                    continue
                if account.name is not None:
                    named.append((act, account.name))
                if site_id in sites:
                    batch.already_linked.append(act)
                    batch.shards[act] = placement.kept(act)
                    continue
            if links >= max_links:
                batch.refused.append(LinkRefusal(
                    act, f"connection {connection_id!r} already holds {links} links, the most"
                    " one connection may hold; unlink some first",
                ))
                continue
            links += 1
            if sites:
                shard = placement.kept(act)
                respread.append(act)
            else:
                shard = placement.new()
                new_accounts.append((AccountToLink(act, timezone, currency, account.name), shard))
            new_links.append(act)
            batch.linked.append(act)
            batch.shards[act] = shard
        _insert_accounts(con, connection_id, new_accounts, now)
        if named:
            con.execute(
                "UPDATE meta_ad_accounts a SET name = coalesce(a.name, n.name)"
                " FROM (SELECT unnest(?::VARCHAR[]) AS id, unnest(?::VARCHAR[]) AS name) n"
                " WHERE a.ad_account_id = n.id",
                [[act for act, _ in named], [name for _, name in named]],
            )
        if new_links:
            con.execute(
                "INSERT INTO site_ad_accounts (site_id, ad_account_id, linked_at)"
                " SELECT ?, unnest(?::VARCHAR[]), ?",
                [site_id, new_links, now],
            )
        for act in respread:
            rebuild_site_spend(con, act, site_ids=[site_id])
    return batch


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
        if site_id not in _sites_linking(con, ad_account_id):
            raise RegistryError(f"site {site_id!r} is not linked to {ad_account_id}")
        con.execute(
            "DELETE FROM site_ad_accounts WHERE site_id = ? AND ad_account_id = ?",
            [site_id, ad_account_id],
        )
        con.execute(
            "DELETE FROM site_spend_daily WHERE site_id = ? AND ad_account_id = ?",
            [site_id, ad_account_id],
        )
        if _sites_linking(con, ad_account_id):
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


_LINKED_ACCOUNTS = f"""
    SELECT a.ad_account_id, a.connection_id, a.timezone, a.currency, a.name, a.created_at,
           a.sync_requested_at, list(l.site_id ORDER BY l.site_id) AS sites,
           c.status, c.sealed_at, {SHARD} AS shard
    FROM meta_ad_accounts a
    JOIN site_ad_accounts l USING (ad_account_id)
    LEFT JOIN meta_connections c USING (connection_id)
    {SHARD_JOIN}
    WHERE CAST(? AS VARCHAR) IS NULL OR a.ad_account_id = ?
    GROUP BY ALL
    ORDER BY a.ad_account_id
"""


def linked_accounts(con: duckdb.DuckDBPyConnection) -> list[LinkedAccount]:
    """Every account at least one site links, sorted by id."""
    rows = con.execute(_LINKED_ACCOUNTS, [None, None]).fetchall()
    return [_linked_account(row) for row in rows]


def get_account(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> LinkedAccount | None:
    """The account if at least one site links it."""
    row = con.execute(_LINKED_ACCOUNTS, [ad_account_id, ad_account_id]).fetchone()
    return _linked_account(row) if row else None


def request_sync(con: duckdb.DuckDBPyConnection, ad_account_id: str, now: datetime) -> None:
    """Ask the planner to sync the account at its next look."""
    with transaction(con):
        if not _sites_linking(con, ad_account_id):
            raise RegistryError(f"{ad_account_id} is not linked to any site")
        con.execute(
            "UPDATE meta_ad_accounts SET sync_requested_at = ? WHERE ad_account_id = ?",
            [now, ad_account_id],
        )


def _sites_linking(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> list[str]:
    rows = con.execute(
        "SELECT site_id FROM site_ad_accounts WHERE ad_account_id = ? ORDER BY site_id",
        [ad_account_id],
    ).fetchall()
    return [row[0] for row in rows]


def _sites_linking_each(
    con: duckdb.DuckDBPyConnection, ad_account_ids: Sequence[str]
) -> dict[str, list[str]]:
    """The sites linking each of the accounts named that any site links."""
    rows = con.execute(
        "SELECT ad_account_id, list(site_id ORDER BY site_id) FROM site_ad_accounts"
        " WHERE list_contains(?::VARCHAR[], ad_account_id) GROUP BY ad_account_id",
        [list(ad_account_ids)],
    ).fetchall()
    return {account: list(sites) for account, sites in rows}


def _exists(con: duckdb.DuckDBPyConnection, query: str, params: list[object]) -> bool:
    return con.execute(query, params).fetchone() is not None


def _linked_account(row: tuple) -> LinkedAccount:
    return LinkedAccount(
        ad_account_id=row[0],
        connection_id=row[1],
        timezone=row[2],
        currency=row[3],
        name=row[4],
        created_at=row[5],
        sync_requested_at=row[6],
        sites=tuple(row[7]),
        connection_status=row[8],
        connection_sealed_at=row[9],
        shard=int(row[10]),
    )

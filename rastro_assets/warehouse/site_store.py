"""Sites: the places spend is reported for, each linking ad accounts (`link_store`).

Every function takes an open connection. Each mutating one runs in its own
transaction, or joins the caller's when one is already open on `con`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import duckdb

from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.registry import RegistryError, take_registry_turn

SITE_ACCOUNTS_SHOWN = 5
"""Accounts a refused `remove_site` names before it says how many more: one line still."""


@dataclass(frozen=True)
class Site:
    site_id: str
    name: str | None
    created_at: datetime | None
    linked_accounts: int


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
        " LEFT JOIN site_ad_accounts l USING (site_id)"
        " GROUP BY s.site_id, s.name, s.created_at ORDER BY s.site_id"
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
        take_registry_turn(con)
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


def _exists(con: duckdb.DuckDBPyConnection, query: str, params: list[object]) -> bool:
    return con.execute(query, params).fetchone() is not None


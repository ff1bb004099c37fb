"""Shared by the reliability tests: warehouses on either engine and the environment that
names them to a process, syncers on the fake, snapshots, perturbations, scans."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
from collections.abc import Iterable, Mapping
from datetime import date
from decimal import Decimal
from pathlib import Path

from psycopg2 import sql

from rastro_assets.meta.client import MetaClient
from rastro_assets.sync.syncer import Syncer
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.postgres_server import WarehouseServer
from rastro_fake_graph.world import Figures

GRAPH = "https://graph.facebook.com/v25.0"
TABLES = (
    "sites",
    "meta_connections",
    "meta_ad_accounts",
    "site_ad_accounts",
    "ad_spend_daily",
    "site_spend_daily",
    "ad_catalog",
    "ad_thumbnails",
    "meta_sync_runs",
    "lead_daily_rollups",
)


# -- the warehouse on either engine ---------------------------------------------------


def warehouse_env_for(
    engine: str, duckdb_path: Path, server: WarehouseServer | None
) -> dict[str, str]:
    """The variable naming a new warehouse: the DuckDB file's path, or the URL (with its
    password) of a new schema on `server`."""
    if engine == "postgres":
        assert server is not None
        return {"RASTRO_WAREHOUSE_URL": server.fresh_schema_url()}
    return {"RASTRO_DUCKDB_PATH": str(duckdb_path)}


def open_warehouse_of(
    env: Mapping[str, str], **duckdb_options
) -> Warehouse | PostgresWarehouse:
    """The warehouse `env` names, as a run given that environment opens it."""
    if env.get("RASTRO_WAREHOUSE_URL"):
        return PostgresWarehouse(env["RASTRO_WAREHOUSE_URL"])
    return Warehouse(env["RASTRO_DUCKDB_PATH"], **duckdb_options)


def child_env(warehouse_env: Mapping[str, str], **extra: str) -> dict[str, str]:
    """This process's environment for a child, naming only the test's warehouse."""
    env = {
        key: value for key, value in os.environ.items()
        if key not in ("RASTRO_WAREHOUSE_URL", "RASTRO_DUCKDB_PATH")
    }
    return {**env, **warehouse_env, **extra}


def copy_schema(server: WarehouseServer, warehouse: PostgresWarehouse) -> str:
    """The URL of a new schema holding a copy of every table of `warehouse`'s schema.

    A fresh schema migrated, linked and synced costs more than the copy of one that was.
    """
    with warehouse.connect() as con:
        source = con.execute("SELECT current_schema()").fetchone()[0]
        tables = [row[0] for row in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
            [source],
        ).fetchall()]
    target = "t_" + secrets.token_hex(6)
    with contextlib.closing(server.server.connect()) as admin, admin.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(target)))
        for table in tables:
            new, old = sql.Identifier(target, table), sql.Identifier(source, table)
            cursor.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(new, old))
            cursor.execute(sql.SQL("INSERT INTO {} SELECT * FROM {}").format(new, old))
        admin.commit()
    return server.url(options=f"-csearch_path%3D{target}")


# -- Meta ------------------------------------------------------------------------------


def client_factory(world, *, page_size: int = 4, transport=None, base_url: str = GRAPH):
    """MetaClients on `world` that never sleep; an async job gives up after 5 polls."""
    from rastro_fake_graph.app import FakeGraphTransport

    def client(token: str) -> MetaClient:
        return MetaClient(
            token,
            base_url=base_url,
            transport=transport if transport is not None else FakeGraphTransport(world),
            sleep=lambda seconds: None,
            page_size=page_size,
            # Polls "wait" 1 s each on the injected sleep: a stuck job gives up
            # after 5 of them instead of 600 real seconds.
            async_poll_seconds=1.0,
            async_timeout_seconds=5.0,
        )

    return client


def make_syncer(warehouse: Warehouse, world, clock, **kwargs) -> Syncer:
    return Syncer(warehouse, client_factory(world, **kwargs), clock=clock)


def build_world(clock, token: str):
    """act_101 (Sao Paulo, BRL, 12 ads) and act_202 (Tokyo, JPY, 4 ads), read by `token`."""
    from rastro_fake_graph.world import FakeWorld

    world = FakeWorld(clock=clock, seed=7)
    world.add_account(
        "act_101", timezone="America/Sao_Paulo", currency="BRL", n_ads=12, token=token
    )
    world.add_account("act_202", timezone="Asia/Tokyo", currency="JPY", n_ads=4, token=token)
    return world


def link_world(warehouse: Warehouse, vault, world, token: str, now) -> None:
    """Site s1 links both accounts through connection c1; site s2 shares act_202."""
    from rastro_assets.warehouse import link_store, registry, site_store

    with warehouse.connect() as con:
        site_store.add_site(con, "s1", "Site one", now)
        site_store.add_site(con, "s2", "Site two", now)
        registry.save_connection(con, "c1", vault.seal("c1", token), now)
        for site, account in (("s1", "act_101"), ("s1", "act_202"), ("s2", "act_202")):
            fake = world.accounts[account]
            link_store.link_account(con, site, account, "c1", fake.timezone, fake.currency, now)


# -- what the warehouse holds ----------------------------------------------------


def spend_by_day(con, account: str, since: date, until: date) -> dict[date, set[tuple]]:
    """{day: {(ad_id, spend, impressions, clicks, conversations)}} for every day of the range."""
    found: dict[date, set[tuple]] = {day: set() for day in days_between(since, until)}
    rows = con.execute(
        """
        SELECT day, ad_id, spend, impressions, clicks, conversations FROM ad_spend_daily
        WHERE ad_account_id = ? AND day BETWEEN ? AND ?
        """,
        [account, since, until],
    ).fetchall()
    for day, *rest in rows:
        found[day].add(tuple(rest))
    return found


def truth_by_day(world, account: str, since: date, until: date) -> dict[date, set[tuple]]:
    return {
        day: {
            (row.ad_id, row.spend, row.impressions, row.clicks, row.conversations)
            for row in world.truth(account, day)
        }
        for day in days_between(since, until)
    }


def table_dump(con, table: str, *, without: Iterable[str] = ()) -> list[tuple]:
    """Every row of `table` in a stable order (without the columns named), on either engine."""
    con.execute(f"SELECT * FROM {table} LIMIT 0")
    names = [column[0] for column in con.description if column[0] not in set(without)]
    columns = ", ".join(f'"{name}"' for name in names)
    order = ", ".join(str(position) for position in range(1, len(names) + 1))
    return con.execute(f"SELECT {columns} FROM {table} ORDER BY {order}").fetchall()


def check_integrity(warehouse: Warehouse) -> dict[str, int]:
    """Every table of the warehouse reads in full; the row count of each."""
    counts = {}
    with warehouse.connect(read_only=True) as con:
        names = [
            row[0]
            for row in con.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = current_schema()"
            ).fetchall()
        ]
        assert set(TABLES) <= set(names), names
        for name in names:
            rows = con.execute(f"SELECT * FROM {name}").fetchall()
            counts[name] = len(rows)
    return counts


# -- changing Meta between two reads ------------------------------------------------


def perturb(world, account: str, since: date, until: date) -> None:
    """Make every day differ from what was read: one figure changed, one ad-day
    withdrawn, one ad-day added (when the day has room for each)."""
    ads = sorted(world.accounts[account].ads)
    for day in days_between(since, until):
        rows = world.truth(account, day)
        present = {row.ad_id for row in rows}
        if rows:
            first = rows[0]
            world.set_ad_day(
                account,
                first.ad_id,
                day,
                Figures(
                    spend=first.spend + Decimal("1.11"),
                    impressions=first.impressions + 7,
                    clicks=first.clicks + 1,
                    conversations=first.conversations,
                ),
            )
        if len(rows) >= 2:
            world.set_ad_day(account, rows[1].ad_id, day, None)
        absent = [ad_id for ad_id in ads if ad_id not in present]
        if absent:
            world.set_ad_day(
                account,
                absent[0],
                day,
                Figures(spend=Decimal("0.37"), impressions=55, clicks=2, conversations=1),
            )


# -- secrets ---------------------------------------------------------------------------


def secret_forms(secret: str) -> list[bytes]:
    """The secret and every base64 spelling of it, wherever it sits in an encoded blob.

    Base64 groups 3 bytes; a secret starting at offset 0, 1 or 2 of a group
    encodes differently, so the stable middle of each of the 3 encodings is
    searched for (standard and URL-safe alphabets), plus its UTF-16 form.
    """
    raw = secret.encode()
    forms = {raw, secret.encode("utf-16-le")}
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * shift + raw)
            # Keep only the characters made of the secret's bits alone.
            head = (shift * 8 + 5) // 6
            tail = (shift + len(raw)) * 8 // 6
            forms.add(encoded[head:tail])
    return sorted(forms)


def find_secret(blob: bytes, secret: str) -> list[str]:
    return [form.decode() for form in secret_forms(secret) if form in blob]


def scan_tree(root: Path, secret: str) -> list[str]:
    """Files under `root` holding the secret in any form: `path: form`."""
    hits = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            for form in find_secret(path.read_bytes(), secret):
                hits.append(f"{path}: {form}")
    return hits

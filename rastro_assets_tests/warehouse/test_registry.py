"""Sites, connections, accounts and links: what is refused, and what a link or unlink leaves."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal

import duckdb
import pytest

from rastro_assets.meta.models import InsightRow, insight_table
from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets.warehouse.ad_spend_table import write_spend
from rastro_assets.warehouse.link_store import LinkResult
from rastro_assets.warehouse.registry import RegistryError
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact, site_rows

DAY1, DAY2 = date(2026, 11, 28), date(2026, 11, 29)
SEALED = b"\x01" * 44


def count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    query = {
        "sites": "SELECT count(*) FROM sites",
        "meta_connections": "SELECT count(*) FROM meta_connections",
        "meta_ad_accounts": "SELECT count(*) FROM meta_ad_accounts",
        "site_ad_accounts": "SELECT count(*) FROM site_ad_accounts",
        "ad_spend_daily": "SELECT count(*) FROM ad_spend_daily",
        "site_spend_daily": "SELECT count(*) FROM site_spend_daily",
        "ad_catalog": "SELECT count(*) FROM ad_catalog",
        "ad_thumbnails": "SELECT count(*) FROM ad_thumbnails",
        "meta_sync_runs": "SELECT count(*) FROM meta_sync_runs",
    }[table]
    return con.execute(query).fetchone()[0]


def spend(con, account: str, now: datetime, *rows: tuple[str, date, str]) -> None:
    days = sorted({day for _, day, _ in rows}) or [DAY1]
    write_spend(
        con,
        account,
        days=days,
        rows=insight_table(
            [InsightRow(ad, day, Decimal(value), 10, 1, 0) for ad, day, value in rows]
        ),
        complete_days=days,
        synced_at=now,
    )


# validation ------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [("usd", "USD"), ("BRL", "BRL"), (" jpy ", "JPY")])
def test_currencies_normalize(raw: str, expected: str):
    assert registry.normalize_currency(raw) == expected


@pytest.mark.parametrize("raw", ["", "US", "USDT", "U$D", "12A", "ÜSD"])
def test_bad_currencies_are_refused(raw: str):
    with pytest.raises(ValueError, match="three-letter ISO code"):
        registry.normalize_currency(raw)


@pytest.mark.parametrize("raw", ["America/Sao_Paulo", "UTC", "Asia/Kolkata", "Etc/GMT+3"])
def test_iana_timezones_are_accepted(raw: str):
    assert registry.validate_timezone(raw) == raw


@pytest.mark.parametrize("raw", ["", "Mars/Olympus", "GMT-3:00", "../etc/passwd", "+03:00"])
def test_bad_timezones_are_refused(raw: str):
    with pytest.raises(ValueError, match="IANA"):
        registry.validate_timezone(raw)


@pytest.mark.parametrize("raw", ["", " ", "a b", "-x", "x|y", "a" * 129, "s\n1"])
def test_bad_identifiers_are_refused(raw: str):
    with pytest.raises(ValueError, match="is not a valid id"):
        registry.validate_identifier("site id", raw)


# sites and connections --------------------------------------------------------


def test_add_site_is_idempotent_and_renames(con, now):
    site_store.add_site(con, "s1", "One", now)
    site_store.add_site(con, "s1", "One", now + timedelta(hours=1))
    site_store.add_site(con, "s1", "Renamed", now + timedelta(hours=2))
    site_store.add_site(con, "s1", None, now + timedelta(hours=3))
    assert con.execute("SELECT site_id, name, created_at FROM sites").fetchall() == [
        ("s1", "Renamed", now)
    ]


def test_save_and_get_connection(con, now):
    assert registry.get_connection(con, "c1") is None
    registry.save_connection(con, "c1", SEALED, now)
    connection = registry.get_connection(con, "c1")
    assert connection == registry.Connection("c1", "active", SEALED, now, None, None)
    assert "sealed_token" not in repr(connection)
    assert repr(SEALED) not in repr(connection)


def test_invalid_token_is_marked_once_and_a_new_token_revives(con, now):
    registry.save_connection(con, "c1", SEALED, now)
    later = now + timedelta(hours=1)
    assert registry.mark_connection_invalid(
        con, "c1", "META_TOKEN_INVALID: x", later, token_sealed_at=now
    )
    assert registry.mark_connection_invalid(
        con, "c1", "META_TOKEN_INVALID: y", later + timedelta(hours=1), token_sealed_at=now
    )
    connection = registry.get_connection(con, "c1")
    assert (connection.status, connection.invalid_since, connection.last_error) == (
        "invalid",
        later,
        "META_TOKEN_INVALID: y",
    )
    fresh = later + timedelta(days=1)
    registry.save_connection(con, "c1", b"\x02" * 44, fresh)
    connection = registry.get_connection(con, "c1")
    assert (connection.status, connection.invalid_since, connection.last_error) == (
        "active",
        None,
        None,
    )
    assert (connection.sealed_token, connection.sealed_at) == (b"\x02" * 44, fresh)
    created = con.execute("SELECT created_at FROM meta_connections").fetchone()[0]
    assert created == now


def test_a_run_with_an_old_token_cannot_condemn_a_new_one(con, now):
    registry.save_connection(con, "c1", SEALED, now)
    registry.save_connection(con, "c1", b"\x02" * 44, now + timedelta(minutes=5))
    marked = registry.mark_connection_invalid(
        con, "c1", "META_TOKEN_INVALID: old", now + timedelta(minutes=6), token_sealed_at=now
    )
    assert not marked
    assert registry.get_connection(con, "c1").status == "active"
    assert not registry.mark_connection_invalid(con, "c1", "x", now, token_sealed_at=None)
    assert not registry.mark_connection_invalid(con, "nope", "x", now, token_sealed_at=now)


# links ------------------------------------------------------------------------


def test_link_creates_the_account_and_a_relink_is_a_no_op(con, now):
    site_store.add_site(con, "s1", None, now)
    registry.save_connection(con, "c1", SEALED, now)
    assert link_store.link_account(con, "s1", "123", "c1", "UTC", "usd", now, name="Shop") == (
        link_store.Linked(LinkResult.LINKED, 0)
    )
    again = link_store.link_account(con, "s1", "act_123", "c1", "UTC", "USD", now + timedelta(1))
    assert again.result == LinkResult.ALREADY_LINKED == "already_linked"
    assert con.execute("SELECT * FROM meta_ad_accounts").fetchall() == [
        ("act_123", "c1", "UTC", "USD", "Shop", now, None)
    ]
    assert con.execute("SELECT * FROM site_ad_accounts").fetchall() == [("s1", "act_123", now)]


def test_link_account_answers_the_shard_it_chose_and_a_relink_the_one_kept(con, now):
    site_store.add_site(con, "s1", None, now)
    site_store.add_site(con, "s2", None, now)
    registry.save_connection(con, "c1", SEALED, now)

    def link(site: str, act: str) -> link_store.Linked:
        return link_store.link_account(
            con, site, act, "c1", "UTC", "USD", now, shards=3, shard_size=1
        )

    assert [link("s1", act).shard for act in ("act_1", "act_2")] == [0, 1]
    assert link("s2", "act_2") == link_store.Linked(LinkResult.LINKED, 1)
    assert link("s2", "act_2") == link_store.Linked(LinkResult.ALREADY_LINKED, 1)
    assert shard_store.account_shards(con) == {"act_1": 0, "act_2": 1}


@pytest.mark.parametrize(
    ("site", "connection", "message"),
    [("nope", "c1", "unknown site 'nope'"), ("s1", "nope", "unknown connection 'nope'")],
)
def test_link_to_unknown_site_or_connection_is_refused(con, now, site, connection, message):
    site_store.add_site(con, "s1", None, now)
    registry.save_connection(con, "c1", SEALED, now)
    with pytest.raises(RegistryError, match=message):
        link_store.link_account(con, site, "act_1", connection, "UTC", "USD", now)
    assert count(con, "meta_ad_accounts") == count(con, "site_ad_accounts") == 0


def test_account_synced_through_another_connection_is_refused(con, now, linked_account):
    site_store.add_site(con, "s2", None, now)
    registry.save_connection(con, "c2", SEALED, now)
    with pytest.raises(RegistryError, match="already synced through connection 'c1'"):
        link_store.link_account(con, "s2", "act_1", "c2", "America/Sao_Paulo", "BRL", now)
    with pytest.raises(RegistryError, match="already synced through connection 'c1'"):
        link_store.link_account(con, "s1", "act_1", "c2", "America/Sao_Paulo", "BRL", now)
    assert con.execute("SELECT site_id FROM site_ad_accounts").fetchall() == [("s1",)]


def test_a_different_timezone_or_currency_for_a_linked_account_is_refused(con, now, linked_account):
    site_store.add_site(con, "s2", None, now)
    with pytest.raises(RegistryError, match="stored with timezone America/Sao_Paulo"):
        link_store.link_account(con, "s2", "act_1", "c1", "UTC", "BRL", now)
    with pytest.raises(RegistryError, match="currency BRL"):
        link_store.link_account(con, "s1", "act_1", "c1", "America/Sao_Paulo", "USD", now)
    assert count(con, "site_ad_accounts") == 1


def test_bad_inputs_to_link_write_nothing(con, now):
    site_store.add_site(con, "s1", None, now)
    registry.save_connection(con, "c1", SEALED, now)
    for bad in (
        ("act_x", "UTC", "USD"),
        ("act_1", "Nowhere/City", "USD"),
        ("act_1", "UTC", "US"),
    ):
        with pytest.raises(ValueError):
            link_store.link_account(con, "s1", bad[0], "c1", bad[1], bad[2], now)
    assert count(con, "meta_ad_accounts") == count(con, "site_ad_accounts") == 0


def test_second_site_gets_the_existing_spend_at_once(con, now, linked_account):
    spend(con, "act_1", now, ("a1", DAY1, "1.5000"), ("a2", DAY1, "2.2500"), ("a1", DAY2, "3"))
    site_store.add_site(con, "s2", None, now)
    link_store.link_account(con, "s2", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    assert_site_spend_exact(con)
    assert {(row[0], row[2], row[3]) for row in site_rows(con)} == {
        ("s1", DAY1, Decimal("3.7500")),
        ("s1", DAY2, Decimal("3.0000")),
        ("s2", DAY1, Decimal("3.7500")),
        ("s2", DAY2, Decimal("3.0000")),
    }


def test_linked_accounts_and_get_account(con, now, linked_account):
    site_store.add_site(con, "s0", None, now)
    link_store.link_account(con, "s0", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    link_store.link_account(con, "s1", "act_0", "c1", "UTC", "USD", now, name="Zero")
    accounts = registry.linked_accounts(con)
    assert [account.ad_account_id for account in accounts] == ["act_0", "act_1"]
    act_1 = accounts[1]
    assert act_1 == registry.get_account(con, "act_1")
    assert act_1.sites == ("s0", "s1")
    assert (act_1.timezone, act_1.currency) == ("America/Sao_Paulo", "BRL")
    assert act_1.connection_id == "c1"
    assert (act_1.connection_status, act_1.connection_sealed_at) == ("active", now)
    assert accounts[0].name == "Zero"
    assert registry.get_account(con, "act_404") is None


def test_request_sync(con, now, linked_account):
    registry.request_sync(con, "act_1", now + timedelta(minutes=3))
    assert registry.get_account(con, "act_1").sync_requested_at == now + timedelta(minutes=3)
    with pytest.raises(RegistryError, match="act_2 is not linked"):
        registry.request_sync(con, "act_2", now)


# unlink -----------------------------------------------------------------------


def seed_catalog(con, account: str, ad_id: str, now: datetime) -> None:
    con.execute(
        "INSERT INTO ad_catalog (ad_id, ad_account_id, ad_name, updated_at) VALUES (?, ?, ?, ?)",
        [ad_id, account, f"ad {ad_id}", now],
    )
    con.execute(
        "INSERT INTO ad_thumbnails (ad_id, content_type, image, sha256, fetched_at)"
        " VALUES (?, 'image/png', ?, 'ab', ?)",
        [ad_id, b"\x89PNG", now],
    )
    con.execute(
        "INSERT INTO meta_sync_runs (run_id, ad_account_id, kind, since, started_at)"
        " VALUES (?, ?, ?, ?, ?)",
        [f"run-{ad_id}", account, "backfill", now.date(), now],
    )


def test_unlink_one_of_two_sites_keeps_the_account(con, now, linked_account):
    site_store.add_site(con, "s2", None, now)
    link_store.link_account(con, "s2", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    spend(con, "act_1", now, ("a1", DAY1, "1"))
    assert link_store.unlink_account(con, "s1", "act_1") is False
    assert [row[0] for row in site_rows(con)] == ["s2"]
    assert count(con, "ad_spend_daily") == 1
    assert registry.get_account(con, "act_1").sites == ("s2",)
    assert_site_spend_exact(con)


def test_last_unlink_purges_the_account_and_only_it(con, now, linked_account):
    link_store.link_account(con, "s1", "act_2", "c1", "UTC", "USD", now)
    for account, ad in (("act_1", "11"), ("act_2", "21")):
        spend(con, account, now, (ad, DAY1, "1.0001"))
        seed_catalog(con, account, ad, now)
    assert link_store.unlink_account(con, "s1", "1") is True
    for table in (
        "ad_spend_daily",
        "site_spend_daily",
        "ad_catalog",
        "ad_thumbnails",
        "meta_sync_runs",
        "meta_ad_accounts",
        "site_ad_accounts",
    ):
        assert count(con, table) == 1, table
    assert con.execute("SELECT DISTINCT ad_account_id FROM ad_spend_daily").fetchall() == [
        ("act_2",)
    ]
    assert con.execute("SELECT ad_id FROM ad_thumbnails").fetchall() == [("21",)]
    assert registry.get_account(con, "act_1") is None
    assert count(con, "meta_connections") == 1
    assert_site_spend_exact(con)


def test_relink_after_purge_starts_fresh_and_may_change_connection(con, now, linked_account):
    spend(con, "act_1", now, ("a1", DAY1, "5"))
    link_store.unlink_account(con, "s1", "act_1")
    registry.save_connection(con, "c2", SEALED, now)
    assert link_store.link_account(con, "s1", "act_1", "c2", "UTC", "USD", now).result == (
        LinkResult.LINKED
    )
    account = registry.get_account(con, "act_1")
    assert (account.connection_id, account.timezone, account.currency) == ("c2", "UTC", "USD")
    assert count(con, "ad_spend_daily") == count(con, "site_spend_daily") == 0


def test_unlinking_a_missing_link_is_refused(con, now, linked_account):
    site_store.add_site(con, "s2", None, now)
    with pytest.raises(RegistryError, match="site 's2' is not linked to act_1"):
        link_store.unlink_account(con, "s2", "act_1")
    with pytest.raises(ValueError):
        link_store.unlink_account(con, "s1", "act_one")
    assert count(con, "site_ad_accounts") == 1


def test_registry_calls_join_an_outer_transaction(con, now):
    from rastro_assets.warehouse.connection import transaction

    with pytest.raises(RuntimeError), transaction(con):
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", SEALED, now)
        link_store.link_account(con, "s1", "act_1", "c1", "UTC", "USD", now)
        raise RuntimeError("abandon the whole unit")
    for table in ("sites", "meta_connections", "meta_ad_accounts", "site_ad_accounts"):
        assert count(con, table) == 0


def test_sealed_tokens_are_read_by_connection_and_stored_back(con, now):
    registry.save_connection(con, "c2", b"two", now)
    registry.save_connection(con, "c1", b"one", now)
    assert registry.sealed_tokens(con) == [("c1", b"one"), ("c2", b"two")]

    later = now + timedelta(hours=1)
    registry.store_resealed_tokens(con, [("c2", b"TWO")], later)

    assert registry.sealed_tokens(con) == [("c1", b"one"), ("c2", b"TWO")]
    resealed = registry.get_connection(con, "c2")
    assert resealed.sealed_at == now  # the token's version: the same token
    updated = con.execute(
        "SELECT connection_id, updated_at FROM meta_connections ORDER BY connection_id"
    ).fetchall()
    assert updated == [("c1", now), ("c2", later)]

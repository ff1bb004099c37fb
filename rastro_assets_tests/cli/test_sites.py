"""`rastro site list`, `site rename` and `site remove`, on a real warehouse file."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
import wcwidth

from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import assert_usage_error

TOKYO = "東京の店 ☀️ 👨‍👩‍👧"
"""Double-width characters and two emoji drawn from several code points each."""


@pytest.fixture
def sites(warehouse: Warehouse, now: datetime) -> Warehouse:
    """bare (no name, nothing linked), s1 linking act_1 and act_2, tokyo linking nothing."""
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", "Site one", now)
        site_store.add_site(con, "tokyo", TOKYO, now + timedelta(minutes=5))
        site_store.add_site(con, "bare", None, now + timedelta(hours=1))
        registry.save_connection(con, "c1", b"\0" * 40, now)
        for account in ("act_1", "act_2"):
            link_store.link_account(con, "s1", account, "c1", "UTC", "USD", now)
    return warehouse


def stored(warehouse: Warehouse) -> dict[str, list[tuple]]:
    with warehouse.connect(read_only=True) as con:
        return {
            "sites": con.execute("SELECT * FROM sites ORDER BY site_id").fetchall(),
            "links": con.execute(
                "SELECT * FROM site_ad_accounts ORDER BY site_id, ad_account_id"
            ).fetchall(),
            "accounts": con.execute(
                "SELECT * FROM meta_ad_accounts ORDER BY ad_account_id"
            ).fetchall(),
        }


# list ---------------------------------------------------------------------------


@pytest.mark.engines("duckdb", "postgres")
def test_list_shows_each_site_aligned_in_terminal_columns(rastro, sites):
    code, out, err = rastro("site", "list")
    assert (code, err) == (0, "")
    # The name column is as wide as the Tokyo name draws: 14 terminal columns.
    assert wcwidth.wcswidth(TOKYO) == 14
    assert out.splitlines() == [
        "SITE   NAME            CREATED (UTC)     ACCOUNTS",
        "bare   -               2026-11-30 13:00  0",
        "s1     Site one        2026-11-30 12:00  2",
        f"tokyo  {TOKYO}  2026-11-30 12:05  0",
    ]


@pytest.mark.engines("duckdb", "postgres")
def test_list_json(rastro, sites):
    code, out, err = rastro("site", "list", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == [
        {"site_id": "bare", "name": None, "created_at": "2026-11-30T13:00:00+00:00",
         "linked_accounts": 0},
        {"site_id": "s1", "name": "Site one", "created_at": "2026-11-30T12:00:00+00:00",
         "linked_accounts": 2},
        {"site_id": "tokyo", "name": TOKYO, "created_at": "2026-11-30T12:05:00+00:00",
         "linked_accounts": 0},
    ]


def test_list_of_a_warehouse_without_sites(rastro, warehouse):
    assert rastro("site", "list") == (
        0, "no sites yet: `rastro site add SITE_ID --name NAME`\n", ""
    )
    assert rastro("site", "list", "--json") == (0, "[]\n", "")


# rename -------------------------------------------------------------------------


@pytest.mark.engines("duckdb", "postgres")
def test_rename(rastro, sites):
    assert rastro("site", "rename", "s1", " Shop one ") == (
        0, "site s1 renamed: Site one -> Shop one\n", ""
    )
    assert rastro("site", "rename", "bare", TOKYO) == (
        0, f"site bare renamed: (no name) -> {TOKYO}\n", ""
    )
    names = {site_id: name for site_id, name, _ in stored(sites)["sites"]}
    assert names == {"s1": "Shop one", "bare": TOKYO, "tokyo": TOKYO}


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("ghost", "Shop"), ("unknown site 'ghost'", "rastro site list")),
        (("s1", "  "), ("the new name is empty",)),
        (("s1", "Shop\x1b[31m"), ("control",)),
        (("s1", "x" * 201), ("201 characters long",)),
        (("s 1", "Shop"), ("site id 's 1' is not a valid id",)),
    ],
    ids=["unknown", "empty", "control", "too-long", "bad-id"],
)
def test_bad_renames_write_nothing(rastro, sites, args, fragments):
    before = stored(sites)
    assert_usage_error(rastro("site", "rename", *args), *fragments)
    assert stored(sites) == before


# remove -------------------------------------------------------------------------


def test_remove_a_site_that_links_nothing(rastro, sites):
    assert rastro("site", "remove", "bare") == (0, "site bare removed\n", "")
    assert [row[0] for row in stored(sites)["sites"]] == ["s1", "tokyo"]
    # Its id is free again.
    assert rastro("site", "add", "bare")[0] == 0


@pytest.mark.engines("duckdb", "postgres")
def test_remove_is_refused_while_the_site_links_accounts(rastro, sites):
    before = stored(sites)
    assert_usage_error(
        rastro("site", "remove", "s1"),
        "site 's1' still links 2 ad accounts (act_1, act_2)",
        "unlink each first with `rastro unlink s1 AD_ACCOUNT_ID`",
    )
    assert stored(sites) == before
    assert rastro("unlink", "s1", "act_1")[0] == 0
    assert_usage_error(
        rastro("site", "remove", "s1"),
        "site 's1' still links 1 ad account (act_2): unlink it first",
    )
    assert rastro("unlink", "s1", "act_2")[0] == 0
    assert rastro("site", "remove", "s1") == (0, "site s1 removed\n", "")
    assert stored(sites) == {
        "sites": [row for row in before["sites"] if row[0] != "s1"], "links": [], "accounts": []
    }


def test_remove_names_a_few_accounts_on_one_line(rastro, sites, now):
    with sites.connect() as con:
        for n in range(3, 10):
            link_store.link_account(con, "s1", f"act_{n}", "c1", "UTC", "USD", now)
    line = assert_usage_error(rastro("site", "remove", "s1"))
    assert "9 ad accounts (act_1, act_2, act_3, act_4, act_5 and 4 more)" in line


@pytest.mark.parametrize(
    ("site_id", "fragment"),
    [("ghost", "unknown site 'ghost'"), ("s/1", "is not a valid id")],
)
def test_bad_removes_write_nothing(rastro, sites, site_id, fragment):
    before = stored(sites)
    assert_usage_error(rastro("site", "remove", site_id), fragment)
    assert stored(sites) == before

"""`rastro shard` lists the shards and their accounts; `shard move` counts in plain English."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from rastro_assets import shards
from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import assert_usage_error
from rastro_assets_tests.defs.instance_events import add_run, record_spend

TWELVE = [f"act_{n}" for n in range(101, 113)]


@pytest.fixture
def spread(warehouse: Warehouse, duckdb_path: Path, now: datetime) -> Path:
    """Twelve accounts in shard 0, act_201 in shard 1, act_301 in shard 3 (declared by no
    setting below: an install that lowered RASTRO_ACCOUNT_SHARDS before moving it)."""
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        for account in [*TWELVE, "act_201", "act_301"]:
            link_store.link_account(con, "s1", account, "c1", "UTC", "USD", now)
        shard_store.set_account_shard(con, "act_201", 1)
        shard_store.set_account_shard(con, "act_301", 3)
    return duckdb_path


def stored_shards(path: Path) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT * FROM ad_account_shards ORDER BY ALL").fetchall()


def test_shard_lists_each_shard_its_assets_and_accounts(rastro, spread):
    code, out, err = rastro("shard", environ={"RASTRO_ACCOUNT_SHARDS": "2"})
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "SHARD           SPEND ASSETS                                      PARTITIONS"
        "               ACCOUNTS  IDS",
        "0               ad_spend_daily, site_spend_daily                  meta_ad_account"
        "          12        act_101, act_102, act_103, act_104, act_105, act_106, act_107,"
        " act_108, act_109, act_110 and 2 more",
        "1               ad_spend_daily_shard_1, site_spend_daily_shard_1  meta_ad_account_shard_1"
        "  1         act_201",
        "3 (undeclared)  ad_spend_daily_shard_3, site_spend_daily_shard_3  meta_ad_account_shard_3"
        "  1         act_301",
        "14 linked accounts over 2 shards (RASTRO_ACCOUNT_SHARDS=2)",
        "6 accounts to move to spread them evenly: `rastro shard move --dry-run` shows where",
    ]
    assert rastro("shard", "list", environ={"RASTRO_ACCOUNT_SHARDS": "2"}) == (code, out, err)


def test_shard_list_json_names_every_account(rastro, spread):
    code, out, err = rastro("shard", "list", "--json", environ={"RASTRO_ACCOUNT_SHARDS": "2"})
    assert (code, err) == (0, "")
    assert json.loads(out) == [
        {"shard": 0, "declared": True, "spend_assets": ["ad_spend_daily", "site_spend_daily"],
         "partitions": "meta_ad_account", "account_count": 12, "accounts": TWELVE},
        {"shard": 1, "declared": True,
         "spend_assets": ["ad_spend_daily_shard_1", "site_spend_daily_shard_1"],
         "partitions": "meta_ad_account_shard_1", "account_count": 1, "accounts": ["act_201"]},
        {"shard": 3, "declared": False,
         "spend_assets": ["ad_spend_daily_shard_3", "site_spend_daily_shard_3"],
         "partitions": "meta_ad_account_shard_3", "account_count": 1, "accounts": ["act_301"]},
    ]


def test_shard_of_an_empty_warehouse_lists_the_declared_shards(rastro, warehouse):
    assert rastro("shard") == (
        0,
        "SHARD  SPEND ASSETS                      PARTITIONS       ACCOUNTS  IDS\n"
        "0      ad_spend_daily, site_spend_daily  meta_ad_account  0         -\n"
        "0 linked accounts over 1 shard (RASTRO_ACCOUNT_SHARDS=1)\n",
        "",
    )


def test_a_crowded_shard_is_warned_of_beside_the_listing(rastro, spread):
    code, out, err = rastro("shard", environ={"RASTRO_SHARD_ACCOUNTS": "10"})
    assert code == 0 and out.startswith("SHARD ")
    [line] = err.splitlines()
    assert line.startswith("rastro: warning: ad_spend_daily holds 12 accounts, more than the 10")


def test_counts_are_said_in_the_right_number(rastro, warehouse, now):
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        link_store.link_account(con, "s1", "act_1", "c1", "UTC", "USD", now)
    assert rastro("shard", "move", "--dry-run") == (
        0, "nothing to move: 1 account over 1 shard\n", ""
    )
    assert rastro("shard", "move", "--dry-run", environ={"RASTRO_ACCOUNT_SHARDS": "2"}) == (
        0, "nothing to move: 1 account over 2 shards\n", ""
    )
    assert rastro("shard")[1].splitlines()[-1] == (
        "1 linked account over 1 shard (RASTRO_ACCOUNT_SHARDS=1)"
    )


def test_a_dry_run_prints_the_moves_and_stores_nothing(rastro, spread):
    before = stored_shards(spread)
    code, out, err = rastro("shard", "move", "--dry-run", environ={"RASTRO_ACCOUNT_SHARDS": "2"})
    assert (code, err) == (0, "")
    moves = out.splitlines()
    assert len(moves) == 6
    assert "act_301: ad_spend_daily_shard_3 -> ad_spend_daily_shard_1" in moves
    assert stored_shards(spread) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("shard", "spread"), "invalid choice"),
        (("shard", "list", "--all"), "unrecognized arguments"),
        (("shard", "--json"), "unrecognized arguments"),
    ],
)
def test_bad_shard_inputs_are_one_line(rastro, spread, args, fragment):
    before = stored_shards(spread)
    assert_usage_error(rastro(*args), fragment)
    assert stored_shards(spread) == before


MOVED_DAYS = ["2026-11-28", "2026-11-29", "2026-11-30"]


@pytest.mark.engines("duckdb", "postgres")
def test_a_move_stores_each_new_shard_and_moves_its_partitions(
    rastro, warehouse, now, tmp_path, monkeypatch
):
    accounts = ["act_1", "act_2", "act_3", "act_4"]
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        for account in accounts:
            link_store.link_account(con, "s1", account, "c1", "UTC", "USD", now)
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), accounts)
        add_run(instance, "r1")
        record_spend(instance, "r1", [f"{a}|{day}" for a in accounts for day in MOVED_DAYS])
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    environ = {"DAGSTER_HOME": str(home), "RASTRO_ACCOUNT_SHARDS": "2"}

    code, out, err = rastro("shard", "move", environ=environ)
    assert (code, err) == (0, ""), err
    assert out.splitlines()[-1] == "moved 2 accounts"
    with warehouse.connect(read_only=True) as con:
        assert shard_store.account_shards(con) == {
            "act_1": 0, "act_2": 0, "act_3": 1, "act_4": 1
        }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert sorted(instance.get_dynamic_partitions(shards.accounts_name(1))) == [
            "act_3", "act_4"
        ]
        assert instance.get_materialized_partitions(dg.AssetKey(shards.ad_spend_name(1))) == {
            f"{a}|{day}" for a in ("act_3", "act_4") for day in MOVED_DAYS
        }
    code, out, err = rastro("shard", "move", environ=environ)
    assert (code, out) == (0, "nothing to move: 4 accounts over 2 shards\n"), err

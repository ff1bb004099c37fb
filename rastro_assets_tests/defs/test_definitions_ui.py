"""What a Dagster user sees of the definitions: schemas, table names, kinds, lineage, health."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

import dagster as dg
import pytest

from rastro_assets.defs.account_health import freshness_evaluation
from rastro_assets.defs.cadence.health import health_metadata
from rastro_assets.planner.history import planned_accounts
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.runs import SyncRunEnd
from rastro_assets_tests.conftest import NOW, record_sync_run
from rastro_assets_tests.defs.conftest import TODAY

WAREHOUSE_ASSETS = ["ad_spend_daily", "site_spend_daily", "ad_catalog", "ad_thumbnails"]
EXTERNAL_TABLES = [
    "sites",
    "meta_connections",
    "meta_ad_accounts",
    "site_ad_accounts",
    "lead_daily_rollups",
]


@pytest.fixture(scope="module")
def graph():
    from rastro_assets.definitions import defs

    return defs.resolve_asset_graph()


def columns(graph, table: str) -> dict[str, dg.TableColumn]:
    schema = graph.get(dg.AssetKey(table)).metadata["dagster/column_schema"]
    return {column.name: column for column in schema.columns}


@pytest.mark.parametrize("table", WAREHOUSE_ASSETS + EXTERNAL_TABLES)
def test_every_duckdb_asset_names_its_table_and_columns(graph, warehouse, table):
    node = graph.get(dg.AssetKey(table))
    assert node.metadata["dagster/table_name"] == f"main.{table}"
    with warehouse.connect() as con:
        ddl = con.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = ? ORDER BY ordinal_position",
            [table],
        ).fetchall()
    assert [(c.name, c.type) for c in columns(graph, table).values()] == ddl


def test_day_and_spend_say_what_they_mean(graph):
    for table in ("ad_spend_daily", "site_spend_daily"):
        found = columns(graph, table)
        assert found["spend"].type == "DECIMAL(18,4)"
        assert "currency" in found["spend"].description
        assert "local calendar date" in found["day"].description
        assert not found["day"].constraints.nullable


def test_assets_read_from_meta_say_so(graph):
    for table in WAREHOUSE_ASSETS:
        assert graph.get(dg.AssetKey(table)).kinds == {"meta", "duckdb"}


def test_the_tables_the_pipeline_only_reads_are_external_upstreams(graph):
    for table in EXTERNAL_TABLES:
        assert not graph.get(dg.AssetKey(table)).is_materializable
    catalog_parents = graph.get(dg.AssetKey("ad_catalog")).parent_keys
    for table in ("lead_daily_rollups", "meta_ad_accounts", "meta_connections"):
        assert dg.AssetKey(table) in catalog_parents
    # An upstream adds tags to each of its downstream's events: the per-day assets have none.
    assert graph.get(dg.AssetKey("ad_spend_daily")).parent_keys == set()


def test_health_is_one_table_and_a_paused_account_is_an_error(warehouse, linked_world):
    with warehouse.connect() as con:
        for account in ("act_101", "act_202"):  # backfilled four hours ago
            record_sync_run(con, f"b-{account}", account, "backfill",
                            TODAY - timedelta(days=89), TODAY, NOW - timedelta(hours=4))
        record_sync_run(
            con, "r1", "act_101", "live", TODAY, TODAY, NOW - timedelta(minutes=10)
        )
        fresh = freshness_evaluation(planned_accounts(con), NOW)
        [sealed_at] = con.execute(
            "SELECT sealed_at FROM meta_connections WHERE connection_id = 'c1'"
        ).fetchone()
        registry.mark_connection_invalid(
            con, "c1", "META_TOKEN_INVALID: expired", NOW, token_sealed_at=sealed_at
        )
        paused = freshness_evaluation(planned_accounts(con), NOW)

    assert fresh.severity == dg.AssetCheckSeverity.WARN and not fresh.passed
    rows = {row.data["ad_account_id"]: row.data for row in fresh.metadata["health"].records}
    assert rows.keys() == {"act_101", "act_202"}
    assert rows["act_101"]["today_fresh"] and not rows["act_202"]["today_fresh"]
    assert rows["act_101"]["last_good_sync"].startswith(f"{TODAY}T")
    schema = fresh.metadata["health"].schema
    assert [column.name for column in schema.columns] == [
        "ad_account_id", "state", "today_fresh", "last_good_sync", "next_due", "backfill",
        "last_error", "meta_usage_pct", "rate_limit", "held_until",
    ]

    assert paused.severity == dg.AssetCheckSeverity.ERROR and not paused.passed
    assert paused.metadata["paused_accounts"].value == 2
    states = [row.data["state"] for row in paused.metadata["health"].records]
    assert states == ["paused", "paused"]
    assert all(row.data["last_error"].startswith("META_TOKEN_INVALID")
               for row in paused.metadata["health"].records)


def test_health_says_which_limit_holds_an_account_and_until_when(warehouse, linked_world):
    """act_101 was refused by its own ad account score; act_202's good sync saw the app's
    load at 95 % and its own share at 3 %: slowed, never held. Both after the token was
    sealed (at NOW)."""
    ended, at = NOW + timedelta(minutes=2), NOW + timedelta(minutes=3)
    with warehouse.connect() as con:
        for account in ("act_101", "act_202"):
            record_sync_run(con, f"b-{account}", account, "backfill",
                            TODAY - timedelta(days=89), TODAY, NOW - timedelta(hours=4))
        for run_id, account, end in (
            ("r1", "act_101", SyncRunEnd(
                ended, "throttled", error="RATE_LIMITED: (#17) User request limit reached",
                usage_pct=100.0, regain_at=ended + timedelta(minutes=5),
                rate_limit="ad_account_score", account_usage_pct=100.0)),
            ("r2", "act_202", SyncRunEnd(ended, "ok", usage_pct=95.0, account_usage_pct=3.0)),
        ):
            record_sync_run(con, run_id, account, "live", TODAY - timedelta(days=1), TODAY,
                            NOW + timedelta(minutes=1), end=end)
        accounts = planned_accounts(con)
    wide = {row.data["ad_account_id"]: row.data
            for row in freshness_evaluation(accounts, at).metadata["health"].records}
    held_until = datetime.fromisoformat(wide["act_101"]["held_until"])
    assert ended + timedelta(minutes=5) <= held_until <= ended + timedelta(minutes=6)
    assert wide["act_101"]["rate_limit"] == "ad_account_score"
    assert wide["act_101"]["last_error"].startswith("RATE_LIMITED: (#17)")
    assert (wide["act_202"]["state"], wide["act_202"]["meta_usage_pct"]) == ("live", 95.0)
    assert (wide["act_202"]["rate_limit"], wide["act_202"]["held_until"]) == ("", "")
    assert wide["act_202"]["last_error"] == ""

    metadata, _, _ = health_metadata(accounts, at)
    narrow = {row.data["account"]: row.data for row in metadata["health"].records}
    assert narrow["act_101"]["due"] == f"{held_until:%m-%d %H:%M}, held by ad_account_score"
    assert "held" not in narrow["act_202"]["due"] and "RATE_LIMITED" not in str(narrow["act_202"])


def test_the_tables_kind_is_the_warehouse_engine_of_the_environment(tmp_path):
    """A warehouse on PostgreSQL shows as such: the UI never calls its tables DuckDB's."""
    shown = """
import json, dagster as dg
from rastro_assets.definitions import defs
graph = defs.resolve_asset_graph()
node = graph.get(dg.AssetKey("ad_spend_daily"))
print(json.dumps([sorted(node.kinds), node.metadata["dagster/table_name"],
                  sorted(graph.get(dg.AssetKey("sites")).kinds)]))
"""
    env = {
        **os.environ,
        "RASTRO_WAREHOUSE_URL": "postgresql://rastro:hunter2@db.invalid:5432/rastro",
        "RASTRO_DUCKDB_PATH": str(tmp_path / "unused.duckdb"),
    }
    answer = subprocess.run(
        [sys.executable, "-c", shown], env=env, capture_output=True, text=True, timeout=120
    )
    assert answer.returncode == 0, answer.stderr[-2000:]
    kinds, table_name, site_kinds = json.loads(answer.stdout.strip().splitlines()[-1])
    assert kinds == ["meta", "postgres"] and site_kinds == ["postgres"]
    assert table_name == "ad_spend_daily"
    assert "hunter2" not in answer.stdout + answer.stderr

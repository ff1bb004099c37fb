"""Retention deletes superseded runs and never a partition's latest materialization."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from rastro_assets.defs.partitions import ACCOUNT_PARTITIONS_NAME, spend_partition_key
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.retention import delete_superseded_runs
from rastro_assets.defs.spend_assets import AD_SPEND_DAILY, meta_spend
from rastro_assets.warehouse.retention import prune_sync_runs
from rastro_assets.warehouse.runs import SyncRunEnd, finish_sync_run, start_sync_run
from rastro_assets_tests.conftest import NOW

TODAY = date(2026, 11, 30)


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        instance.add_dynamic_partitions(ACCOUNT_PARTITIONS_NAME, ["act_101"])
        yield instance


def materialize(instance, rastro, day: date) -> str:
    result = dg.materialize(
        [meta_spend],
        instance=instance,
        resources={"rastro": rastro},
        partition_key=str(spend_partition_key("act_101", day)),
    )
    return result.run_id


def test_only_superseded_runs_are_deleted(
    instance, duckdb_path, fake_graph, linked_world, secrets_key
):
    rastro = RastroResource(
        duckdb_path=str(duckdb_path), graph_url=fake_graph.base_url, fixed_now=NOW.isoformat()
    )
    first_today = materialize(instance, rastro, TODAY)
    only_yesterday = materialize(instance, rastro, TODAY - timedelta(days=1))
    latest_today = materialize(instance, rastro, TODAY)

    deleted = delete_superseded_runs(instance, datetime.now(UTC) + timedelta(minutes=1), limit=100)

    assert deleted == 1
    assert instance.get_run_by_id(first_today) is None
    assert instance.get_run_by_id(only_yesterday) is not None
    assert instance.get_run_by_id(latest_today) is not None
    assert instance.get_materialized_partitions(AD_SPEND_DAILY) == {
        f"act_101|{TODAY}",
        f"act_101|{TODAY - timedelta(days=1)}",
    }


def test_recent_runs_are_kept(instance, duckdb_path, fake_graph, linked_world, secrets_key):
    rastro = RastroResource(
        duckdb_path=str(duckdb_path), graph_url=fake_graph.base_url, fixed_now=NOW.isoformat()
    )
    materialize(instance, rastro, TODAY)
    materialize(instance, rastro, TODAY)
    assert delete_superseded_runs(instance, datetime.now(UTC) - timedelta(hours=1), 100) == 0


def record(con, run_id, kind, started_at, outcome="ok"):
    start_sync_run(
        con,
        run_id=run_id,
        ad_account_id="act_1",
        kind=kind,
        since=TODAY,
        until=TODAY,
        started_at=started_at,
        catalog=False,
        token_sealed_at=None,
    )
    finish_sync_run(
        con,
        run_id=run_id,
        ad_account_id="act_1",
        end=SyncRunEnd(finished_at=started_at + timedelta(seconds=3), outcome=outcome),
    )


def test_sync_run_pruning_keeps_what_the_planner_needs(con, linked_account):
    old = NOW - timedelta(days=100)
    record(con, "backfill", "backfill", old)
    record(con, "old-live", "live", old + timedelta(days=1))
    record(con, "old-failure", "live", old + timedelta(days=2), outcome="other")
    record(con, "last-ok", "live", old + timedelta(days=3))
    record(con, "recent-failure", "live", NOW - timedelta(days=1), outcome="throttled")

    assert prune_sync_runs(con, NOW - timedelta(days=35)) == 2
    kept = {row[0] for row in con.execute("SELECT run_id FROM meta_sync_runs").fetchall()}
    assert kept == {"backfill", "last-ok", "recent-failure"}


def test_pruning_a_steady_history_does_not_make_a_gap(con, linked_account):
    from rastro_assets import cadence
    from rastro_assets.warehouse.runs import planned_accounts

    con.execute("UPDATE meta_ad_accounts SET created_at = ?", [NOW - timedelta(days=100)])
    record(con, "backfill", "backfill", NOW - timedelta(days=100))
    for day in range(99, 0, -1):
        started = NOW - timedelta(days=day)
        record(con, f"daily-{day}", "daily", started)
        record(con, f"live-{day}", "live", started + timedelta(hours=1))
    [before] = planned_accounts(con)
    prune_sync_runs(con, NOW - timedelta(days=35))
    [after] = planned_accounts(con)
    assert cadence.plan(after.state, NOW).kind == cadence.plan(before.state, NOW).kind != "gap"

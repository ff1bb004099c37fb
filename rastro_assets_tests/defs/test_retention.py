"""Retention deletes superseded runs and never a partition's latest materialization.

The pruning of `meta_sync_runs` the same sensor does is tested in `planner/test_retention.py`.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import dagster as dg

from rastro_assets.defs.partitions import spend_partition_key
from rastro_assets.defs.retention import delete_superseded_runs
from rastro_assets.defs.spend_assets import AD_SPEND_DAILY, meta_spend
from rastro_assets_tests.defs.conftest import TODAY


def materialize(instance, rastro, day: date) -> str:
    result = dg.materialize(
        [meta_spend],
        instance=instance,
        resources={"rastro": rastro},
        partition_key=str(spend_partition_key("act_101", day)),
    )
    return result.run_id


def test_only_superseded_runs_are_deleted(instance, rastro):
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


def test_recent_runs_are_kept(instance, rastro):
    materialize(instance, rastro, TODAY)
    materialize(instance, rastro, TODAY)
    assert delete_superseded_runs(instance, datetime.now(UTC) - timedelta(hours=1), 100) == 0

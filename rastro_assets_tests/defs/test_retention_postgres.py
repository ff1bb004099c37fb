"""Retention on Postgres instance storage (`docs/dagster.scaled.yaml`), on a real server.

The same rules as on SQLite (`test_retention.py`), and a statement Postgres can answer from
Dagster's index: it never uses an index for `IS NOT DISTINCT FROM`, and a tick that compared
partitions that way scanned every newer event for each old one (minutes at 200 accounts).
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.events import StepMaterializationData

from rastro_assets.defs.retention import _superseded_ids, prune_instance
from rastro_assets_tests.defs.instance_events import add_run, record_spend, spend_events
from rastro_assets_tests.postgres_server import postgres_server

REPO = Path(__file__).resolve().parents[2]
DAY_1, DAY_2 = "act_101|2026-11-28", "act_101|2026-11-29"
SNAPSHOT = dg.AssetKey("analytics_snapshot")


@pytest.fixture
def postgres_instance(tmp_path, monkeypatch) -> Iterator[dg.DagsterInstance]:
    scaled = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    with postgres_server() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        config = {"storage": scaled["storage"], "telemetry": {"enabled": False}}
        (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
        with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
            yield instance


def soon() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=1)


def snapshot_runs(instance) -> list[str]:
    records = instance.fetch_materializations(SNAPSHOT, limit=100, ascending=True).records
    return [record.run_id for record in records]


def test_each_partition_and_each_unpartitioned_asset_keeps_its_newest_event(postgres_instance):
    instance = postgres_instance
    for run, days in (("wave_1", [DAY_1, DAY_2]), ("wave_2", [DAY_2])):
        add_run(instance, run)
        record_spend(instance, run, days, planned=True)
        instance.report_dagster_event(
            dg.DagsterEvent(
                event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
                job_name="__ASSET_JOB",
                event_specific_data=StepMaterializationData(
                    dg.AssetMaterialization(asset_key=SNAPSHOT)
                ),
            ),
            run_id=run,
        )
    add_run(instance, "failed", status=dg.DagsterRunStatus.FAILURE)
    record_spend(instance, "failed", [DAY_1], planned=True, materialized=False)

    tick = prune_instance(instance, soon())

    assert spend_events(instance) == [(DAY_1, "wave_1"), (DAY_2, "wave_2")]
    assert spend_events(instance, planned=True) == [(DAY_1, "failed")]
    assert snapshot_runs(instance) == ["wave_2"]
    # wave_1's DAY_2 (both assets), the planned events materialized since, its snapshot.
    assert tick.events_deleted == 2 + 6 + 1
    assert tick.runs_deleted == 0


def test_the_superseded_events_are_found_through_an_index(postgres_instance):
    instance = postgres_instance
    add_run(instance, "wave_1")
    record_spend(instance, "wave_1", [DAY_1])
    statement = _superseded_ids(0, 10**9, datetime(2100, 1, 1))
    with instance.event_log_storage.index_connection() as conn:
        compiled = statement.compile(conn, compile_kwargs={"literal_binds": True})
        conn.exec_driver_sql("SET enable_seqscan = off")
        plan = [row[0] for row in conn.exec_driver_sql(f"EXPLAIN {compiled}")]
    # Each partitioned lookup (materialization, observation, planned) seeks its partition in
    # the index instead of filtering every newer event of the asset.
    seeks = [line for line in plan if "Index Cond" in line and
             "(partition = event_logs.partition)" in line]
    assert len(seeks) == 3, "\n".join(plan)

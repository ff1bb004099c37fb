"""What the Dagster UI shows a new user after the first backfills, asked through its own GraphQL.

The backfills are driven as the daemons would: `meta_accounts` makes the
partitions and the backfill, each 30-day range of it runs the spend assets with
the checks Dagster adds to an asset run, and `meta_cadence` ticks between the
runs, its check evaluations reported as the sensor daemon reports them. The
answers then come from the webserver's schema over a workspace of the real
definitions.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_graphql.test.utils import execute_dagster_graphql

from rastro_assets import shards
from rastro_assets.defs.cadence.incidents import build_meta_incidents_sensor
from rastro_assets.defs.cadence.sensors import build_meta_accounts_sensor, build_meta_cadence_sensor
from rastro_assets.defs.keys import FILL_ACCOUNTS_PER_RUN
from rastro_assets.defs.spend.fill import build_spend_fill

meta_incidents_sensor = build_meta_incidents_sensor()
meta_accounts_sensor = build_meta_accounts_sensor(1)
meta_cadence_sensor = build_meta_cadence_sensor(1)

REPO = Path(__file__).resolve().parents[2]

ASSET_QUERY = """
query AssetTruth($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      partitionStats { numMaterialized numPartitions numFailed }
      assetMaterializations(limit: 1) { partition metadataEntries { ...Int } }
      assetObservations(limit: 1) { metadataEntries { ...Int } }
      targetingInstigators { ... on Sensor { name } ... on Schedule { name } }
      assetChecksOrError {
        ... on AssetChecks {
          checks {
            name
            executionForLatestMaterialization {
              status
              evaluation { description severity }
            }
            partitionStatuses {
              ... on AssetCheckDefaultPartitionStatuses { ...Lists }
              ... on AssetCheckMultiPartitionStatuses {
                ranges {
                  secondaryDim {
                    ... on AssetCheckDefaultPartitionStatuses { ...Lists }
                    ... on AssetCheckTimePartitionStatuses { ranges { status } }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

fragment Int on MetadataEntry {
  label
  ... on IntMetadataEntry { intValue }
}

fragment Lists on AssetCheckDefaultPartitionStatuses {
  succeededPartitions
  failedPartitions
  inProgressPartitions
  skippedPartitions
  executionFailedPartitions
}
"""

HEALTH_QUERY = """
query Health($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      isMaterializable
      targetingInstigators { ... on Sensor { name } }
      assetMaterializations(limit: 1) {
        metadataEntries {
          label
          ... on TableMetadataEntry { table { records schema { columns { name } } } }
        }
      }
    }
  }
}
"""
# The overview shows the health table in its Metadata table's value column, about 460 px at
# 1440 px, where no column is narrower than its longest unbroken word (~7.3 px a character,
# plus ~13 px of padding): headers of at most 8 characters and values that break at spaces
# keep six columns within it.
MAX_HEALTH_HEADER_CHARS = 8
MAX_HEALTH_WORD_CHARS = 11

PARTITION_QUERY = """
query PartitionEvent($assetKey: AssetKeyInput!, $partition: String!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      assetMaterializations(partitions: [$partition], limit: 1) {
        partition
        metadataEntries { label }
      }
    }
  }
}
"""

LIST_STATUS = {
    "failedPartitions": "FAILED",
    "executionFailedPartitions": "EXECUTION_FAILED",
    "inProgressPartitions": "IN_PROGRESS",
    "skippedPartitions": "SKIPPED",
    "succeededPartitions": "SUCCEEDED",
}


@pytest.fixture
def account_partitions() -> list[str]:
    return []  # the sensor makes them


@contextmanager
def ui(instance):
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            module_name="rastro_assets.definitions",
            attribute="defs",
            working_directory=str(REPO),
        ),
        location_name="rastro_assets",
    )
    # The partitioned check's statuses resolve its dynamic accounts through a loading context
    # that `execute_dagster_graphql` does not set up as the webserver's request does.
    with (
        WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget([origin])) as process,
        partition_loading_context(dynamic_partitions_store=instance),
    ):
        yield process.create_request_context()


def check_statuses(check: dict) -> set[str]:
    """Every status the checks list aggregates for a partitioned check (`util.tsx`)."""
    found: set[str] = set()
    statuses = check["partitionStatuses"] or {}
    lists = [statuses] if "succeededPartitions" in statuses else []
    for row in statuses.get("ranges", []):
        second = row["secondaryDim"]
        if "ranges" in second:
            found |= {status["status"] for status in second["ranges"]}
        else:
            lists.append(second)
    for entry in lists:
        found |= {status for field, status in LIST_STATUS.items() if entry.get(field)}
    return found


def overview_row_count(node: dict) -> int | None:
    """The row count the asset's overview shows (`AssetNodeOverview.tsx`, findCanonicalIntMeta):
    the latest materialization's `dagster/row_count`, else the latest observation's."""
    for events in (node["assetMaterializations"], node["assetObservations"]):
        for entry in events[0]["metadataEntries"] if events else []:
            if entry["label"] == "dagster/row_count" and "intValue" in entry:
                return entry["intValue"]
    return None


def tick(sensor, instance, rastro, cursor=None):
    from rastro_assets.definitions import defs

    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}, cursor=cursor
    )
    result = sensor(context)
    for event in getattr(result, "asset_events", None) or []:
        instance.report_runless_asset_event(event)
    return result


def run_backfill(instance, rastro, request, on_each_run) -> None:
    """The fill backfill's runs as Dagster cuts them (25 accounts a run), in order."""
    [fill] = request.asset_graph_subset.asset_keys
    accounts = sorted(request.asset_graph_subset.get_partitions_subset(fill).get_partition_keys())
    for first in range(0, len(accounts), FILL_ACCOUNTS_PER_RUN):
        chunk = accounts[first : first + FILL_ACCOUNTS_PER_RUN]
        result = dg.materialize(
            [build_spend_fill(0, 1)],
            instance=instance,
            resources={"rastro": rastro},
            tags={
                **request.tags,
                "dagster/backfill": "first-backfills",
                "dagster/asset_partition_range_start": chunk[0],
                "dagster/asset_partition_range_end": chunk[-1],
            },
        )
        assert result.success
        on_each_run()


def test_after_first_backfills_every_asset_holding_rows_is_materialized_and_no_check_failed(
    instance, rastro, warehouse
):
    from rastro_assets.definitions import defs

    cadence = tick(meta_cadence_sensor, instance, rastro)
    accounts = tick(meta_accounts_sensor, instance, rastro)
    for change in accounts.dynamic_partitions_requests:
        instance.add_dynamic_partitions(change.partitions_def_name, change.partition_keys)
    [backfill] = accounts.run_requests
    cursor = [cadence.cursor]

    def cadence_tick():
        cursor[0] = tick(meta_cadence_sensor, instance, rastro, cursor[0]).cursor
        # The daemon's incident check follows the health the cadence records.
        tick(meta_incidents_sensor, instance, rastro)

    run_backfill(instance, rastro, backfill, cadence_tick)

    with warehouse.connect(read_only=True) as con:
        held = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("ad_spend_daily", "site_spend_daily", "ad_catalog", "ad_thumbnails")
        }
    assert all(held.values()), held

    graph = defs.resolve_asset_graph()
    with ui(instance) as context:
        for key in sorted(graph.materializable_asset_keys):
            name = key.to_user_string()
            answer = execute_dagster_graphql(context, ASSET_QUERY, {"assetKey": {"path": key.path}})
            assert not answer.errors, answer.errors
            node = answer.data["assetNodeOrError"]
            if held.get(name):
                stats = node["partitionStats"]
                assert stats["numMaterialized"] > 0, f"{name} reads as never materialized"
                assert stats["numFailed"] == 0, name
            if name in held:
                # The overview shows its latest materialization's row count and metadata as the
                # asset's: the whole table's, on an event of no partition, never one partition's
                # (a backfill's runs report the spend pair's runless, naming the run).
                assert overview_row_count(node) == held[name], name
                [latest] = node["assetMaterializations"]
                assert latest["partition"] is None, (name, latest["partition"])
                labels = {entry["label"] for entry in latest["metadataEntries"]}
                assert "accounts" in labels, (name, labels)
                assert not [label for label in labels if label.startswith("day_")], (name, labels)
            if name in ("ad_spend_daily", "site_spend_daily"):
                # Each partition keeps its own figures on its own event.
                partition = sorted(instance.get_materialized_partitions(key))[-1]
                answer = execute_dagster_graphql(
                    context,
                    PARTITION_QUERY,
                    {"assetKey": {"path": key.path}, "partition": partition},
                )
                [own] = answer.data["assetNodeOrError"]["assetMaterializations"]
                assert own["partition"] == partition
                own_labels = {entry["label"] for entry in own["metadataEntries"]}
                assert [label for label in own_labels if label.startswith("day_spend_")], own
            for check in node["assetChecksOrError"]["checks"]:
                latest = check["executionForLatestMaterialization"]
                assert latest, (name, check)
                shown = check_statuses(check) or {latest["status"]}
                assert shown == {"SUCCEEDED"}, (name, check["name"], shown)
                assert latest["status"] == "SUCCEEDED", (name, check["name"], latest)
                assert latest["evaluation"]["description"], (name, check["name"])

        # The per-account view: the health asset's latest materialization (so the overview
        # never reads "Never materialized"), its table one row each, narrow enough to fit.
        answer = execute_dagster_graphql(
            context, HEALTH_QUERY, {"assetKey": {"path": ["meta_account_health"]}}
        )
        health = answer.data["assetNodeOrError"]
        assert health["isMaterializable"]
        assert {"meta_cadence"} <= {sensor["name"] for sensor in health["targetingInstigators"]}
        [recorded] = health["assetMaterializations"]
        [table] = [
            entry["table"] for entry in recorded["metadataEntries"] if entry["label"] == "health"
        ]
        headers = [column["name"] for column in table["schema"]["columns"]]
        assert headers == ["account", "state", "synced", "due", "backfill", "error"]
        assert max(map(len, headers)) <= MAX_HEALTH_HEADER_CHARS
        rows = {row["account"]: row for row in map(json.loads, table["records"])}
        assert {account: row["state"] for account, row in rows.items()} == {
            "act_101": "live",
            "act_202": "live",
        }
        for row in rows.values():
            assert row["synced"] and row["due"], row
            words = [word for key, value in row.items() if key != "account"
                     for word in str(value).split()]
            assert max(map(len, words)) <= MAX_HEALTH_WORD_CHARS, row

    # The last block of each account's backfill read its whole catalog.
    assert instance.get_materialized_partitions(dg.AssetKey("ad_catalog")) == {
        "act_101",
        "act_202",
    }
    assert instance.get_materialized_partitions(dg.AssetKey("ad_thumbnails")) == {
        "act_101",
        "act_202",
    }


def test_the_automation_panel_names_the_sensors_that_keep_each_asset_fresh(instance):
    with ui(instance) as context:
        for name, sensors in (
            ("ad_spend_daily", {"meta_accounts", "meta_cadence"}),
            ("site_spend_daily", {"meta_accounts", "meta_cadence"}),
            ("ad_catalog", {"meta_cadence"}),
            ("ad_thumbnails", {"meta_cadence"}),
            ("meta_account_health", {"meta_cadence"}),
        ):
            answer = execute_dagster_graphql(context, ASSET_QUERY, {"assetKey": {"path": [name]}})
            node = answer.data["assetNodeOrError"]
            found = {instigator["name"] for instigator in node["targetingInstigators"]}
            assert sensors <= found, (name, found)



@pytest.mark.parametrize("selected", ["ad_spend_daily", "site_spend_daily"])
def test_a_ui_backfill_of_one_spend_asset_leaves_every_check_of_both_evaluated(
    instance, rastro, selected
):
    """A range run that selects one spend asset writes both: the other's checks, which Dagster
    runs only for selected assets, are evaluated by the run itself."""
    from rastro_assets.definitions import defs
    from rastro_assets.defs.partitions import spend_partition_key
    from rastro_assets.defs.spend.assets import build_meta_spend
    from rastro_assets.defs.spend.checks import build_freshness_check, build_sum_check
    from rastro_assets_tests.defs.conftest import TODAY
    meta_spend = build_meta_spend(0, 1)
    accounts_fresh = build_freshness_check(0, 1)
    site_spend_equals_ad_sums = build_sum_check(0)

    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202"])
    since = TODAY - timedelta(days=2)
    result = dg.materialize(
        [meta_spend, site_spend_equals_ad_sums, accounts_fresh],
        selection=[selected],
        instance=instance,
        resources={"rastro": rastro},
        tags={
            "dagster/backfill": "ui-backfill",
            "dagster/asset_partition_range_start": str(spend_partition_key("act_202", since)),
            "dagster/asset_partition_range_end": str(spend_partition_key("act_202", TODAY)),
        },
    )
    assert result.success
    graph = defs.resolve_asset_graph()
    with ui(instance) as context:
        for name in ("ad_spend_daily", "site_spend_daily"):
            key = dg.AssetKey(name)
            assert instance.get_materialized_partitions(key), name
            answer = execute_dagster_graphql(context, ASSET_QUERY, {"assetKey": {"path": [name]}})
            assert not answer.errors, answer.errors
            checks = answer.data["assetNodeOrError"]["assetChecksOrError"]["checks"]
            assert {c["name"] for c in checks} == {
                check.name for check in graph.asset_check_keys if check.asset_key == key
            }
            for check in checks:
                latest = check["executionForLatestMaterialization"]
                assert latest, (selected, name, check["name"], "reads Not evaluated")
                shown = check_statuses(check) or {latest["status"]}
                assert shown == {"SUCCEEDED"}, (selected, name, check["name"], shown)

"""The UI's partition backfill dialog on the spend assets of an install with several shards.

"Materialize..." on a shard's spend asset opens `LaunchAssetChoosePartitionsDialog`; its
"Launch backfill" sends the `LaunchPartitionBackfill` mutation. Here that is done word for
word: the operations are the UI's own, read from the installed dagster-webserver bundle's
source maps (`bench/_ui.py` extracts them), the variables are built as the dialog's
`onLaunchAsBackfill` builds them, and both run on the webserver's schema over a workspace
that loads the code location with three shards (`build_defs(3)`, what
`RASTRO_ACCOUNT_SHARDS=3` loads; the e2e test of three shards covers the setting itself).
One iteration of Dagster's backfill daemon then creates the runs, and the instance's run
coordinator is the shipped one (`dagster.yaml`'s `run_coordinator` and `concurrency`).

The dialog opens from two places, and they launch different kinds of backfill:

- the asset's page: the asset's first job is `__ASSET_JOB`, a hidden asset job, so the
  dialog sends a pure asset backfill (`assetSelection` and `partitionNames`);
- the page of the shard's job, `meta_spend_shard_1_sync`: the dialog sends a job backfill
  (a `selector` naming `meta_spend_shard_1_sync_partition_set`). Dagster gives each of its
  30-day range runs the dimension tags of one partition, and a run reads those before its
  range: each would sync that one account-day. The queue refuses those runs.

A partition of another shard's account is no partition of shard 1's asset: the mutation
answers `PartitionKeysNotFoundError` and launches nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._utils.tags import TagConcurrencyLimitsCounter
from dagster_graphql.test.utils import execute_dagster_graphql

from rastro_assets import shards
from rastro_assets.definitions import build_defs
from rastro_assets.defs.keys import ACCOUNT_TAG, MAX_DAYS_PER_RUN
from rastro_assets.defs.partitions import spend_shard
from rastro_assets.instance.run_queue import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    AccountRunCoordinator,
    run_account,
    stray_partition,
)

REPO = Path(__file__).resolve().parents[2]
LOCATION = "rastro_assets"
SHARDS = 3
SHARD_ACCOUNTS = {1: ["act_101", "act_303"], 2: ["act_202"]}
ACCOUNT = "act_101"  # of shard 1, beside act_303
ELSEWHERE = "act_202"  # of shard 2
FIRST, LAST = date(2026, 10, 16), date(2026, 11, 29)  # 45 days: a 30-day run and a 15-day run
UI_OPERATIONS = ("LaunchAssetLoaderQuery", "PartitionHealthQuery", "LaunchPartitionBackfill")
FROM_UI = {"key": "dagster/from_ui", "value": "true"}  # uiExecutionTags.tsx, UI_EXECUTION_TAGS


@dg.definitions
def three_shards() -> dg.Definitions:
    """The code location as `RASTRO_ACCOUNT_SHARDS=3` loads it."""
    return build_defs(SHARDS)


@functools.cache
def ui_operations() -> tuple[dict[str, str], dict[str, str]]:
    """(operation -> text with its fragments, operation -> UI source file), from the bundle."""
    spec = importlib.util.spec_from_file_location("bench_ui", REPO / "bench" / "_ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts, files, notes = module.extract_operations(UI_OPERATIONS)
    assert set(texts) == set(UI_OPERATIONS), notes
    return texts, files


def ask(process: WorkspaceProcessContext, name: str, variables: dict) -> dict:
    """One of the UI's operations, on the webserver's schema, in a fresh request."""
    result = execute_dagster_graphql(
        process.create_request_context(), ui_operations()[0][name], variables
    )
    assert not result.errors, result.errors
    return result.data


@pytest.fixture
def process(tmp_path):
    """The shipped queue and limits, the shards' accounts, the location loaded in process."""
    shipped = yaml.safe_load((REPO / "dagster.yaml").read_text())
    overrides = {key: shipped[key] for key in ("run_coordinator", "concurrency")}
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            module_name=__name__, attribute="three_shards", working_directory=str(REPO)
        ),
        location_name=LOCATION,
    )
    with (
        dg.instance_for_test(temp_dir=str(tmp_path), overrides=overrides) as instance,
        WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget([origin])) as process,
    ):
        assert isinstance(instance.run_coordinator, AccountRunCoordinator)
        for shard, accounts in SHARD_ACCOUNTS.items():
            instance.add_dynamic_partitions(shards.accounts_name(shard), accounts)
        yield process


def dialog_backfill_params(node: dict, keys: list[str], preferred_job: str | None) -> dict:
    """What `LaunchAssetChoosePartitionsDialog.tsx` (`onLaunchAsBackfill`) sends for `keys`.

    The target is `stateForLaunchingAssets`'s (LaunchAssetExecutionButton.tsx): the job
    `getCommonJob` picks (the preferred one, else the asset's first); `runConfigData` is
    undefined without a saved launchpad config, so it is not sent.
    """
    job = preferred_job if preferred_job in node["jobNames"] else node["jobNames"][0]
    params = {
        "tags": [FROM_UI],
        "assetSelection": [{"path": node["assetKey"]["path"]}],
        "partitionNames": keys,
        "fromFailure": False,
    }
    if job.startswith(("__ASSET_JOB", "__anonymous_asset_job")):  # isHiddenAssetGroupJob
        return params
    repository = node["repository"]
    return {
        **params,
        "selector": {
            "partitionSetName": f"{job}_partition_set",
            "repositorySelector": {
                "repositoryLocationName": repository["location"]["name"],
                "repositoryName": repository["name"],
            },
        },
    }


def days(first: date, last: date) -> list[str]:
    return [(first + timedelta(n)).isoformat() for n in range((last - first).days + 1)]


def test_the_dialog_backfills_one_account_of_a_shard_through_the_queue(process):
    instance = process.instance
    shard = spend_shard(1)
    asset_key = {"path": shard.ad_key.path}

    # The dialog's asset: Materialize... asks for it; a subsettable pair needs no partner.
    loaded = ask(process, "LaunchAssetLoaderQuery", {"assetKeys": [asset_key]})
    assert loaded["assetNodeAdditionalRequiredKeys"] == []
    (node,) = loaded["assetNodes"]
    assert node["jobNames"] == ["__ASSET_JOB", "meta_spend_shard_1_sync"]
    assert node["partitionDefinition"]["dimensionTypes"] == [
        {"name": "account", "dynamicPartitionsDefinitionName": shards.accounts_name(shard.index)},
        {"name": "date", "dynamicPartitionsDefinitionName": None},
    ]
    assert node["backfillPolicy"]["maxPartitionsPerRun"] == MAX_DAYS_PER_RUN

    # Its picker offers the shard's accounts only; the keys are `account|date`, as
    # `explodePartitionKeysInSelectionMatching` joins the dimensions' keys.
    health = ask(process, "PartitionHealthQuery", {"assetKey": asset_key})
    dimensions = {
        dimension["name"]: dimension["partitionKeys"]
        for dimension in health["assetNodeOrError"]["partitionKeysByDimension"]
    }
    assert list(dimensions) == ["account", "date"]
    assert dimensions["account"] == SHARD_ACCOUNTS[1]
    picked = days(FIRST, LAST)
    assert set(picked) <= set(dimensions["date"])
    keys = [f"{ACCOUNT}|{day}" for day in picked]

    params = dialog_backfill_params(node, keys, preferred_job=None)
    assert "selector" not in params  # a pure asset backfill
    launched = ask(process, "LaunchPartitionBackfill", {"backfillParams": params})
    backfill_id = launched["launchPartitionBackfill"]["backfillId"]

    for error in execute_backfill_iteration(process, logging.getLogger(__name__)):
        assert error is None, error.to_string()

    backfill = instance.get_backfill(backfill_id)
    assert backfill.asset_selection == [shard.ad_key]
    target = backfill.asset_backfill_data.target_subset
    assert set(target.asset_keys) == {shard.ad_key}
    assert sorted(target.get_partitions_subset(shard.ad_key).get_partition_keys()) == keys

    runs = sorted(
        instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id})),
        key=lambda run: run.tags[RANGE_START_TAG],
    )
    assert [(run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) for run in runs] == [
        (f"{ACCOUNT}|2026-10-16", f"{ACCOUNT}|2026-11-14"),
        (f"{ACCOUNT}|2026-11-15", f"{ACCOUNT}|2026-11-29"),
    ]
    for run in runs:
        assert run.status == dg.DagsterRunStatus.QUEUED
        assert run.asset_selection == {shard.ad_key}
        assert run.tags[ACCOUNT_TAG] == run_account(run.tags) == ACCOUNT
        assert run.tags["dagster/from_ui"] == "true"
        assert run.tags["dagster/code_location"] == LOCATION
        assert stray_partition(run.tags) is None
    # Nothing anywhere targets another shard's pair, shard 0's `ad_spend_daily` included.
    everything = instance.get_runs()
    assert {key for run in everything for key in run.asset_selection or ()} == {shard.ad_key}
    assert [backfill.backfill_id for backfill in instance.get_backfills()] == [backfill_id]

    # The queue lets one of the account's runs through at a time (the shipped limits).
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    counter = TagConcurrencyLimitsCounter(limits, [])
    let_through = []
    for run in runs:
        if not counter.is_blocked(run):
            counter.update_counters_with_launched_item(run)
            let_through.append(run.run_id)
    assert let_through == [runs[0].run_id]


@pytest.mark.parametrize("preferred_job", [None, "meta_spend_shard_1_sync"])
def test_the_dialog_refuses_a_partition_of_another_shards_account(process, preferred_job):
    """`act_202|day` is no partition of shard 1's asset: the whole backfill is refused."""
    instance = process.instance
    shard = spend_shard(1)
    asset_key = {"path": shard.ad_key.path}
    (node,) = ask(process, "LaunchAssetLoaderQuery", {"assetKeys": [asset_key]})["assetNodes"]
    for keys in (
        [f"{ELSEWHERE}|2026-11-01"],
        [f"{ACCOUNT}|2026-11-01", f"{ELSEWHERE}|2026-11-01"],
    ):
        params = dialog_backfill_params(node, keys, preferred_job)
        answer = ask(process, "LaunchPartitionBackfill", {"backfillParams": params})
        assert answer["launchPartitionBackfill"] == {
            "message": f"Partition keys `['{ELSEWHERE}|2026-11-01']` could not be found."
        }
    assert instance.get_backfills() == []
    assert instance.get_runs() == []



def test_a_backfill_from_the_shard_jobs_page_is_refused_not_run_on_one_partition(process):
    """The dialog on `meta_spend_shard_1_sync`'s page sends a job backfill; Dagster gives
    each of its range runs one partition's dimension tags, which a run reads first."""
    instance = process.instance
    shard = spend_shard(1)
    asset_key = {"path": shard.ad_key.path}
    (node,) = ask(process, "LaunchAssetLoaderQuery", {"assetKeys": [asset_key]})["assetNodes"]
    keys = [f"{account}|{day}" for account in SHARD_ACCOUNTS[1] for day in days(FIRST, LAST)]
    params = dialog_backfill_params(node, keys, preferred_job="meta_spend_shard_1_sync")
    assert params["selector"]["partitionSetName"] == "meta_spend_shard_1_sync_partition_set"
    launched = ask(process, "LaunchPartitionBackfill", {"backfillParams": params})
    backfill_id = launched["launchPartitionBackfill"]["backfillId"]

    for error in execute_backfill_iteration(process, logging.getLogger(__name__)):
        assert error is None, error.to_string()

    assert instance.get_backfill(backfill_id).partition_names == keys
    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    ranges = sorted((run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) for run in runs)
    assert ranges == [
        (f"{account}|{first}", f"{account}|{last}")
        for account in SHARD_ACCOUNTS[1]
        for first, last in (("2026-10-16", "2026-11-14"), ("2026-11-15", "2026-11-29"))
    ]
    # One partition's tags on every run: the runs of one account name another's day.
    (stray,) = {stray_partition(run.tags) for run in runs}
    assert stray in keys
    assert any(not stray.startswith(run.tags[RANGE_START_TAG].split("|")[0]) for run in runs)
    for run in runs:
        assert run.status == dg.DagsterRunStatus.FAILURE
        (failure,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert failure.message.startswith("Refused: this run of ")
        assert f"Dagster would sync only {stray}" in failure.message
    assert instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])) == []


@pytest.mark.parametrize(
    ("tags", "stray"),
    [
        # A job backfill's range run: the first partition's dimension tags.
        ({RANGE_START_TAG: "act_1|2026-11-01", RANGE_END_TAG: "act_1|2026-11-30",
          "dagster/partition/account": "act_2", "dagster/partition/date": "2026-11-01"},
         "act_2|2026-11-01"),
        # The same run of one partition: its tags name it.
        ({RANGE_START_TAG: "act_1|2026-11-01", RANGE_END_TAG: "act_1|2026-11-01",
          "dagster/partition/account": "act_1", "dagster/partition/date": "2026-11-01"}, None),
        # An asset backfill's range run, a run of one partition by hand.
        ({RANGE_START_TAG: "act_1|2026-11-01", RANGE_END_TAG: "act_1|2026-11-30"}, None),
        ({"dagster/partition": "act_1|2026-11-01", "dagster/partition/account": "act_1",
          "dagster/partition/date": "2026-11-01"}, None),
    ],
)
def test_the_partition_a_range_run_would_read_instead(tags, stray):
    assert stray_partition(tags) == stray


def test_dagster_reads_a_range_runs_dimension_tags_before_its_range():
    """Why the queue refuses such a run; when Dagster reads the range first, drop it."""
    partitions = dg.MultiPartitionsDefinition(
        {
            "account": dg.StaticPartitionsDefinition(["act_1", "act_2"]),
            "date": dg.DailyPartitionsDefinition("2026-11-01", end_date="2026-12-01"),
        }
    )
    read: list[str] = []

    @dg.asset(partitions_def=partitions)
    def spend(context) -> None:  # a string annotation is refused (future annotations)
        read.extend(str(key) for key in context.partition_keys)

    job = dg.Definitions(assets=[spend], jobs=[dg.define_asset_job("sync", [spend])])
    tags = {RANGE_START_TAG: "act_1|2026-11-01", RANGE_END_TAG: "act_1|2026-11-30"}
    job.get_job_def("sync").execute_in_process(tags=tags)
    assert len(read) == 30
    read.clear()
    stray = {"dagster/partition/account": "act_2", "dagster/partition/date": "2026-11-01"}
    result = job.get_job_def("sync").execute_in_process(tags={**tags, **stray})
    assert read == ["act_2|2026-11-01"]
    assert [event.partition for event in result.get_asset_materialization_events()] == [
        "act_2|2026-11-01"
    ]

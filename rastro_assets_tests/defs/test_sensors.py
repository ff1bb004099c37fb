"""The cadence sensors on a real instance: what they request, and what they leave alone."""

from __future__ import annotations

import json
import logging
import time
from datetime import date, timedelta

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

from rastro_assets import shards
from rastro_assets.defs.cadence.backfills import (
    FIRST_DATA_ACCOUNTS_PER_RUN,
    Fill,
    first_data,
)
from rastro_assets.defs.cadence.sensors import build_meta_accounts_sensor, build_meta_cadence_sensor
from rastro_assets.defs.keys import (
    ACCOUNT_TAG,
    AD_SPEND_DAILY,
    BACKFILL_ID_TAG,
    FILL_ACCOUNTS_PER_RUN,
    FILL_ACCOUNTS_TAG,
    FIRST_DATA_TAG,
    MAX_RUNTIME_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SITE_SPEND_DAILY,
    SYNC_KIND_TAG,
    WAVE_TAG,
    fill_key,
)
from rastro_assets.defs.partitions import (
    AXIS_START,
    reach_start,
    shard_account_partitions,
)
from rastro_assets.warehouse import link_store, registry
from rastro_assets_tests.conftest import NOW, record_sync_run
from rastro_assets_tests.defs.conftest import TODAY

meta_accounts_sensor = build_meta_accounts_sensor(1)
meta_cadence_sensor = build_meta_cadence_sensor(1)


@pytest.fixture
def account_partitions() -> list[str]:
    return []  # the sensor makes the partitions


def evaluate(sensor, instance, rastro):
    from rastro_assets.definitions import defs

    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}
    )
    return sensor(context)


def record_ok(warehouse, account: str, since: date, until: date, at, kind="backfill", run="r"):
    with warehouse.connect() as con:
        record_sync_run(con, f"{run}-{account}-{since}", account, kind, since, until, at,
                        catalog=True)


def backfilled(warehouse, account: str, at=NOW - timedelta(hours=1)) -> None:
    from rastro_assets.meta.models import Ad
    from rastro_assets.warehouse.catalog import upsert_catalog

    record_ok(warehouse, account, TODAY - timedelta(days=89), TODAY, at)
    # An account that delivers: its backfill found an ACTIVE ad (an idle one is read less often).
    with warehouse.connect() as con:
        upsert_catalog(con, account, [Ad(f"{account}-ad", effective_status="ACTIVE")], at,
                       refile=True)


def target_accounts(request) -> set[str]:
    subset = request.asset_graph_subset
    assert subset.asset_keys == {fill_key(0)}
    return set(subset.get_partitions_subset(fill_key(0)).get_partition_keys())


def link(warehouse, account: str, at) -> None:
    with warehouse.connect() as con:
        link_store.link_account(con, "s1", account, "c1", "America/Sao_Paulo", "BRL", at)


def test_new_accounts_become_partitions_and_share_one_fill_backfill(instance, rastro):
    result = evaluate(meta_accounts_sensor, instance, rastro)
    [add] = result.dynamic_partitions_requests
    assert (add.partitions_def_name, sorted(add.partition_keys)) == (
        shards.accounts_name(0),
        ["act_101", "act_202"],
    )
    [request] = result.run_requests
    assert request.tags[SYNC_KIND_TAG] == "backfill"
    assert request.tags[FILL_ACCOUNTS_TAG] == "act_101 and 1 more"
    # No per-account tag: its limit of one run per value would run the backfill's runs
    # one after another.
    assert ACCOUNT_TAG not in request.tags
    assert target_accounts(request) == {"act_101", "act_202"}


def link_many(warehouse, count: int) -> list[str]:
    linked = [f"act_9{n:03d}" for n in range(count)]
    for account in linked:
        link(warehouse, account, NOW - timedelta(minutes=1))
    return linked


def test_many_accounts_owing_their_newest_days_get_them_first(instance, rastro, warehouse):
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    linked = link_many(warehouse, FILL_ACCOUNTS_PER_RUN + 6)

    # meta_accounts adds their partitions and leaves their days to the first-data runs.
    result = evaluate(meta_accounts_sensor, instance, rastro)
    assert result.run_requests == []
    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202", *linked])

    # meta_cadence reads every one's newest 30 days, in runs of its own.
    requests = [
        request
        for request in evaluate(meta_cadence_sensor, instance, rastro).run_requests
        if FIRST_DATA_TAG in request.tags
    ]
    assert len(requests) == -(-len(linked) // FIRST_DATA_ACCOUNTS_PER_RUN)
    syncs = [
        sync
        for request in requests
        for sync in request.run_config["ops"]["sync_wave"]["config"]["syncs"]
    ]
    assert {sync["ad_account_id"] for sync in syncs} == set(linked)
    newest = (str(TODAY - timedelta(days=29)), str(TODAY))
    assert {(sync["kind"], sync["since"], sync["until"]) for sync in syncs} == {
        ("backfill", *newest)
    }
    assert all(WAVE_TAG not in request.tags for request in requests)

    # Read, their older days start as one fill backfill, cut into runs of many accounts.
    for account in linked:
        record_ok(warehouse, account, TODAY - timedelta(days=29), TODAY, NOW)
    [fill] = evaluate(meta_accounts_sensor, instance, rastro).run_requests
    assert target_accounts(fill) == set(linked)
    subset = fill.asset_graph_subset.get_partitions_subset(fill_key(0))
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        ranges = subset.get_partition_key_ranges(shard_account_partitions(0))
    assert len(ranges) == 1  # contiguous in link order: Dagster chunks it by the policy
    assert not [
        request
        for request in evaluate(meta_cadence_sensor, instance, rastro).run_requests
        if FIRST_DATA_TAG in request.tags
    ]


def test_a_few_accounts_go_straight_to_one_fill_run():
    fills = [
        Fill(f"act_{n}", "backfill", TODAY - timedelta(days=89), TODAY)
        for n in range(FILL_ACCOUNTS_PER_RUN)
    ]
    assert first_data(fills, {}) == []
    more = [*fills, Fill("act_x", "gap", TODAY - timedelta(days=10), TODAY)]
    assert [(r.fill.ad_account_id, r.since, r.until) for r in first_data(more, {})][-1] == (
        "act_x",
        TODAY - timedelta(days=10),
        TODAY,
    )


def test_the_date_axis_starts_where_this_deployment_can_need_a_day():
    assert reach_start(TODAY) == date(2026, 8, 1)
    # A month to spare before the first backfill of accounts linked at release.
    assert TODAY - timedelta(days=89 + 30) >= AXIS_START
    # Meta keeps 37 months: from late 2029 that, not the axis, is the reach.
    assert reach_start(date(2030, 1, 31)) == date(2026, 12, 31)
    assert reach_start(date(2029, 12, 31)) == date(2026, 11, 30)


def test_days_before_the_reach_are_left_out_of_the_backfill(instance, rastro, warehouse):
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    link(warehouse, "act_303", NOW - timedelta(days=200))  # its 90 days end before the axis
    [request] = evaluate(meta_accounts_sensor, instance, rastro).run_requests
    assert target_accounts(request) == {"act_303"}
    # The run reads from the axis on (`spend_backfill`); the sensor's log says so.


def test_an_account_owing_only_days_before_its_reach_is_skipped_not_failed(
    instance, rastro, warehouse
):
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    link(warehouse, "act_303", NOW - timedelta(days=200))
    record_ok(warehouse, "act_303", AXIS_START, TODAY, NOW - timedelta(hours=1))
    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202", "act_303"])
    result = evaluate(meta_accounts_sensor, instance, rastro)
    assert isinstance(result, dg.SkipReason)
    assert "act_303: every owed day" in result.skip_message
    assert "before the account's reach" in result.skip_message


def test_unlinked_accounts_lose_their_partition(instance, rastro, warehouse):
    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202", "act_303"])
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    result = evaluate(meta_accounts_sensor, instance, rastro)
    [delete] = result.dynamic_partitions_requests
    assert isinstance(delete, dg.DeleteDynamicPartitionsRequest)
    assert list(delete.partition_keys) == ["act_303"]
    assert result.run_requests == []


@dg.definitions
def accounts_sensor_alone() -> dg.Definitions:
    """The code location with `meta_accounts` as its only sensor and its clock at NOW, for
    a tick of Dagster's own sensor daemon."""
    from rastro_assets.definitions import defs
    from rastro_assets_tests.pinned import pinned

    return dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        sensors=[meta_accounts_sensor],
        resources={"rastro": pinned(NOW)},
        executor=defs.executor,
    )


def daemon_tick(instance) -> tuple[object, list[str]]:
    """One iteration of Dagster's sensor daemon: the tick it stored, as the UI lists it, and
    the lines of the tick's log, as the UI shows them under the tick."""
    from dagster._core.definitions.instigation_logger import get_instigation_log_records
    from dagster._core.log_manager import LOG_RECORD_METADATA_ATTR
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.scheduler.instigation import InstigatorType
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster._daemon.sensor import execute_sensor_iteration

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name=__name__, attribute="accounts_sensor_alone"),
        location_name="rastro_assets",
    )
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget([origin])) as process:
        list(execute_sensor_iteration(process, logging.getLogger(__name__), None, None))
    [state] = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
    [tick] = instance.get_ticks(state.instigator_origin_id, state.selector_id)
    records = get_instigation_log_records(instance, tick.log_key) if tick.log_key else []
    # The UI shows each record's own message (`get_tick_log_events` in dagster-graphql).
    return tick, [record[LOG_RECORD_METADATA_ATTR]["orig_message"] for record in records]


def test_a_tick_that_removes_a_hand_added_partition_says_so(instance, rastro, warehouse):
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    # The UI's "Add a partition" on meta_ad_account, for an account no site links.
    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202", "act_9999"])
    tick, log = daemon_tick(instance)
    said = (
        "removed 1 partition of an account not linked to any site: act_9999 "
        "(partitions follow the links: add accounts with `rastro link`)"
    )
    assert tick.status == TickStatus.SKIPPED
    assert tick.skip_reason == said  # never "Sensor function returned an empty result"
    assert said in log
    assert instance.get_dynamic_partitions(shards.accounts_name(0)) == ["act_101", "act_202"]


def test_a_tick_that_starts_a_backfill_logs_the_partition_it_removed(
    instance, rastro, warehouse
):
    backfilled(warehouse, "act_101")
    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202", "act_9999"])
    tick, log = daemon_tick(instance)
    # act_202 owes its backfill: a tick with a run request takes no skip reason, so its
    # log is where it says what it removed.
    assert tick.status == TickStatus.SUCCESS and tick.skip_reason is None
    [backfill] = instance.get_backfills()
    assert backfill.asset_backfill_data.target_subset.asset_keys == {fill_key(0)}
    assert (
        "removed 1 partition of an account not linked to any site: act_9999 "
        "(partitions follow the links: add accounts with `rastro link`)"
    ) in log
    assert "act_9999" not in instance.get_dynamic_partitions(shards.accounts_name(0))


def test_no_second_backfill_while_one_is_in_flight(instance, rastro):
    first = evaluate(meta_accounts_sensor, instance, rastro)
    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101", "act_202"])
    from rastro_assets.defs.dagster_private import BulkActionStatus, PartitionBackfill

    for number, request in enumerate(first.run_requests):
        instance.add_backfill(
            PartitionBackfill.from_asset_graph_subset(
                backfill_id=f"b{number}",
                asset_graph_subset=request.asset_graph_subset,
                dynamic_partitions_store=instance,
                tags=request.tags,
                backfill_timestamp=NOW.timestamp(),
                title=None,
                description=None,
                run_config=None,
            ).with_status(BulkActionStatus.REQUESTED)
        )
    second = evaluate(meta_accounts_sensor, instance, rastro)
    assert isinstance(second, dg.SkipReason)
    assert "in flight" in second.skip_message


def test_live_wave_groups_every_due_account(instance, rastro, warehouse):
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    record_ok(
        warehouse,
        "act_101",
        TODAY - timedelta(days=6),
        TODAY,
        NOW - timedelta(hours=2),
        kind="daily",
        run="d",
    )
    record_ok(
        warehouse,
        "act_202",
        TODAY - timedelta(days=6),
        TODAY,
        NOW - timedelta(hours=2),
        kind="daily",
        run="d",
    )
    result = evaluate(meta_cadence_sensor, instance, rastro)
    [request] = result.run_requests
    assert request.tags[WAVE_TAG] == "true"
    syncs = request.run_config["ops"]["sync_wave"]["config"]["syncs"]
    assert [(s["ad_account_id"], s["kind"], s["since"], s["until"]) for s in syncs] == [
        ("act_101", "live", str(TODAY - timedelta(days=1)), str(TODAY)),
        ("act_202", "live", str(TODAY - timedelta(days=1)), str(TODAY)),
    ]


def test_nothing_for_paused_backfilling_or_not_yet_due_accounts(instance, rastro, warehouse, now):
    backfilled(warehouse, "act_101", at=NOW - timedelta(minutes=10))
    with warehouse.connect() as con:
        registry.mark_connection_invalid(
            con,
            "c1",
            "token expired",
            now,
            token_sealed_at=registry.get_connection(con, "c1").sealed_at,
        )
    result = evaluate(meta_cadence_sensor, instance, rastro)
    assert result.run_requests == []
    assert "paused" in result.skip_reason.skip_message


def test_no_wave_while_the_previous_wave_runs(instance, rastro, warehouse):
    backfilled(warehouse, "act_101")
    instance.add_run(
        dg.DagsterRun(
            job_name="meta_sync_wave",
            run_id="w1",
            tags={WAVE_TAG: "true"},
            status=dg.DagsterRunStatus.STARTED,
        )
    )
    skip = evaluate(meta_cadence_sensor, instance, rastro)
    assert isinstance(skip, dg.SkipReason)
    assert "previous wave" in skip.skip_message


def test_a_run_older_than_its_max_runtime_blocks_nothing(instance):
    from rastro_assets.defs.cadence.busy import busy_accounts

    for run_id, tags in (
        ("w1", {WAVE_TAG: "true", MAX_RUNTIME_TAG: "900"}),
        ("m1", {ACCOUNT_TAG: "act_202"}),  # the instance's default limit: 2 h
    ):
        instance.add_run(dg.DagsterRun(job_name="j", run_id=run_id, tags=tags,
                                       status=dg.DagsterRunStatus.NOT_STARTED))
        instance.handle_new_event(_run_started_event(run_id))
    now = time.time()
    assert busy_accounts(instance, now) == ({"act_202"}, True)
    assert busy_accounts(instance, now + 901) == ({"act_202"}, False)  # the wave worker died
    assert busy_accounts(instance, now + 7201) == (set(), False)


def _run_started_event(run_id: str):
    return dg.EventLogEntry(
        error_info=None,
        level="debug",
        user_message="",
        run_id=run_id,
        timestamp=time.time(),
        dagster_event=dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.RUN_START.value, job_name="j"
        ),
    )


def test_an_account_with_a_run_in_flight_is_left_out_of_the_wave(instance, rastro, warehouse):
    backfilled(warehouse, "act_101")
    backfilled(warehouse, "act_202")
    instance.add_run(
        dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id="m1",
            tags={ACCOUNT_TAG: "act_202"},
            status=dg.DagsterRunStatus.STARTED,
        )
    )
    [request] = evaluate(meta_cadence_sensor, instance, rastro).run_requests
    syncs = request.run_config["ops"]["sync_wave"]["config"]["syncs"]
    assert [s["ad_account_id"] for s in syncs] == ["act_101"]


def check_evaluations(result) -> list[dg.AssetCheckEvaluation]:
    return [event for event in result.asset_events if isinstance(event, dg.AssetCheckEvaluation)]


def test_freshness_is_reported_when_the_stale_set_changes(instance, rastro, warehouse):
    from rastro_assets.definitions import defs

    backfilled(warehouse, "act_101", at=NOW - timedelta(minutes=10))
    backfilled(warehouse, "act_202", at=NOW - timedelta(hours=2))
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}
    )
    first = meta_cadence_sensor(context)
    [evaluation] = check_evaluations(first)
    assert not evaluation.passed
    assert evaluation.metadata["stale_accounts"].value == 1
    assert "act_202" in evaluation.metadata["stale"].value
    assert evaluation.description == "1 stale: act_202 (of 2 accounts)"
    context.update_cursor(first.cursor)
    assert check_evaluations(meta_cadence_sensor(context)) == []


def test_freshness_is_reported_again_once_its_asset_is_materialized_since(
    instance, rastro, warehouse
):
    """The UI shows a check as "Not evaluated" once its asset has a newer
    materialization than the check's latest evaluation, so after a wave records
    days the next tick evaluates it again, though the stale set is the same."""
    from rastro_assets.definitions import defs

    backfilled(warehouse, "act_101", at=NOW - timedelta(minutes=10))
    backfilled(warehouse, "act_202", at=NOW - timedelta(minutes=10))
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}
    )
    first = meta_cadence_sensor(context)
    assert len(check_evaluations(first)) == 1
    context.update_cursor(first.cursor)
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=AD_SPEND_DAILY, partition=f"act_101|{TODAY}")
    )
    second = meta_cadence_sensor(context)
    [again] = check_evaluations(second)
    assert again.passed
    # It names the materialization it follows: the UI's fallback compares whole seconds,
    # and would read an evaluation made in the materialization's second as not evaluated.
    latest = instance.get_asset_records([AD_SPEND_DAILY])[0].asset_entry
    assert again.target_materialization_data.storage_id == latest.last_materialization_storage_id
    context.update_cursor(second.cursor)
    assert check_evaluations(meta_cadence_sensor(context)) == []


def test_accounts_in_their_first_backfill_are_backfilling_not_stale(instance, rastro, warehouse):
    from rastro_assets.definitions import defs

    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}
    )
    first = meta_cadence_sensor(context)
    [evaluation] = check_evaluations(first)
    assert evaluation.passed
    assert evaluation.description == "nothing stale: 2 accounts backfilling"
    states = {row.data["ad_account_id"]: row.data for row in evaluation.metadata["health"].records}
    assert states["act_101"]["state"] == "backfilling"
    assert states["act_101"]["backfill"] == "0 of 90 days"

    # One account's backfill ends: the set the check names changes, so it is reported again.
    backfilled(warehouse, "act_101", at=NOW - timedelta(minutes=10))
    context.update_cursor(first.cursor)
    [second] = check_evaluations(meta_cadence_sensor(context))
    assert second.passed
    assert second.description == "1 account fresh, none stale; 1 backfilling"


def test_the_cadence_cursor_says_what_it_holds(instance, rastro, warehouse):
    from rastro_assets.definitions import defs

    backfilled(warehouse, "act_101", at=NOW - timedelta(hours=2))
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}
    )
    cursor = json.loads(meta_cadence_sensor(context).cursor)
    assert cursor["accounts_fresh as last reported, per shard"] == [
        {"stale": ["act_101"], "paused": [], "backfilling": 1}
    ]
    assert cursor["meta_account_health as last recorded"]["recorded_at"] == NOW.isoformat()


def health_events(result) -> list[dg.AssetMaterialization]:
    return [
        event
        for event in result.asset_events
        if isinstance(event, dg.AssetMaterialization | dg.AssetObservation)
        and event.asset_key == dg.AssetKey("meta_account_health")
    ]


def test_the_cadence_records_every_accounts_health_when_it_changes(instance, rastro_at, warehouse):
    from rastro_assets.definitions import defs

    backfilled(warehouse, "act_101", at=NOW - timedelta(minutes=10))

    def tick(at, cursor):
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, resources={"rastro": rastro_at(at)},
            cursor=cursor,
        )
        return meta_cadence_sensor(context)

    first = tick(NOW, None)
    # A materialization, so the overview reads "Latest materialization", not "Never".
    [recorded] = health_events(first)
    assert isinstance(recorded, dg.AssetMaterialization)
    assert recorded.description == "2 accounts: 1 backfilling, 1 live"
    assert recorded.metadata["backfilling"].value == 1 and recorded.metadata["live"].value == 1
    rows = {row.data["account"]: row.data for row in recorded.metadata["health"].records}
    assert rows["act_202"]["state"] == "backfilling"
    assert rows["act_202"]["backfill"] == "0 of 90 days"
    assert rows["act_101"]["synced"] == f"{TODAY:%m-%d} 11:50"  # UTC, ten minutes before NOW
    assert rows["act_101"]["due"]
    assert "error" in rows["act_101"]

    # Nothing changed: no new event until the refresh interval, then one.
    later = tick(NOW + timedelta(minutes=5), first.cursor)
    assert health_events(later) == []
    assert health_events(tick(NOW + timedelta(minutes=31), later.cursor))

    # A backfill's progress is a change.
    record_ok(warehouse, "act_202", TODAY - timedelta(days=89), TODAY - timedelta(days=60),
              NOW + timedelta(minutes=1))
    assert health_events(tick(NOW + timedelta(minutes=6), later.cursor))


def ui_backfill_of_every_partition(instance) -> str:
    """A requested backfill of every partition of the spend pair, as "Materialize all" on
    the asset's page makes it."""
    from rastro_assets.definitions import defs
    from rastro_assets.defs.dagster_private import PartitionBackfill

    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id="everything",
        asset_graph=defs.resolve_asset_graph(),
        partition_names=None,
        asset_selection=[AD_SPEND_DAILY, SITE_SPEND_DAILY],
        backfill_timestamp=NOW.timestamp(),
        tags={"dagster/from_ui": "true"},
        dynamic_partitions_store=instance,
        all_partitions=True,
        title=None,
        description=None,
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id


def backfill_run(instance, run_id: str, backfill_id: str, account: str, status) -> None:
    """A run of the backfill over the account's newest 30 days, in `status`."""
    first, last = TODAY - timedelta(days=29), TODAY
    instance.add_run(
        dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id=run_id,
            tags={
                BACKFILL_ID_TAG: backfill_id,
                RANGE_START_TAG: f"{account}|{first}",
                RANGE_END_TAG: f"{account}|{last}",
            },
            status=status,
            remote_job_origin=_job_origin(),
        )
    )


def _job_origin():
    # Dagster stores a queued run only with the code it would load it from (never loaded here).
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="rastro_assets.definitions")
    )
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), "__ASSET_JOB")


def test_a_ui_backfill_of_everything_holds_only_the_accounts_its_runs_hold(
    instance, rastro, warehouse
):
    link(warehouse, "act_303", NOW - timedelta(minutes=1))
    accounts = ["act_101", "act_202", "act_303"]
    instance.add_dynamic_partitions(shards.accounts_name(0), accounts)
    for account in accounts:
        backfilled(warehouse, account)
    backfill_id = ui_backfill_of_every_partition(instance)
    # Dagster queues a backfill's runs all at once; the queue has launched act_202's.
    backfill_run(instance, "r202", backfill_id, "act_202", dg.DagsterRunStatus.STARTED)
    backfill_run(instance, "r303", backfill_id, "act_303", dg.DagsterRunStatus.QUEUED)

    [request] = evaluate(meta_cadence_sensor, instance, rastro).run_requests
    assert request.tags[WAVE_TAG] == "true"
    syncs = request.run_config["ops"]["sync_wave"]["config"]["syncs"]
    assert [(s["ad_account_id"], s["kind"]) for s in syncs] == [
        ("act_101", "live"),
        ("act_303", "live"),
    ]

    # A move still waits for every account the backfill targets, reached or not.
    from rastro_assets.instance.accounts import busy

    assert busy(instance) == {"act_101", "act_202", "act_303"}


def test_a_run_over_one_date_of_many_accounts_holds_each_of_them(instance):
    from rastro_assets.defs.cadence.busy import busy_accounts

    instance.add_dynamic_partitions(shards.accounts_name(0), ["act_1", "act_2", "act_3", "act_4"])
    instance.add_run(
        dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id="r",
            tags={
                BACKFILL_ID_TAG: "b",
                RANGE_START_TAG: f"act_1|{TODAY}",
                RANGE_END_TAG: f"act_3|{TODAY}",
            },
            status=dg.DagsterRunStatus.STARTED,
        )
    )
    assert busy_accounts(instance) == ({"act_1", "act_2", "act_3"}, False)


def test_of_queued_runs_only_the_cadences_own_hold_their_accounts(instance):
    from rastro_assets.defs.cadence.busy import busy_accounts, move_blockers

    syncs = [{"ad_account_id": "act_1", "kind": "backfill", "since": "2026-11-01",
              "until": "2026-11-30"}]
    for run_id, tags, run_config in (
        ("first-data", {WAVE_TAG: "true", FIRST_DATA_TAG: "1"},
         {"ops": {"sync_wave": {"config": {"syncs": syncs}}}}),
        ("by hand", {ACCOUNT_TAG: "act_2"}, None),
    ):
        instance.add_run(
            dg.DagsterRun(
                job_name="j", run_id=run_id, tags=tags, run_config=run_config,
                status=dg.DagsterRunStatus.QUEUED, remote_job_origin=_job_origin(),
            )
        )
    assert busy_accounts(instance) == ({"act_1"}, False)
    assert move_blockers(instance) == {"act_1", "act_2"}

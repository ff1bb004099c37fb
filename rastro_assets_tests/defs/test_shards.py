"""Three shards through the definitions: each account's spend lands in its own shard's pair."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from rastro_assets import shards
from rastro_assets.defs.keys import ACCOUNT_TAG, FIRST_DATA_TAG, PRIORITY_TAG, WAVE_TAG
from rastro_assets.defs.partitions import spend_partition_key, spend_shard
from rastro_assets.defs.spend.assets import build_meta_spend
from rastro_assets.defs.spend.checks import build_sum_check
from rastro_assets.instance.accounts import move_account
from rastro_assets.instance.run_queue import AccountRunCoordinator, range_priority, run_account
from rastro_assets.timekeeping import fixed_clock
from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.defs.instance_events import add_run, record_spend
from rastro_assets_tests.defs.waves import live, run_wave

SHARDS = 3
PLACES = {"act_101": 1, "act_202": 2}


@pytest.fixture
def account_partitions() -> list[str]:
    return []


@pytest.fixture
def sharded(warehouse, linked_world):
    """act_101 in shard 1, act_202 in shard 2; shard 0 holds none."""
    with warehouse.connect() as con:
        for account, shard in PLACES.items():
            shard_store.set_account_shard(con, account, shard)
    return linked_world


@pytest.fixture
def defs():
    from rastro_assets.definitions import build_defs

    return build_defs(SHARDS)


def sensor(defs, name: str) -> dg.SensorDefinition:
    return next(s for s in defs.sensors if s.name == name)


def evaluate(defs, name, instance, rastro):
    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": rastro}
    )
    return sensor(defs, name)(context)


def apply(instance, result) -> None:
    for change in result.dynamic_partitions_requests:
        if isinstance(change, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(change.partitions_def_name, change.partition_keys)
        else:
            for key in change.partition_keys:
                instance.delete_dynamic_partition(change.partitions_def_name, key)


def test_keys_of_shard_zero_are_todays_and_the_others_are_suffixed(defs):
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"ad_spend_daily", "site_spend_daily", "ad_spend_daily_shard_2"} <= keys
    assert shards.accounts_name(0) == "meta_ad_account"
    assert shards.accounts_name(2) == "meta_ad_account_shard_2"
    graph = defs.resolve_asset_graph()
    catalog = graph.get(dg.AssetKey("ad_catalog"))
    assert catalog.partitions_def.name == "meta_ad_account_all"
    assert not any(shards.AD_SPEND in key.to_user_string() for key in catalog.parent_keys)


def test_new_accounts_become_partitions_of_their_shard_and_backfill_there(
    defs, instance, rastro, sharded
):
    result = evaluate(defs, "meta_accounts", instance, rastro)
    added = {
        change.partitions_def_name: sorted(change.partition_keys)
        for change in result.dynamic_partitions_requests
    }
    assert added == {
        "meta_ad_account_shard_1": ["act_101"],
        "meta_ad_account_shard_2": ["act_202"],
        "meta_ad_account_all": ["act_101", "act_202"],
    }
    # A backfill per shard: the daemon iterates them faster than one over both pairs.
    assert len(result.run_requests) == 2
    targets = {}
    for request in result.run_requests:
        subset = request.asset_graph_subset
        for asset_key in subset.asset_keys:
            keys = subset.get_partitions_subset(asset_key).get_partition_keys()
            targets[asset_key.to_user_string()] = {str(key).split("|")[0] for key in keys}
    assert targets == {
        "spend_backfill_shard_1": {"act_101"},
        "spend_backfill_shard_2": {"act_202"},
    }

    apply(instance, result)
    with rastro.warehouse().connect() as con:
        link_store.unlink_account(con, "s1", "act_101")
    after = evaluate(defs, "meta_accounts", instance, rastro)
    assert [
        (type(change).__name__, change.partitions_def_name, list(change.partition_keys))
        for change in after.dynamic_partitions_requests
    ] == [
        ("DeleteDynamicPartitionsRequest", "meta_ad_account_shard_1", ["act_101"]),
        ("DeleteDynamicPartitionsRequest", "meta_ad_account_all", ["act_101"]),
    ]


def test_an_account_the_warehouse_moves_leaves_its_old_shard_before_joining_the_new(
    defs, instance, rastro, sharded
):
    apply(instance, evaluate(defs, "meta_accounts", instance, rastro))
    with rastro.warehouse().connect() as con:
        shard_store.set_account_shard(con, "act_202", 1)  # from shard 2 to a lower one
    result = evaluate(defs, "meta_accounts", instance, rastro)
    holding = {
        name: set(instance.get_dynamic_partitions(name))
        for name in (shards.accounts_name(shard) for shard in range(SHARDS))
    }
    for change in result.dynamic_partitions_requests:
        keys = set(change.partition_keys)
        if isinstance(change, dg.AddDynamicPartitionsRequest):
            holding[change.partitions_def_name] |= keys
        else:
            holding[change.partitions_def_name] -= keys
        shards_of_202 = [name for name, accounts in holding.items() if "act_202" in accounts]
        assert len(shards_of_202) <= 1, shards_of_202
    assert holding[shards.accounts_name(1)] == {"act_101", "act_202"}
    assert holding[shards.accounts_name(2)] == set()


def test_a_wave_records_each_account_in_its_own_shard(instance, rastro, sharded):
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert result.success
    recorded = {
        (event.asset_key.to_user_string(), event.partition.split("|")[0])
        for event in result.get_asset_materialization_events()
        if "spend" in event.asset_key.to_user_string() and event.partition is not None
    }
    assert recorded == {
        ("ad_spend_daily_shard_1", "act_101"),
        ("site_spend_daily_shard_1", "act_101"),
        ("ad_spend_daily_shard_2", "act_202"),
        ("site_spend_daily_shard_2", "act_202"),
    }
    checked = {
        (check.asset_key.to_user_string(), check.partition.split("|")[0], check.passed)
        for check in (
            event.event_specific_data
            for event in result.all_events
            if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
    }
    assert checked == {
        ("site_spend_daily_shard_1", "act_101", True),
        ("site_spend_daily_shard_2", "act_202", True),
    }


def test_an_account_day_by_hand_lands_in_its_shard_and_is_checked_there(
    instance, rastro, sharded
):
    instance.add_dynamic_partitions(shards.accounts_name(2), ["act_202"])
    partition = str(spend_partition_key("act_202", TODAY))
    result = dg.materialize(
        [build_meta_spend(2, SHARDS), build_sum_check(2)],
        instance=instance,
        resources={"rastro": rastro},
        partition_key=partition,
    )
    assert result.success
    for asset_key in spend_shard(2).keys:
        assert instance.get_materialized_partitions(asset_key) == {partition}
    for asset_key in spend_shard(0).keys:
        assert instance.get_materialized_partitions(asset_key) == set()
    [evaluation] = result.get_asset_check_evaluations()
    assert (evaluation.asset_key, evaluation.passed) == (spend_shard(2).site_key, True)


def test_the_freshness_check_of_each_shard_holds_its_own_accounts(
    defs, instance, rastro, sharded
):
    result = evaluate(defs, "meta_cadence", instance, rastro)
    per_shard = {
        event.asset_key.to_user_string(): event.metadata["accounts"].value
        for event in result.asset_events
        if isinstance(event, dg.AssetCheckEvaluation)
    }
    assert per_shard == {"ad_spend_daily": 0, "ad_spend_daily_shard_1": 1,
                         "ad_spend_daily_shard_2": 1}
    [health] = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
    shards_shown = {row.data["account"]: row.data["shard"]
                    for row in health.metadata["health"].records}
    assert sorted(shards_shown.values()) == [1, 2]


def test_a_move_keeps_every_account_days_status(instance):
    days = [str(TODAY - timedelta(days=back)) for back in range(90)]
    instance.add_dynamic_partitions("meta_ad_account", ["act_1", "act_2"])
    add_run(instance, "r1")
    record_spend(instance, "r1", [f"{account}|{day}" for account in ("act_1", "act_2")
                                  for day in days])
    before = {key: instance.get_materialized_partitions(key) for key in spend_shard(0).keys}

    moved = move_account(instance, "act_2", 0, 1, shard_count=SHARDS)

    assert moved.partitions == 90
    for old_key, new_key in zip(spend_shard(0).keys, spend_shard(1).keys, strict=True):
        mine = {key for key in before[old_key] if key.startswith("act_2|")}
        assert instance.get_materialized_partitions(new_key) == mine
    assert instance.get_dynamic_partitions("meta_ad_account") == ["act_1"]
    assert instance.get_dynamic_partitions("meta_ad_account_shard_1") == ["act_2"]


def test_planned_moves_spread_accounts_evenly_and_are_idempotent():
    shard_of = {f"act_{n}": 0 for n in range(10)}
    moves = shards.planned_moves(shard_of, 3)
    after = {**shard_of, **moves}
    counts = [sum(1 for s in after.values() if s == shard) for shard in range(3)]
    assert counts == [4, 3, 3]
    assert shards.planned_moves(after, 3) == {}
    assert shards.planned_moves({"act_1": 5}, 2) == {"act_1": 0}


def test_links_fill_shards_in_turn_and_each_account_keeps_its_own(con, now):
    site_store.add_site(con, "s1", None, now)
    registry.save_connection(con, "c1", b"\0" * 40, now)
    for n in range(7):
        link_store.link_account(con, "s1", f"act_{n}", "c1", "UTC", "USD", now, shards=3,
                              shard_size=2)
    assert shard_store.account_shards(con) == {
        "act_0": 0, "act_1": 0, "act_2": 1, "act_3": 1, "act_4": 2, "act_5": 2, "act_6": 0
    }
    site_store.add_site(con, "s2", None, now)
    link_store.link_account(con, "s2", "act_4", "c1", "UTC", "USD", now, shards=3, shard_size=2)
    assert shard_store.account_shards(con, ["act_4"]) == {"act_4": 2}


def test_accounts_linked_together_share_a_shard_until_it_is_full():
    """Dagster pays per shard a batch of links touches: each rebuilds that shard's status
    cache and carries a backfill the daemon reads every iteration."""
    counts = {0: 100, 1: 97, 2: 40}
    placed = []
    for _ in range(5):
        shard = shards.shard_for_new_account(counts, 4, 100)
        counts[shard] = counts.get(shard, 0) + 1
        placed.append(shard)
    assert placed == [1, 1, 1, 2, 2]


def test_full_shards_grow_a_tenth_at_a_time_in_turn():
    counts = {shard: 100 for shard in range(3)}
    placed = []
    for _ in range(25):
        shard = shards.shard_for_new_account(counts, 3, 100)
        counts[shard] += 1
        placed.append(shard)
    assert placed == [0] * 10 + [1] * 10 + [2] * 5
    assert shards.shard_for_new_account({0: 100}, 2, 100) == 1


def test_the_crowding_warning_names_the_size_the_setting_and_the_command():
    warning = shards.crowded_warning({0: 101}, 1, 100)
    assert "RASTRO_ACCOUNT_SHARDS=2" in warning and "rastro shard move" in warning
    assert shards.crowded_warning({0: 100}, 1, 100) is None
    assert "more than the 50 (RASTRO_SHARD_ACCOUNTS)" in shards.crowded_warning({0: 51}, 2, 50)
    assert shards.crowded_warning({0: 50, 1: 50}, 2, 50) is None


@pytest.mark.parametrize(
    ("tags", "account"),
    [
        ({"dagster/asset_partition_range_start": "act_1|2026-11-01",
          "dagster/asset_partition_range_end": "act_1|2026-11-30"}, "act_1"),
        ({"dagster/asset_partition_range_start": "act_1|2026-11-01",
          "dagster/asset_partition_range_end": "act_2|2026-11-30"}, None),
        ({"dagster/partition/account": "act_3"}, "act_3"),
        ({}, None),
    ],
)
def test_the_account_a_run_writes(tags, account):
    assert run_account(tags) == account


@pytest.mark.parametrize(
    ("end", "priority"),
    [("2026-12-02", 0), ("2026-12-03", 0), ("2026-11-03", 0), ("2026-11-02", -1),
     ("2026-10-04", -1), ("2026-09-04", -2)],
)
def test_a_range_runs_priority_falls_with_each_30_days_back(end, priority):
    tags = {"dagster/asset_partition_range_start": "act_1|2026-08-01",
            "dagster/asset_partition_range_end": f"act_1|{end}"}
    assert range_priority(tags, date(2026, 12, 2)) == priority
    rectangle = {**tags, "dagster/asset_partition_range_start": "act_0|2026-08-01"}
    assert range_priority(rectangle, date(2026, 12, 2)) is None
    assert range_priority({}, date(2026, 12, 2)) is None


def _origin():
    # The queue refuses a run that names no code to load it from; none is ever loaded here.
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


def test_the_queue_tags_each_range_run_of_a_shared_backfill_with_its_account(tmp_path):
    overrides = {
        "run_coordinator": {
            "module": "rastro_assets.instance.run_queue",
            "class": "AccountRunCoordinator",
        }
    }
    # A day whose ranking differs from the real today's: the queue ranks on its own clock.
    later = datetime(2027, 1, 15, 12, 0, tzinfo=UTC)
    with dg.instance_for_test(temp_dir=str(tmp_path), overrides=overrides) as instance:
        assert isinstance(instance.run_coordinator, AccountRunCoordinator)
        instance.run_coordinator.clock = fixed_clock(later)
        queued = {}
        for account in ("act_1", "act_2"):
            run_id = str(uuid.uuid4())
            instance.add_run(
                dg.DagsterRun(
                    job_name="__ASSET_JOB",
                    run_id=run_id,
                    status=dg.DagsterRunStatus.NOT_STARTED,
                    remote_job_origin=_origin(),
                    tags={
                        ACCOUNT_TAG: "act_1 and 1 more",
                        "dagster/asset_partition_range_start": f"{account}|2026-11-01",
                        "dagster/asset_partition_range_end": f"{account}|2026-11-30",
                    },
                )
            )
            # What `instance.submit_run` hands the coordinator once the run has its origin.
            instance.run_coordinator.submit_run(
                dg.SubmitRunContext(instance.get_run_by_id(run_id), workspace=None)
            )
            queued[account] = instance.get_run_by_id(run_id)
        assert {account: run.tags[ACCOUNT_TAG] for account, run in queued.items()} == {
            "act_1": "act_1",
            "act_2": "act_2",
        }
        # Each ranked by how far back its range ends: 46 days, the second block of 30.
        assert range_priority(queued["act_1"].tags, later.date()) == -1
        assert {run.tags["dagster/priority"] for run in queued.values()} == {"-1"}
        assert {run.status for run in queued.values()} == {dg.DagsterRunStatus.QUEUED}


def test_the_queue_starts_the_cadences_runs_before_any_backfills(tmp_path):
    overrides = {
        "run_coordinator": {
            "module": "rastro_assets.instance.run_queue",
            "class": "AccountRunCoordinator",
        }
    }
    with dg.instance_for_test(temp_dir=str(tmp_path), overrides=overrides) as instance:
        instance.run_coordinator.clock = fixed_clock(NOW)
        priorities = {}
        for name, tags in (
            ("wave", {WAVE_TAG: "true"}),
            ("first-data", {FIRST_DATA_TAG: "3"}),
            ("newest block", {
                "dagster/asset_partition_range_start": f"act_1|{TODAY}",
                "dagster/asset_partition_range_end": f"act_1|{TODAY}",
            }),
            ("by hand", {}),
        ):
            run_id = str(uuid.uuid4())
            instance.add_run(
                dg.DagsterRun(
                    job_name="__ASSET_JOB", run_id=run_id, status=dg.DagsterRunStatus.NOT_STARTED,
                    remote_job_origin=_origin(), tags=tags,
                )
            )
            instance.run_coordinator.submit_run(
                dg.SubmitRunContext(instance.get_run_by_id(run_id), workspace=None)
            )
            priorities[name] = int(instance.get_run_by_id(run_id).tags.get(PRIORITY_TAG, "0"))
        assert priorities == {"wave": 1, "first-data": 1, "newest block": 0, "by hand": 0}

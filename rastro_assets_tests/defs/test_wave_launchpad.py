"""A wave launched by hand: it may ask for syncs, never forge the cadence's history.

Anyone who reaches the Dagster UI sets any run config and any tag; only the sensors' sealed
plans record the cadence's kinds, each account is synced once, and a range Meta cannot
answer is refused in one line before anything is read or written.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from rastro_assets.defs.cadence import wave
from rastro_assets.defs.cadence.sensors import wave_request
from rastro_assets.defs.cadence.wave import build_sync_wave_job
from rastro_assets.defs.partitions import months_before
from rastro_assets.planner import cadence
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.defs.waves import live

sync_wave_job = build_sync_wave_job()

YESTERDAY = TODAY - timedelta(days=1)


def sync(account: str = "act_101", kind: str = "manual", since=YESTERDAY, until=TODAY) -> dict:
    return {"ad_account_id": account, "kind": kind, "since": str(since), "until": str(until)}


def launch(instance, rastro, config: dict, tags: dict | None = None):
    """The job as the Launchpad runs it: this config, these tags, whatever they say."""
    return sync_wave_job.execute_in_process(
        run_config={"ops": {"sync_wave": {"config": config}}},
        instance=instance,
        resources={"rastro": rastro},
        tags=tags,
        raise_on_error=False,
    )


def refusal(result) -> str:
    assert not result.success
    [failure] = [event for event in result.all_events if event.is_step_failure]
    return failure.step_failure_data.user_failure_data.description


def kinds_recorded(warehouse) -> list[tuple[str, str]]:
    with warehouse.connect(read_only=True) as con:
        return con.execute(
            "SELECT ad_account_id, kind FROM meta_sync_runs ORDER BY ad_account_id, started_at"
        ).fetchall()


def assert_refused_untouched(result, warehouse, linked_world, *words: str) -> str:
    """Refused in one line naming `words`, with nothing read from Meta or stored."""
    line = refusal(result)
    assert line.startswith("meta_sync_wave refused: ") and "\n" not in line
    for word in words:
        assert word in line
    assert kinds_recorded(warehouse) == []
    assert linked_world.calls["insights"] == 0
    return line


FORGED_TAGS = {
    "dagster/sensor_name": "meta_cadence",
    "dagster/tick": "1",
    "rastro/wave": "true",
    "rastro/sync_kind": "backfill",
}


@pytest.mark.parametrize("kind", ["backfill", "weekly", "live", "x\nINJECT"])
def test_a_launchpad_wave_of_a_cadence_kind_is_refused_and_records_nothing(
    instance, rastro, warehouse, linked_world, kind
):
    config = {"syncs": [{**sync(kind=kind, since=TODAY), "catalog": True}]}
    result = launch(instance, rastro, config, tags=FORGED_TAGS)
    line = assert_refused_untouched(result, warehouse, linked_world, "manual")
    assert repr(kind) in line


def test_a_sealed_plan_edited_by_hand_is_refused(instance, rastro, warehouse, linked_world):
    sealed = wave.sealed_wave_config([{**live("act_101")}], NOW)
    for edit in ({"since": str(TODAY)}, {"catalog": True}, {"ad_account_id": "act_202"}):
        edited = {**sealed, "syncs": [{**sealed["syncs"][0], **edit}]}
        result = launch(instance, rastro, edited)
        assert_refused_untouched(result, warehouse, linked_world, "seal does not match")
    moved = {**sealed, "planned_at": (NOW + timedelta(minutes=30)).isoformat()}
    assert_refused_untouched(launch(instance, rastro, moved), warehouse, linked_world, "seal")


def test_a_sensor_wave_re_executed_after_its_plan_is_old_records_manual(
    instance, rastro_at, warehouse, linked_world
):
    request = wave_request(
        [cadence.Plan("act_101", "live", YESTERDAY, TODAY, False, NOW, "due")], NOW
    )
    config = request.run_config["ops"]["sync_wave"]["config"]
    from rastro_assets.planner.wave_seal import PLAN_LIFETIME

    # Within its lifetime the sensor's plan records its kind.
    assert launch(instance, rastro_at(NOW + timedelta(minutes=5)), config).success
    assert kinds_recorded(warehouse) == [("act_101", "live")]
    # Later, its reads are still real, but no longer the cadence's history.
    later = rastro_at(NOW + PLAN_LIFETIME + timedelta(minutes=1))
    assert launch(instance, later, config, tags=request.tags).success
    assert kinds_recorded(warehouse) == [("act_101", "live"), ("act_101", "manual")]


def test_a_manual_wave_from_the_launchpad_syncs_and_records_manual(
    instance, rastro, warehouse, linked_world
):
    result = launch(instance, rastro, {"syncs": [sync("act_101"), sync("act_202")]})
    assert result.success
    assert kinds_recorded(warehouse) == [("act_101", "manual"), ("act_202", "manual")]


def test_an_account_listed_200_times_is_synced_once(instance, rastro, warehouse, linked_world):
    assert launch(instance, rastro, {"syncs": [sync("act_101")]}).success
    once = dict(linked_world.calls)
    listed = [sync("act_101")] * 199 + [sync("101")]
    assert launch(instance, rastro, {"syncs": listed}).success
    assert {call: linked_world.calls[call] - once.get(call, 0) for call in once} == once
    with warehouse.connect(read_only=True) as con:
        runs = con.execute("SELECT count(DISTINCT run_id), count(*) FROM meta_sync_runs")
        assert runs.fetchone() == (2, 2)


def test_an_account_listed_twice_with_different_ranges_is_refused(
    instance, rastro, warehouse, linked_world
):
    listed = [sync("act_101"), sync("act_101", since=TODAY)]
    result = launch(instance, rastro, {"syncs": listed})
    assert_refused_untouched(result, warehouse, linked_world, "act_101 is listed twice")


OLDEST = months_before(TODAY, 37)


@pytest.mark.parametrize(
    ("since", "until", "words"),
    [
        ("2000-01-01", str(TODAY), [f"before {OLDEST}", "37 months"]),
        (str(OLDEST - timedelta(days=1)), str(OLDEST + timedelta(days=3)), [f"before {OLDEST}"]),
        (str(YESTERDAY), str(TODAY + timedelta(days=1)), ["after the account's local today"]),
        (str(TODAY), str(YESTERDAY), [f"since {TODAY} is after until {YESTERDAY}"]),
        ("2026-13-01", str(TODAY), ["not YYYY-MM-DD"]),
        ("yesterday", str(TODAY), ["not YYYY-MM-DD"]),
    ],
)
def test_a_range_meta_cannot_answer_is_refused_before_anything_is_read(
    instance, rastro, warehouse, linked_world, since, until, words
):
    config = {"syncs": [sync("act_202"), {**sync("act_101"), "since": since, "until": until}]}
    assert_refused_untouched(launch(instance, rastro, config), warehouse, linked_world, *words)


def test_an_account_id_that_is_no_account_id_is_refused(
    instance, rastro, warehouse, linked_world
):
    config = {"syncs": [sync("act_101"), sync("act_1\n2026-11-30 INFO forged")]}
    assert_refused_untouched(
        launch(instance, rastro, config), warehouse, linked_world, "is not act_<digits>"
    )


def test_a_wave_without_the_secrets_key_says_so_in_one_line(
    instance, rastro, warehouse, linked_world, monkeypatch
):
    sealed = wave.sealed_wave_config([live("act_101")], NOW)
    monkeypatch.delenv("RASTRO_SECRETS_KEY")
    result = launch(instance, rastro, sealed)
    assert_refused_untouched(result, warehouse, linked_world, "RASTRO_SECRETS_KEY is not set")


def test_a_first_data_run_of_the_sensor_records_its_fill_kind(
    instance, rastro, warehouse, linked_world
):
    from rastro_assets.defs.cadence.backfills import FirstData, first_data_requests
    from rastro_assets.defs.partitions import Fill

    since = TODAY - timedelta(days=2)
    read = FirstData(Fill("act_101", "backfill", since, TODAY), since, TODAY)
    [request] = first_data_requests([read], NOW)
    config = request.run_config["ops"]["sync_wave"]["config"]
    assert launch(instance, rastro, config, tags=request.tags).success
    assert kinds_recorded(warehouse) == [("act_101", "backfill")]

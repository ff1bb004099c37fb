"""Spend runs whose range ends on a day not begun in their account's zone wait in the queue.

The instance is the shipped one (`dagster.yaml`'s `run_coordinator` and `concurrency`) with
its storage in a temporary directory, over a real warehouse that links the accounts; the
queue's clock and the cadence's are pinned. What the queue daemon would dequeue is asked of
Dagster's own daemon (`_get_runs_to_dequeue`, the pass each of its iterations makes).
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)

from rastro_assets import shards
from rastro_assets.definitions import defs
from rastro_assets.defs.cadence.busy import busy_accounts, in_flight
from rastro_assets.defs.cadence.held import BEGINS_AT_TAG, HOLD_TAG, WAITS_FOR_TAG
from rastro_assets.defs.cadence.sensors import build_meta_cadence_sensor
from rastro_assets.defs.keys import ACCOUNT_TAG, RANGE_END_TAG, RANGE_START_TAG
from rastro_assets.instance.run_queue import AccountRunCoordinator
from rastro_assets.timekeeping import fixed_clock
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.pinned import pinned

meta_cadence_sensor = build_meta_cadence_sensor(1)

REPO = Path(__file__).resolve().parents[2]
# 12:00 UTC: 2026-12-08 02:00 in Kiritimati (UTC+14, the date axis's newest date), still
# 2026-12-07 02:00 in Honolulu (UTC-10), whose 2026-12-08 begins at 10:00 UTC.
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
NEWEST = date(2026, 12, 8)
HONOLULU_BEGINS = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)
ACCOUNTS = {"act_606": "Pacific/Honolulu", "act_808": "Pacific/Kiritimati"}


@pytest.fixture
def instance(tmp_path, monkeypatch):
    """The shipped queue and limits, over a warehouse linking `ACCOUNTS`; the queue's clock
    pinned at `NOW`."""
    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", "Site one", NOW)
        registry.save_connection(con, "c1", b"\0" * 40, NOW)
        for account, timezone in ACCOUNTS.items():
            link_store.link_account(con, "s1", account, "c1", timezone, "USD", NOW)
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(warehouse.path))
    monkeypatch.setenv("RASTRO_ANALYTICS_PATH", str(tmp_path / "analytics.duckdb"))
    shipped = yaml.safe_load((REPO / "dagster.yaml").read_text())
    overrides = {key: shipped[key] for key in ("run_coordinator", "concurrency")}
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=overrides) as instance:
        assert isinstance(instance.run_coordinator, AccountRunCoordinator)
        instance.run_coordinator.clock = fixed_clock(NOW)
        yield instance


def _origin() -> RemoteJobOrigin:
    # The queue refuses a run that names no code to load it from; none is ever loaded here.
    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="rastro_assets.definitions")
    )
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), "__ASSET_JOB")


def submit(instance: dg.DagsterInstance, tags: dict[str, str]) -> dg.DagsterRun:
    """A run with `tags`, handed to the queue as `instance.submit_run` hands it."""
    run_id = str(uuid.uuid4())
    instance.add_run(
        dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id=run_id,
            status=dg.DagsterRunStatus.NOT_STARTED,
            remote_job_origin=_origin(),
            tags=tags,
        )
    )
    instance.run_coordinator.submit_run(
        dg.SubmitRunContext(instance.get_run_by_id(run_id), workspace=None)
    )
    return instance.get_run_by_id(run_id)


def spend_range(account: str, first: str, last: date) -> dict[str, str]:
    return {RANGE_START_TAG: f"{account}|{first}", RANGE_END_TAG: f"{account}|{last}"}


def dequeued(instance: dg.DagsterInstance) -> set[str]:
    """The queued runs Dagster's queue daemon would launch now."""
    daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
    runs = daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), None)
    return {run.run_id for run in runs}


def run_log(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.message for entry in instance.all_logs(run_id)]


def test_the_queue_holds_a_run_until_its_last_day_begins_in_its_accounts_zone(instance):
    held = submit(instance, spend_range("act_606", "2026-11-09", NEWEST))
    begun = submit(instance, spend_range("act_808", "2026-11-09", NEWEST))
    older = submit(instance, spend_range("act_606", "2026-10-10", date(2026, 11, 8)))
    by_hand = submit(
        instance, {"dagster/partition/account": "act_606", "dagster/partition/date": str(NEWEST)}
    )
    unlinked = submit(instance, spend_range("act_999", "2026-11-09", NEWEST))
    # The newest date picked for both accounts in the UI: one run over both, which waits for
    # Honolulu's day.
    instance.add_dynamic_partitions(shards.accounts_name(0), list(ACCOUNTS))
    rectangle = submit(
        instance, {RANGE_START_TAG: f"act_606|{NEWEST}", RANGE_END_TAG: f"act_808|{NEWEST}"}
    )

    assert held.status == dg.DagsterRunStatus.QUEUED
    assert held.tags[ACCOUNT_TAG] == "act_606"
    assert held.tags[HOLD_TAG] == "begins"
    assert held.tags[BEGINS_AT_TAG] == HONOLULU_BEGINS.isoformat()
    assert held.tags[WAITS_FOR_TAG] == (
        "act_606's 2026-12-08 begins at 2026-12-08 00:00 Pacific/Honolulu, "
        "2026-12-08 10:00 UTC: Meta has no figures for it before"
    )
    assert any(
        message.startswith(f"Held in the queue: {held.tags[WAITS_FOR_TAG]}.")
        for message in run_log(instance, held.run_id)
    )
    assert by_hand.tags[HOLD_TAG] == "begins"
    assert rectangle.tags[BEGINS_AT_TAG] == HONOLULU_BEGINS.isoformat()
    assert rectangle.tags[WAITS_FOR_TAG] == (
        f"{held.tags[WAITS_FOR_TAG]}; the run's 1 other account wait with it"
    )
    for run in (begun, older, unlinked):
        assert HOLD_TAG not in run.tags, run.tags

    # The queue launches every other run, not the held ones: one run of act_606 at a time.
    launchable = dequeued(instance)
    assert not {held.run_id, by_hand.run_id, rectangle.run_id} & launchable
    assert {begun.run_id, older.run_id, unlinked.run_id} <= launchable

    # Queued, they hold nothing: the account's live syncs go on.
    assert "act_606" not in in_flight(instance).held

    # Cancelled from the queue, a held run leaves nothing waiting.
    assert instance.run_coordinator.cancel_run(by_hand.run_id)
    assert instance.get_run_by_id(by_hand.run_id).status == dg.DagsterRunStatus.CANCELED
    assert held_runs(instance) == {held.run_id, rectangle.run_id}


def held_runs(instance: dg.DagsterInstance) -> set[str]:
    """The runs the queue holds."""
    return {
        run.run_id
        for run in instance.get_runs(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED], tags={HOLD_TAG: "begins"})
        )
    }


def test_meta_cadence_releases_a_held_run_once_its_day_has_begun(instance):
    held = submit(instance, spend_range("act_606", "2026-11-09", NEWEST))
    assert held.tags[HOLD_TAG] == "begins"
    assert busy_accounts(instance)[0] == set()

    for instant in (NOW, HONOLULU_BEGINS - timedelta(seconds=1)):
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, resources={"rastro": pinned(instant)}
        )
        meta_cadence_sensor(context)
        assert instance.get_run_by_id(held.run_id).tags[HOLD_TAG] == "begins"
        assert held.run_id not in dequeued(instance)

    context = dg.build_sensor_context(
        instance=instance, definitions=defs, resources={"rastro": pinned(HONOLULU_BEGINS)}
    )
    meta_cadence_sensor(context)
    released = instance.get_run_by_id(held.run_id)
    assert released.status == dg.DagsterRunStatus.QUEUED
    assert released.tags[HOLD_TAG] == "begun"
    assert "Released to the queue: the day it waited for began at 2026-12-08 10:00 UTC" in (
        "\n".join(run_log(instance, held.run_id))
    )
    assert held.run_id in dequeued(instance)

"""What only Dagster shows: jobs whose runs fail in a row, and cadence sensors gone quiet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from rastro_assets.alerts import incidents as found
from rastro_assets.defs.cadence.incidents import _job_label, run_failure_incidents
from rastro_assets.defs.keys import fill_key
from rastro_assets.settings import AlertThresholds

THRESHOLDS = AlertThresholds()


@dg.asset
def flaky(context) -> None:
    if context.run.tags.get("fail") == "yes":
        raise RuntimeError("META_UNAVAILABLE: Meta answered 502 (HTML)\nsecond line")


JOBS = dg.Definitions(assets=[flaky], jobs=[dg.define_asset_job("nightly_publish", [flaky])])


def run(instance, *, fails: bool) -> None:
    JOBS.get_job_def("nightly_publish").execute_in_process(
        instance=instance, raise_on_error=False, tags={"fail": "yes" if fails else "no"}
    )


@pytest.fixture
def account_partitions() -> list[str]:
    return []


def now() -> datetime:
    return datetime.now(UTC)  # the runs are stamped on the instance's wall clock


def test_three_failed_runs_in_a_row_are_one_incident_with_the_latest_error(instance):
    run(instance, fails=True)
    run(instance, fails=True)
    assert run_failure_incidents(instance, now(), THRESHOLDS) == []
    run(instance, fails=True)
    [incident] = run_failure_incidents(instance, now(), THRESHOLDS)
    assert incident.key == "run_failures:nightly_publish"
    assert incident.summary == "the last 3 runs of nightly_publish failed"
    assert "META_UNAVAILABLE: Meta answered 502 (HTML)" in incident.detail
    assert "second line" not in incident.detail


def test_a_good_run_ends_the_streak(instance):
    for _ in range(3):
        run(instance, fails=True)
    run(instance, fails=False)
    assert run_failure_incidents(instance, now(), THRESHOLDS) == []
    # Failures before the good run do not count toward a new streak.
    run(instance, fails=True)
    assert run_failure_incidents(instance, now(), THRESHOLDS) == []


def test_runs_counted_under_their_job_or_their_assets_never_a_fill():
    def labelled(job_name: str, keys: set[dg.AssetKey] | None) -> str | None:
        return _job_label(dg.DagsterRun(job_name=job_name, asset_selection=keys))

    assert labelled("meta_sync_wave", None) == "meta_sync_wave"
    assert labelled("__ASSET_JOB", {dg.AssetKey("ad_catalog")}) == (
        "materializations of ad_catalog"
    )
    # A fill run fails whenever one of its accounts is throttled: the account's incident
    # says that, not a run-failure streak.
    assert labelled("__ASSET_JOB", {fill_key(0)}) is None


def test_a_cadence_sensor_stopped_or_silent():
    at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert found.sensor_incident("meta_cadence", at - timedelta(minutes=9), False, at,
                                 THRESHOLDS) is None
    silent = found.sensor_incident("meta_cadence", at - timedelta(minutes=11), False, at,
                                   THRESHOLDS)
    assert silent is not None and silent.key == "sensor:meta_cadence"
    assert "has not ticked for 11 min" in silent.summary
    stopped = found.sensor_incident("meta_accounts", at, True, at, THRESHOLDS)
    assert stopped is not None and "dagster sensor start meta_accounts" in stopped.fix

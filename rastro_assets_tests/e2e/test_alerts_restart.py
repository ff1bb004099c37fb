"""End to end: a real dagster-daemon restarted after a pause longer than a cadence sensor may
be silent tells its webhook nothing.

The daemon runs until its sensors have ticked, stops, and starts again. The pause is made
longer than `RASTRO_ALERT_SENSOR_MINUTES` (1) by moving what the first daemon stored (every
sensor tick in the Dagster home, the incident check in the warehouse) three minutes back,
as three minutes of downtime would have left them, rather than by waiting them out. The
restarted daemon's checks run past the grace after its start; no notice comes.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.alerts.receivers import webhook_receiver
from rastro_assets_tests.e2e.daemon_harness import (
    SENSOR_INTERVAL_SECONDS,
    backfilled,
    instance_yaml,
    linked_world,
    one_account_world,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PAUSE = timedelta(minutes=3)
GRACE_SECONDS = 2 * SENSOR_INTERVAL_SECONDS + 15
"""The grace after the daemon's start at the harness's sensor interval (`START_GRACE`)."""
CADENCE_SENSORS = ("meta_accounts", "meta_cadence")
INCIDENTS_SENSOR = "meta_incidents"



def checked(warehouse: Warehouse) -> bool:
    with warehouse.connect(read_only=True) as con:
        [[count]] = con.execute("SELECT count(*) FROM alert_checks").fetchall()
    return count > 0


def ticks(home: Path, name: str) -> list[dg.InstigatorTick]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        states = [s for s in instance.all_instigator_state() if s.instigator_name == name]
        if not states:
            return []
        [state] = states
        return list(instance.get_ticks(state.instigator_origin_id, state.selector_id))


def checks_after(home: Path, instant: float) -> list[dg.InstigatorTick]:
    """The incident sensor's finished looks started after `instant`."""
    return [
        tick
        for tick in ticks(home, INCIDENTS_SENSOR)
        if tick.timestamp > instant
        and tick.status.value in ("SUCCESS", "SKIPPED")
        and "the warehouse is busy" not in (tick.skip_reason or "")
    ]


def move_back(home: Path, warehouse: Warehouse, by: timedelta) -> None:
    """What a daemon stopped `by` ago left: its sensors' ticks and its last incident check."""
    seconds = by.total_seconds()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for state in instance.all_instigator_state():
            for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id):
                data = tick.tick_data
                instance.update_tick(
                    tick._replace(  # noqa: SLF001 - a tick as an earlier one was stored
                        tick_data=data._replace(  # noqa: SLF001
                            timestamp=data.timestamp - seconds,
                            end_timestamp=data.end_timestamp and data.end_timestamp - seconds,
                        )
                    )
                )
    with warehouse.connect() as con:
        con.execute(
            "UPDATE alert_checks SET checked_at = checked_at - to_seconds(?)", [int(seconds)]
        )


@pytest.fixture
def alerting_world(tmp_path, secrets_key):
    with webhook_receiver() as hook:
        env = {"RASTRO_ALERT_WEBHOOK_URLS": hook.url, "RASTRO_ALERT_SENSOR_MINUTES": "1"}
        with linked_world(
            tmp_path, secrets_key, one_account_world(), instance_yaml(tmp_path / "dagster_home"),
            extra_env=env, prepare=backfilled,
        ) as linked:
            yield linked, hook


def test_a_daemon_restart_with_no_trouble_sends_no_notice(alerting_world):
    linked, hook = alerting_world
    daemon, home = linked.daemon, linked.home
    warehouse = Warehouse(linked.warehouse.path, lock_wait_seconds=5.0)
    started = time.monotonic()
    try:
        # The instance's storage is made by the daemon: read only once it has checked.
        wait_for("the daemon's first incident check", lambda: checked(warehouse), 120)
        wait_for(
            "the sensors' first ticks and an incident check",
            lambda: all(ticks(home, name) for name in CADENCE_SENSORS)
            and checks_after(home, 0),
            90,
        )
        daemon.stop()
        move_back(home, warehouse, PAUSE)
        silent_for = time.time() - max(ticks(home, "meta_accounts")[0].timestamp, 0)
        assert silent_for >= PAUSE.total_seconds() > 60  # past RASTRO_ALERT_SENSOR_MINUTES

        restarted = time.time()
        daemon.start()
        # The first check after the restart is the daemon's start, as the incidents see it;
        # then checks until one past the grace counted from it.
        def past_the_grace() -> bool:
            looks = sorted(tick.timestamp for tick in checks_after(home, restarted))
            return bool(looks) and looks[-1] > looks[0] + GRACE_SECONDS

        wait_for("an incident check past the grace after the restart", past_the_grace,
                 60 + GRACE_SECONDS)
        looks = checks_after(home, restarted)
        print(
            f"{len(looks)} checks in {time.time() - restarted:.0f} s after the restart; "
            f"{time.monotonic() - started:.0f} s in all"
        )
        assert hook.bodies == [] and hook.refused == []
        assert [t for t in ticks(home, INCIDENTS_SENSOR) if t.status.value == "FAILURE"] == []
        assert all(ticks(home, name)[0].timestamp > restarted for name in CADENCE_SENSORS)
    except AssertionError:
        print(daemon.log.read_text()[-6000:])
        raise
    finally:
        daemon.stop()

"""End to end: a real dagster-daemon tells a webhook nothing across a restart with no trouble,
then tells it, once, that a connection's token died.

One account linked through connection `c1` syncs under a real `dagster-daemon` whose
`RASTRO_ALERT_WEBHOOK_URLS` names a loopback receiver with a secret path. One daemon world
serves both checks, in turn:

- A restart after a pause longer than a cadence sensor may be silent tells nothing. The
  daemon runs until its sensors have ticked, stops, and starts again. The pause is made longer
  than `RASTRO_ALERT_SENSOR_MINUTES` (1) by moving what the first daemon stored (every sensor
  tick in the Dagster home, the incident check in the warehouse) three minutes back, as three
  minutes of downtime would have left them, rather than by waiting them out. The restarted
  daemon's checks run past the grace after its start; no notice comes.
- Then the token dies at Meta; the next sync marks `c1` invalid; within two `meta_incidents`
  ticks the receiver gets one "opened" notice for `token:c1` that names the connection, the
  account and the command that fixes it, and no second one in the ticks after. The webhook's
  secret path reaches no file of the install (Dagster home, logs, warehouse) and nothing the
  daemon printed.

The account's 90-day backfill is recorded as done before the daemon starts: Dagster's
backfill daemon looks at a new partition backfill only every 30 s, which would double the
test's time for nothing it checks. The daemon's own live waves are the syncs here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.alerts.receivers import WEBHOOK_SECRET_PATH, webhook_receiver
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    SENSOR_INTERVAL_SECONDS,
    Daemon,
    LinkedWorld,
    backfilled,
    instance_yaml,
    linked_world,
    one_account_world,
    sync_now,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

INCIDENTS_SENSOR = "meta_incidents"
CADENCE_SENSORS = ("meta_accounts", "meta_cadence")
INCIDENT = "token:c1"
PAUSE = timedelta(minutes=3)
GRACE_SECONDS = 2 * SENSOR_INTERVAL_SECONDS + 15
"""The grace after the daemon's start at the harness's sensor interval (`START_GRACE`)."""
TICK_SLACK_SECONDS = 15.0
"""A tick's own length (the code server's answer, the warehouse read, the POST) on top of
two sensor intervals, as long as it gets on a loaded two-core machine. The exact rule is
the count of ticks between the mark and the notice; the wall-clock bound only catches a
notice that never came in time."""
QUIET_TICKS = 1
"""Ticks after the notice in which nothing more may be told. Dagster's sensor loop turns every
5 s, so a 5-s sensor ticks about every 10 s: each tick waited costs that."""
MARK_POLL_SECONDS = 0.25
NOTICE_POLL_SECONDS = 0.05


@pytest.fixture
def alerting_world(tmp_path, secrets_key):
    with webhook_receiver() as hook:
        env = {"RASTRO_ALERT_WEBHOOK_URLS": hook.url, "RASTRO_ALERT_SENSOR_MINUTES": "1"}
        with linked_world(
            tmp_path, secrets_key, one_account_world(), instance_yaml(tmp_path / "dagster_home"),
            extra_env=env, prepare=backfilled,
        ) as linked:
            yield linked, hook


def live_oks(warehouse: Warehouse) -> int:
    with warehouse.connect(read_only=True) as con:
        [[count]] = con.execute(
            "SELECT count(*) FROM meta_sync_runs WHERE ad_account_id = ?"
            " AND kind IN ('live', 'daily', 'weekly') AND outcome = 'ok'",
            [ACCOUNT],
        ).fetchall()
    return count


def invalid_since(warehouse: Warehouse) -> datetime | None:
    """When `c1` was marked invalid, read through a brief read-only connection."""
    with warehouse.connect(read_only=True) as con:
        [[status, since]] = con.execute(
            "SELECT status, invalid_since FROM meta_connections WHERE connection_id = 'c1'"
        ).fetchall()
    if status != "invalid" or since is None:
        return None
    return since if since.tzinfo else since.replace(tzinfo=UTC)


def checked(warehouse: Warehouse) -> bool:
    with warehouse.connect(read_only=True) as con:
        [[count]] = con.execute("SELECT count(*) FROM alert_checks").fetchall()
    return count > 0


def ticks(home: Path, name: str) -> list[dg.InstigatorTick]:
    """The sensor `name`'s ticks, newest first (none before the daemon stored its state)."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        states = [s for s in instance.all_instigator_state() if s.instigator_name == name]
        if not states:
            return []
        [state] = states
        return list(instance.get_ticks(state.instigator_origin_id, state.selector_id))


def incident_ticks(home: Path) -> list[dg.InstigatorTick]:
    """The `meta_incidents` sensor's ticks, newest first."""
    found = ticks(home, INCIDENTS_SENSOR)
    assert found, f"no {INCIDENTS_SENSOR} tick stored"
    return found


def looks_after(home: Path, instant: float) -> list[dg.InstigatorTick]:
    """The `meta_incidents` ticks started after `instant` (a timestamp) that looked and are
    done: not running, not failed, not skipped for a busy warehouse."""
    return [
        tick
        for tick in ticks(home, INCIDENTS_SENSOR)
        if tick.timestamp > instant
        and tick.status.value in ("SUCCESS", "SKIPPED")
        and "the warehouse is busy" not in (tick.skip_reason or "")
    ]


def failed_ticks(home: Path) -> list[str]:
    """The `meta_incidents` ticks that failed, each as when and why."""
    return [
        f"{tick.timestamp:.0f}: {tick.error.to_string() if tick.error else '?'}"
        for tick in ticks(home, INCIDENTS_SENSOR)
        if tick.status.value == "FAILURE"
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


def about(bodies: list[dict], incident: str) -> list[dict]:
    return [body for body in bodies if body.get("rastro_incident") == incident]


def files_holding(directory: Path, secret: bytes) -> list[Path]:
    return [
        path for path in directory.rglob("*") if path.is_file() and secret in path.read_bytes()
    ]


def a_daemon_restart_with_no_trouble_sends_no_notice(
    daemon: Daemon, home: Path, warehouse: Warehouse, hook
) -> None:
    started = time.monotonic()
    # The instance's storage is made by the daemon: read only once it has checked.
    wait_for("the daemon's first incident check", lambda: checked(warehouse), 120)
    wait_for(
        "the sensors' first ticks and an incident check",
        lambda: all(ticks(home, name) for name in CADENCE_SENSORS) and looks_after(home, 0),
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
        looks = sorted(tick.timestamp for tick in looks_after(home, restarted))
        return bool(looks) and looks[-1] > looks[0] + GRACE_SECONDS

    wait_for("an incident check past the grace after the restart", past_the_grace,
             60 + GRACE_SECONDS)
    looks = looks_after(home, restarted)
    print(
        f"{len(looks)} checks in {time.time() - restarted:.0f} s after the restart; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    assert hook.bodies == [] and hook.refused == [], "a restart with no trouble told something"
    assert failed_ticks(home) == []
    assert all(ticks(home, name)[0].timestamp > restarted for name in CADENCE_SENSORS)


def a_dead_token_is_told_to_the_webhook_once_within_two_ticks(
    linked: LinkedWorld, warehouse: Warehouse, hook
) -> None:
    home = linked.home
    interval = SENSOR_INTERVAL_SECONDS
    allowed = 2 * interval + TICK_SLACK_SECONDS
    wait_for("the account's first live sync", lambda: live_oks(warehouse) > 0, 120)
    assert about(hook.bodies, INCIDENT) == []

    linked.world.kill_token(TOKEN)
    sync_now(warehouse)
    deadline = time.monotonic() + 120
    while (marked_at := invalid_since(warehouse)) is None:
        assert time.monotonic() < deadline, "timed out waiting for c1 to be marked invalid"
        time.sleep(MARK_POLL_SECONDS)
    seen_marked_at = datetime.now(UTC)

    # Waits longer than allowed, to tell how late a late notice is.
    deadline = time.monotonic() + allowed + 30
    while not about(hook.bodies, INCIDENT):
        told = [body.get("rastro_incident") for body in hook.bodies]
        assert time.monotonic() < deadline, f"no {INCIDENT} notice; told: {told}"
        time.sleep(NOTICE_POLL_SECONDS)
    arrived_at = datetime.now(UTC)
    delay = (arrived_at - marked_at).total_seconds()
    # Ticks started between the mark and the notice: the one that told it, or none when
    # that tick had started just before `invalid_since` (a sync's own clock) and read after.
    ticks_between = [
        tick
        for tick in incident_ticks(home)
        if marked_at.timestamp() < tick.timestamp < arrived_at.timestamp()
    ]
    print(
        f"{INCIDENT} told {delay:.1f} s after invalid_since"
        f" ({(arrived_at - seen_marked_at).total_seconds():.1f} s after the test saw it);"
        f" {INCIDENTS_SENSOR} ticks started in between: {len(ticks_between)};"
        f" sensor interval {interval} s, allowed {allowed:.0f} s"
    )
    assert delay <= allowed
    assert len(ticks_between) <= 2

    # More ticks: the incident stays open and is not told again. A notice told twice
    # (its delivery not recorded, a reminder, a resolve and reopen) would come at the
    # first of them.
    wait_for(
        f"{QUIET_TICKS} more {INCIDENTS_SENSOR} ticks",
        lambda: len(looks_after(home, arrived_at.timestamp())) >= QUIET_TICKS,
        2 * QUIET_TICKS * (interval + TICK_SLACK_SECONDS),
    )
    [notice] = about(hook.bodies, INCIDENT)
    assert notice["rastro_event"] == "opened"
    text = notice["text"]
    assert text.startswith("OPEN: ")
    assert "connection c1" in text
    assert ACCOUNT in text
    assert "rastro connect c1" in text
    assert hook.refused == []
    assert failed_ticks(home) == []


def test_a_restart_tells_nothing_then_a_dead_token_is_told_once_within_two_ticks(
    alerting_world, tmp_path
):
    """Both checks on one daemon world, one after the other: the restart first, while
    nothing is wrong; the dead token's notice then comes from the restarted daemon."""
    linked, hook = alerting_world
    daemon = linked.daemon
    # The test's reads give up soon rather than hold up a sync waiting on the file.
    warehouse = Warehouse(linked.warehouse.path, lock_wait_seconds=5.0)
    try:
        a_daemon_restart_with_no_trouble_sends_no_notice(daemon, linked.home, warehouse, hook)
        a_dead_token_is_told_to_the_webhook_once_within_two_ticks(linked, warehouse, hook)
    except AssertionError:
        print(daemon.log.read_text()[-6000:])
        raise
    finally:
        daemon.stop()

    assert daemon.process.poll() is not None
    secret = WEBHOOK_SECRET_PATH.encode()
    assert files_holding(tmp_path, secret) == []
    assert secret not in daemon.log.read_bytes()

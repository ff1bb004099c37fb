"""End to end: a real dagster-daemon tells a webhook, once, that a connection's token died.

One account linked through connection `c1` syncs under a real `dagster-daemon` whose
`RASTRO_ALERT_WEBHOOK_URLS` names a loopback receiver with a secret path. The token dies at
Meta; the next sync marks `c1` invalid; within two `meta_incidents` ticks the receiver gets
one "opened" notice for `token:c1` that names the connection, the account and the command
that fixes it, and no second one in the ticks after. The webhook's secret path reaches no
file of the install (Dagster home, logs, warehouse) and nothing the daemon printed.

The account's 90-day backfill is recorded as done before the daemon starts: Dagster's
backfill daemon looks at a new partition backfill only every 30 s, which would double the
test's time for nothing it checks. The daemon's own live waves are the syncs here.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.alerts.receivers import WEBHOOK_SECRET_PATH, webhook_receiver
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    SENSOR_INTERVAL_SECONDS,
    backfilled,
    instance_yaml,
    linked_world,
    one_account_world,
    sync_now,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

INCIDENTS_SENSOR = "meta_incidents"
INCIDENT = "token:c1"
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
    world = one_account_world()
    config = instance_yaml(tmp_path / "dagster_home")
    with webhook_receiver() as hook:
        env = {"RASTRO_ALERT_WEBHOOK_URLS": hook.url}
        with linked_world(
            tmp_path, secrets_key, world, config, extra_env=env, prepare=backfilled
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


def incident_ticks(home: Path) -> list[dg.InstigatorTick]:
    """The `meta_incidents` sensor's ticks, newest first."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [state] = [
            state
            for state in instance.all_instigator_state()
            if state.instigator_name == INCIDENTS_SENSOR
        ]
        return list(instance.get_ticks(state.instigator_origin_id, state.selector_id))


def looks_after(home: Path, instant: datetime) -> list[dg.InstigatorTick]:
    """The `meta_incidents` ticks started after `instant` that looked and are done: not
    running, not failed, not skipped for a busy warehouse."""
    return [
        tick
        for tick in incident_ticks(home)
        if tick.timestamp > instant.timestamp()
        and tick.status.value in ("SUCCESS", "SKIPPED")
        and "the warehouse is busy" not in (tick.skip_reason or "")
    ]


def about(bodies: list[dict], incident: str) -> list[dict]:
    return [body for body in bodies if body.get("rastro_incident") == incident]


def files_holding(directory: Path, secret: bytes) -> list[Path]:
    return [
        path for path in directory.rglob("*") if path.is_file() and secret in path.read_bytes()
    ]


def test_a_dead_token_is_told_to_the_webhook_once_within_two_ticks(alerting_world, tmp_path):
    linked, hook = alerting_world
    # The test's reads give up soon rather than hold up a sync waiting on the file.
    warehouse = Warehouse(linked.warehouse.path, lock_wait_seconds=5.0)
    daemon, home = linked.daemon, linked.home
    interval = SENSOR_INTERVAL_SECONDS
    allowed = 2 * interval + TICK_SLACK_SECONDS
    try:
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
            lambda: len(looks_after(home, arrived_at)) >= QUIET_TICKS,
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
        assert [tick for tick in incident_ticks(home) if tick.status.value == "FAILURE"] == []
    except AssertionError:
        print(daemon.log.read_text()[-6000:])
        raise
    finally:
        daemon.stop()

    assert daemon.process.poll() is not None
    secret = WEBHOOK_SECRET_PATH.encode()
    assert files_holding(tmp_path, secret) == []
    assert secret not in daemon.log.read_bytes()

"""Which account conditions are incidents, grouped by cause, read from a real warehouse."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from rastro_assets.alerts import incidents as found
from rastro_assets.alerts.incidents import IncidentKind
from rastro_assets.meta.models import Ad
from rastro_assets.planner.history import planned_accounts
from rastro_assets.settings import AlertThresholds, SettingsError
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.catalog import upsert_catalog
from rastro_assets.warehouse.runs import SyncRunEnd, SyncRunStart, finish_sync_runs, start_sync_runs
from rastro_assets_tests.conftest import record_sync_run

LINKED = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TODAY = date(2026, 11, 30)  # in Sao Paulo at NOW
DEFAULTS = AlertThresholds()


@pytest.fixture
def world(warehouse):
    """Connection c1 serves act_1, act_2 (site s1) and act_3 (site s2); c2 serves act_9."""
    with warehouse.connect() as con:
        for site in ("s1", "s2"):
            site_store.add_site(con, site, None, LINKED)
        for connection in ("c1", "c2"):
            registry.save_connection(con, connection, b"\0" * 40, LINKED)
        for site, account, connection in (
            ("s1", "act_1", "c1"), ("s1", "act_2", "c1"), ("s2", "act_3", "c1"),
            ("s1", "act_9", "c2"),
        ):
            link_store.link_account(
                con, site, account, connection, "America/Sao_Paulo", "BRL", LINKED
            )
            # Backfilled, and its today read an hour ago: healthy.
            record_sync_run(
                con, f"fill-{account}", account, "backfill", TODAY - timedelta(days=89), TODAY,
                LINKED + timedelta(minutes=5),
            )
            healthy(con, account, NOW - timedelta(hours=1))
            # It delivers (an ACTIVE ad): read every 45 minutes, not as an idle account.
            upsert_catalog(con, account, [Ad(f"{account}-ad", effective_status="ACTIVE")],
                           LINKED, refile=True)
    return warehouse


def healthy(con, account: str, at: datetime) -> None:
    record_sync_run(con, f"live-{account}-{at:%H%M}", account, "live", TODAY - timedelta(1),
                    TODAY, at)


def incidents_at(warehouse, now=NOW, thresholds=DEFAULTS):
    with warehouse.connect(read_only=True) as con:
        accounts = planned_accounts(con)
        connections = registry.get_connections(con, {a.connection_id for a in accounts})
    return found.account_incidents(
        accounts, now, thresholds,
        connection_errors={c: (x.last_error, x.invalid_since) for c, x in connections.items()},
    )


def test_healthy_accounts_are_no_incident(world):
    assert incidents_at(world) == []


def test_a_dead_token_is_one_incident_naming_its_connection_sites_accounts_and_command(world):
    with world.connect() as con:
        sealed = registry.get_connection(con, "c1").sealed_at
        for account in ("act_1", "act_2", "act_3"):
            record_sync_run(
                con, "wave-x", account, "live", TODAY - timedelta(1), TODAY,
                NOW - timedelta(minutes=20), outcome="token",
                error=f"META_TOKEN_INVALID: Session has expired (fbtrace_id F{account})",
                token_sealed_at=sealed,
            )
        registry.mark_connection_invalid(
            con, "c1", "META_TOKEN_INVALID: Session has expired (fbtrace_id Fc1)",
            NOW - timedelta(minutes=19), token_sealed_at=sealed,
        )
    [incident] = incidents_at(world)
    assert incident.kind == IncidentKind.TOKEN
    assert incident.key == "token:c1"
    assert incident.accounts == ("act_1", "act_2", "act_3")
    assert "connection c1" in incident.summary
    assert "3 accounts" in incident.summary
    assert "sites s1 (2 accounts), s2 (1 account)" in incident.summary
    assert "rastro connect c1" in incident.fix
    assert incident.since == NOW - timedelta(minutes=19)
    # c2's account, on another token, is no part of it.
    assert "act_9" not in incident.detail


def test_stale_after_the_threshold_not_before(world):
    with world.connect() as con:
        healthy(con, "act_9", NOW - timedelta(minutes=10))
    assert incidents_at(world, NOW + timedelta(hours=1, minutes=59)) == []
    [incident] = incidents_at(world, NOW + timedelta(hours=2, minutes=1))
    assert (incident.kind, incident.accounts) == (IncidentKind.STALE, ("act_1", "act_2", "act_3"))


def test_stale_accounts_are_one_incident_per_connection(world):
    both = incidents_at(world, NOW + timedelta(hours=4))
    assert [(i.key, i.accounts) for i in both] == [
        ("stale:c1", ("act_1", "act_2", "act_3")),
        ("stale:c2", ("act_9",)),
    ]
    assert "today last read 5 h ago" in both[0].detail


def test_the_stale_threshold_is_a_setting(world):
    tight = AlertThresholds.from_env({"RASTRO_ALERT_STALE_MINUTES": "90"})
    assert incidents_at(world, NOW + timedelta(minutes=29), tight) == []
    assert {i.key for i in incidents_at(world, NOW + timedelta(minutes=31), tight)} == {
        "stale:c1", "stale:c2"
    }


def test_a_backfill_that_has_not_moved_for_an_hour_is_stuck(warehouse):
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, NOW)
        registry.save_connection(con, "c1", b"\0" * 40, NOW)
        link_store.link_account(con, "s1", "act_5", "c1", "America/Sao_Paulo", "BRL", NOW)
    assert incidents_at(warehouse, NOW + timedelta(minutes=59)) == []
    [stuck] = incidents_at(warehouse, NOW + timedelta(minutes=61))
    assert (stuck.key, stuck.accounts) == ("stuck:c1", ("act_5",))
    assert "0 of 90 days read" in stuck.detail
    # A block read resets the hour.
    with warehouse.connect() as con:
        record_sync_run(con, "b1", "act_5", "backfill", TODAY - timedelta(29), TODAY,
                        NOW + timedelta(minutes=50))
    assert incidents_at(warehouse, NOW + timedelta(minutes=61)) == []
    [again] = incidents_at(warehouse, NOW + timedelta(minutes=115))
    assert "30 of 90 days read" in again.detail


def test_lost_permission_and_a_long_throttle(world):
    with world.connect() as con:
        record_sync_run(con, "w1", "act_1", "live", TODAY - timedelta(1), TODAY,
                        NOW - timedelta(minutes=30), outcome="permission",
                        error="META_PERMISSION: (#200) no permission (fbtrace_id P1)")
        # Every try since its last good read (an hour before NOW) refused.
        for minutes in (-50, 30, 100):
            record_sync_run(con, f"t{minutes}", "act_2", "live", TODAY - timedelta(1), TODAY,
                            NOW + timedelta(minutes=minutes), outcome="throttled",
                            error="RATE_LIMITED: (#80004) too many calls")
    found_now = {i.key: i for i in incidents_at(world, NOW + timedelta(minutes=115))}
    assert found_now["permission:c1"].accounts == ("act_1",)
    assert "fbtrace_id P1" in found_now["permission:c1"].detail
    limited = found_now["rate_limited:c1"]
    assert limited.accounts == ("act_2",)
    assert limited.since == NOW - timedelta(minutes=50)
    assert "for 2 h 45 min" in limited.summary


def throttled(con, run_id: str, account: str, at: datetime, limit: str, regain: timedelta):
    """A live sync of `account` started at `at`, refused a minute later by `limit`."""
    start = SyncRunStart(run_id, account, "live", TODAY - timedelta(1), TODAY, at, False, None)
    ended = at + timedelta(minutes=1)
    end = SyncRunEnd(ended, "throttled", error="RATE_LIMITED: (#613) Calls to this api have"
                     " exceeded the rate limit.", regain_at=ended + regain, rate_limit=limit)
    start_sync_runs(con, [start])
    finish_sync_runs(con, [((run_id, account, start.since), end)])


def test_a_long_throttle_says_which_limit_holds_each_account_and_until_when(world):
    with world.connect() as con:
        for minutes in (-50, 30, 100):
            throttled(con, f"t{minutes}", "act_2", NOW + timedelta(minutes=minutes),
                      "ads_management", timedelta(minutes=20))
    [limited] = incidents_at(world, NOW + timedelta(minutes=115))
    assert limited.key == "rate_limited:c1" and limited.accounts == ("act_2",)
    assert "refused by Meta's rate limits (ads_management) for 2 h 45 min" in limited.summary
    # Held from its last refusal (13:41 UTC) for Meta's 20 minutes and at most a fifth more:
    # the retry in the account's own zone and in UTC, as `rastro status` shows it.
    line = limited.detail
    prefix = "act_2 (sites s1): retried at 2026-11-30 11:0"
    assert line.startswith(prefix)
    minute = int(line[len(prefix)])
    assert minute <= 5
    assert f" America/Sao_Paulo (14:0{minute} UTC), held till then by its ads_management " \
        "business use case (calls an hour) (ads_management)" in line
    assert "`RATE_LIMITED: (#613)" in line
    assert limited.summary.endswith(f"every try; next try at 14:0{minute} UTC")


def test_abuse_prevention_opens_the_incident_at_once(world):
    with world.connect() as con:
        throttled(con, "t1", "act_1", NOW - timedelta(minutes=2), "abuse", timedelta(minutes=5))
    [cut] = incidents_at(world, NOW)
    assert cut.key == "rate_limited:c1" and cut.accounts == ("act_1",)
    assert "(abuse)" in cut.summary
    held_until = cut.detail.split("retried at ")[1][:16]
    assert "2026-11-30 14:59" <= held_until <= "2026-11-30 16:11"  # six hours and jitter
    assert "held till then by Meta's abuse prevention (613 without a subcode" in cut.detail
    assert "UTC), held till then" in cut.detail and "; next try at " in cut.summary


def test_a_short_throttle_is_no_incident(world):
    with world.connect() as con:
        record_sync_run(con, "t1", "act_2", "live", TODAY - timedelta(1), TODAY,
                        NOW - timedelta(minutes=30), outcome="throttled",
                        error="RATE_LIMITED: (#80004) too many calls")
    assert incidents_at(world) == []


def test_the_snapshot_left_behind():
    published = NOW - timedelta(minutes=61)
    incident = found.snapshot_incident(True, published, None, "/x/a.duckdb", NOW, DEFAULTS)
    assert incident is not None and incident.key == "snapshot"
    assert "/x/a.duckdb" in incident.detail
    assert found.snapshot_incident(False, published, None, "/x", NOW, DEFAULTS) is None
    recent = NOW - timedelta(minutes=59)
    assert found.snapshot_incident(True, recent, None, "/x", NOW, DEFAULTS) is None
    never = found.snapshot_incident(True, None, NOW - timedelta(hours=2), "/x", NOW, DEFAULTS)
    assert never is not None and "never published" in never.summary


def test_a_daemon_that_stopped_checking():
    assert found.daemon_incident(None, NOW, DEFAULTS) is None
    assert found.daemon_incident(NOW - timedelta(minutes=9), NOW, DEFAULTS) is None
    late = found.daemon_incident(NOW - timedelta(minutes=11), NOW, DEFAULTS)
    assert late is not None and late.key == "daemon"


@pytest.mark.parametrize(
    "variable, value",
    [("RASTRO_ALERT_STALE_MINUTES", "0"), ("RASTRO_ALERT_REMIND_MINUTES", "soon"),
     ("RASTRO_ALERT_RUN_FAILURES", "-1")],
)
def test_a_bad_threshold_names_its_variable(variable, value):
    with pytest.raises(SettingsError, match=variable):
        AlertThresholds.from_env({variable: value})

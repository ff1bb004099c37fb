"""`rastro status --check`: exit 0, 1 or 2, for cron, systemd and probes."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets.analytics.publish import Publisher
from rastro_assets.meta.models import Ad
from rastro_assets.warehouse import incidents as store
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.catalog import upsert_catalog
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.conftest import record_sync_run

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TODAY = date(2026, 11, 30)


@pytest.fixture
def now() -> datetime:
    return NOW


DAYS = [TODAY - timedelta(days=back) for back in range(89, -1, -1)]


def record_days(instance: dg.DagsterInstance, days) -> None:
    """act_1's days in both spend assets, as its runs record them."""
    for day in days:
        for asset in ("ad_spend_daily", "site_spend_daily"):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key=asset, partition=f"act_1|{day}")
            )


@pytest.fixture(scope="module")
def recorded_home(tmp_path_factory) -> Path:
    """A Dagster home whose spend assets record every day `healthy` holds of act_1."""
    home = tmp_path_factory.mktemp("recorded_home")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("meta_ad_account", ["act_1"])
        record_days(instance, DAYS)
    return home


@pytest.fixture
def dagster_home(recorded_home, tmp_path) -> Path:
    home = tmp_path / "dagster_home"
    shutil.copytree(recorded_home, home)
    return home


@pytest.fixture
def rastro_environ(duckdb_path, dagster_home) -> dict[str, str]:
    return {"RASTRO_DUCKDB_PATH": str(duckdb_path), "DAGSTER_HOME": str(dagster_home)}


@pytest.fixture
def healthy(warehouse, duckdb_path) -> Warehouse:
    """act_1 of connection c1 (site s1): backfilled, its today read 10 minutes ago, the
    snapshot published after, and the daemon's last check a minute ago; in the DuckDB file,
    or on PostgreSQL where a test asks for both engines."""
    linked = NOW - timedelta(hours=2)
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, linked)
        registry.save_connection(con, "c1", b"\0" * 40, linked)
        link_store.link_account(con, "s1", "act_1", "c1", "America/Sao_Paulo", "BRL", linked)
        record_sync_run(con, "fill", "act_1", "backfill", TODAY - timedelta(89), TODAY,
                        linked + timedelta(minutes=5))
        record_sync_run(con, "live", "act_1", "live", TODAY - timedelta(1), TODAY,
                        NOW - timedelta(minutes=10))
        upsert_catalog(con, "act_1", [Ad("ad-1", effective_status="ACTIVE")], linked,
                       refile=True)
        store.record_check(con, store.DAEMON_CHECKER, NOW - timedelta(minutes=1))
    Publisher(warehouse, duckdb_path.parent / "analytics.duckdb").publish()
    return warehouse


@pytest.mark.engines("duckdb", "postgres")
def test_exit_0_when_nothing_needs_a_person(rastro, healthy):
    code, out, err = rastro("status", "--check")
    assert (code, err) == (0, "")
    assert out == "ok: 1 linked account, no open incidents\n"
    code, out, err = rastro("status", "--check", "--json")
    assert (code, json.loads(out), err) == (0, [], "")


@pytest.mark.engines("duckdb", "postgres")
def test_exit_1_with_one_line_per_open_incident(rastro, healthy):
    with healthy.connect() as con:
        sealed = registry.get_connection(con, "c1").sealed_at
        registry.mark_connection_invalid(
            con, "c1", "META_TOKEN_INVALID: Session has expired (fbtrace_id F1)", NOW,
            token_sealed_at=sealed,
        )
        # A write after the last publish, two hours ago by the publisher's own clock: the
        # snapshot owes it.
        record_sync_run(con, "live2", "act_1", "live", TODAY - timedelta(1), TODAY,
                        NOW - timedelta(minutes=5))
        con.execute("UPDATE analytics_snapshot_state SET published_at = ?",
                    [datetime.now(UTC) - timedelta(hours=2)])
    # Five hours on: the token is dead, the snapshot behind, and the daemon stopped checking.
    later = NOW + timedelta(hours=5)
    code, out, err = rastro("status", "--check", at=later)
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["daemon", "snapshot", "token"]
    token = lines[2]
    assert token.startswith("token:c1: connection c1's token is invalid: it pauses 1 account")
    assert "`rastro connect c1`" in token

    code, out, err = rastro("status", "--check", "--json", at=later)
    assert code == 1
    incidents = {entry["key"]: entry for entry in json.loads(out)}
    assert set(incidents) == {"daemon", "snapshot", "token:c1"}
    assert incidents["token:c1"]["accounts"] == ["act_1"]
    assert incidents["token:c1"]["kind"] == "token"


def test_what_only_the_daemon_sees_comes_from_its_stored_incidents(rastro, healthy):
    with healthy.connect() as con:
        store.insert_incident(con, store.StoredIncident(
            key="run_failures:meta_sync_wave", opened_at=NOW, kind="run_failures",
            summary="the last 3 runs of meta_sync_wave failed", detail="", fix="look",
            accounts=(), last_seen_at=NOW, notified_at=NOW,
        ))
    code, out, _ = rastro("status", "--check")
    assert code == 1
    assert out.startswith("run_failures:meta_sync_wave: the last 3 runs of meta_sync_wave")


def test_a_setting_the_daemon_refused_is_said_even_where_the_probe_reads_a_good_one(
    rastro, healthy
):
    with healthy.connect() as con:
        store.insert_incident(con, store.StoredIncident(
            key="settings", opened_at=NOW, kind="settings",
            summary="the code location refused 1 setting and reads the default instead:"
            " RASTRO_SYNC_LEASE_SECONDS must be a whole number of seconds from 1 to 86,400,"
            " not 'abc'", detail="", fix="correct it", accounts=(), last_seen_at=NOW,
            notified_at=NOW,
        ))
    code, out, _ = rastro("status", "--check")
    assert code == 1
    assert out.startswith("settings: the code location refused 1 setting")


def test_exit_2_when_it_cannot_tell(rastro, duckdb_path, tmp_path):
    code, out, err = rastro("status", "--check")
    assert (code, out) == (2, "")
    assert err.strip() == (
        f"rastro: error: cannot tell: no warehouse at {os.path.abspath(duckdb_path)} "
        "(RASTRO_DUCKDB_PATH names another file)"
    )
    assert not duckdb_path.exists()  # looking created nothing

    code, out, err = rastro("status", "--check", "--json")
    assert (code, json.loads(out)) == (2, [])

    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"not a database" * 100)
    code, out, err = rastro("status", "--check", environ={"RASTRO_DUCKDB_PATH": str(garbage)})
    assert code == 2
    assert err.startswith(f"rastro: error: cannot tell: the warehouse at {garbage}")

    for value in ("soon", "99999999999999999999"):
        code, _, err = rastro(
            "status", "--check", environ={"RASTRO_ALERT_STALE_MINUTES": value}
        )
        [line] = err.splitlines()
        assert code == 2
        assert line.startswith("rastro: error: cannot tell: RASTRO_ALERT_STALE_MINUTES")
        assert repr(value) in line and "from 1 to 5,256,000" in line


def test_a_change_made_just_now_after_a_quiet_spell_is_not_a_late_snapshot(rastro, healthy):
    wall = datetime.now(UTC)  # publishes are stamped on the publisher's own clock
    with healthy.connect() as con:
        con.execute("UPDATE analytics_snapshot_state SET published_at = ?",
                    [wall - timedelta(hours=3)])
        record_sync_run(con, "live-now", "act_1", "live", TODAY - timedelta(1), TODAY,
                        wall - timedelta(minutes=1))
    code, out, _ = rastro("status", "--check")
    assert (code, out) == (0, "ok: 1 linked account, no open incidents\n")
    with healthy.connect() as con:
        record_sync_run(con, "live-then", "act_1", "live", TODAY - timedelta(1), TODAY,
                        wall - timedelta(minutes=61))
    code, out, _ = rastro("status", "--check")
    assert code == 1
    assert out.startswith("snapshot: the analytics snapshot is behind the warehouse by 1 h")


def test_exit_2_without_the_dagster_instance_it_compares_the_warehouse_with(
    rastro, healthy, tmp_path
):
    code, out, err = rastro("status", "--check", environ={"DAGSTER_HOME": ""})
    assert (code, out) == (2, "")
    assert err.startswith("rastro: error: cannot tell: DAGSTER_HOME is not set")
    assert len(err.splitlines()) == 1
    missing = tmp_path / "nowhere"
    code, out, err = rastro("status", "--check", environ={"DAGSTER_HOME": str(missing)})
    assert (code, out) == (2, "")
    assert err.strip() == f"rastro: error: cannot tell: DAGSTER_HOME names no directory: {missing}"
    assert not missing.exists()


@pytest.mark.engines("duckdb", "postgres")
def test_stored_days_dagster_does_not_record_are_open_until_recorded(
    rastro, healthy, tmp_path, monkeypatch, duckdb_path, dagster_home
):
    home = tmp_path / "empty_home"
    home.mkdir()
    environ = {"DAGSTER_HOME": str(home)}
    # An instance that holds no partition of act_1, then one that holds it unrecorded.
    for placed in (False, True):
        if placed:
            with dg.DagsterInstance.from_config(str(home)) as instance:
                instance.add_dynamic_partitions("meta_ad_account", ["act_1"])
        code, out, err = rastro("status", "--check", environ=environ)
        assert (code, err) == (1, "")
        assert out.startswith(
            "unrecorded: 90 account-days the warehouse holds from a complete read are not "
            "recorded as materialized in Dagster, of 1 account: act_1 (90); "
            "the meta_records sensor records them"
        ), out
        code, out, _ = rastro("status", "--check", "--json", environ=environ)
        [incident] = json.loads(out)
        assert (incident["kind"], incident["accounts"]) == ("unrecorded", ["act_1"])

    # Every day recorded but one read since, first stored less than an hour ago: it waits
    # for the sensor's next ticks, and is an incident once it has waited an hour.
    environ = {"DAGSTER_HOME": str(dagster_home)}
    extra = TODAY - timedelta(days=95)
    with healthy.connect() as con:
        record_sync_run(con, "manual", "act_1", "manual", extra, extra, NOW - timedelta(minutes=9))
    code, out, _ = rastro("status", "--check", environ=environ)
    assert (code, out) == (0, "ok: 1 linked account, no open incidents\n")
    with healthy.connect() as con:
        con.execute("UPDATE meta_sync_runs SET finished_at = ? WHERE run_id = 'manual'",
                    [NOW - timedelta(minutes=61)])
    code, out, _ = rastro("status", "--check", environ=environ)
    assert code == 1 and out.startswith("unrecorded: 1 account-day the warehouse holds"), out

    from rastro_assets.defs.cadence.recorder import build_meta_records_sensor
    from rastro_assets_tests.pinned import pinned
    meta_records_sensor = build_meta_records_sensor(1)

    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(duckdb_path))
    if (url := getattr(healthy, "url_with_password", None)) is not None:
        monkeypatch.setenv("RASTRO_WAREHOUSE_URL", url)
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        context = dg.build_sensor_context(instance=instance, resources={"rastro": pinned(NOW)})
        for event in meta_records_sensor(context).asset_events:
            instance.report_runless_asset_event(event)
    code, out, _ = rastro("status", "--check", environ=environ)
    assert (code, out) == (0, "ok: 1 linked account, no open incidents\n")

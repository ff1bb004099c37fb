"""The contract's environment variables, read in one place."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

from rastro_assets import settings
from rastro_assets.process_settings import NotTheSnapshot, Settings
from rastro_assets.settings import SettingsError, idle_live_interval_minutes, partitions_start


def test_the_snapshot_sits_beside_the_pipeline_file_by_default():
    repo = Path(__file__).resolve().parents[1]
    assert Settings.from_env({}, cwd=repo).snapshot_path == str(repo / "data/analytics.duckdb")
    moved = Settings.from_env({"RASTRO_DUCKDB_PATH": "/srv/rastro/rastro.duckdb"})
    assert moved.snapshot_path == "/srv/rastro/analytics.duckdb"
    chosen = Settings.from_env({"RASTRO_ANALYTICS_PATH": "/srv/share/ads.duckdb"})
    assert chosen.snapshot_path == "/srv/share/ads.duckdb"


def test_mode_and_lag_are_read_and_checked():
    settings = Settings.from_env(
        {"RASTRO_ANALYTICS_MODE": "0640", "RASTRO_ANALYTICS_LAG_SECONDS": "120"}
    )
    assert (settings.analytics_mode, settings.analytics_lag_seconds) == (0o640, 120)
    assert Settings.from_env({}).analytics_mode == 0o644
    for name, bad in (
        ("RASTRO_ANALYTICS_MODE", "rw-r--r--"),
        ("RASTRO_ANALYTICS_MODE", "0044"),
        ("RASTRO_ANALYTICS_LAG_SECONDS", "5"),
        ("RASTRO_ANALYTICS_LAG_SECONDS", "soon"),
    ):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: bad})


def test_the_snapshot_may_never_be_the_pipeline_file():
    with pytest.raises(SettingsError, match="pipeline's own file"):
        Settings.from_env(
            {"RASTRO_DUCKDB_PATH": "data/x.duckdb", "RASTRO_ANALYTICS_PATH": "./data/x.duckdb"}
        )


def test_another_name_of_the_pipeline_file_is_refused_too(tmp_path: Path):
    pipeline = tmp_path / "rastro.duckdb"
    pipeline.write_bytes(b"")
    (tmp_path / "analytics.duckdb").symlink_to(pipeline)
    with pytest.raises(NotTheSnapshot, match="pipeline's own file"):
        Settings(duckdb_path=str(pipeline))


def test_the_idle_live_interval_defaults_to_three_hours_and_never_undercuts_45_minutes():
    assert idle_live_interval_minutes(None) == idle_live_interval_minutes("") == 180
    assert idle_live_interval_minutes("45") == 45  # idling off
    assert idle_live_interval_minutes("240") == 240
    for bad in ("30", "0", "-180", "3h", "90.5"):
        with pytest.raises(SettingsError, match="RASTRO_IDLE_LIVE_INTERVAL_MINUTES"):
            idle_live_interval_minutes(bad)


def test_the_partitions_start_in_august_2026_unless_a_deployment_wants_older_days():
    assert partitions_start(None) == partitions_start("") == date(2026, 8, 1)
    assert partitions_start("2025-01-01") == date(2025, 1, 1)
    for bad in ("2025-13-01", "last year", "20250101x"):
        with pytest.raises(SettingsError, match="RASTRO_PARTITIONS_START"):
            partitions_start(bad)


def test_a_shard_takes_100_accounts_unless_the_operator_chooses_another_size():
    assert Settings.from_env({}).shard_accounts == 100
    assert Settings.from_env({"RASTRO_SHARD_ACCOUNTS": "50"}).shard_accounts == 50
    for bad in ("0", "fifty", "10001"):
        with pytest.raises(SettingsError, match="RASTRO_SHARD_ACCOUNTS"):
            Settings.from_env({"RASTRO_SHARD_ACCOUNTS": bad})


@pytest.mark.parametrize(
    ("read", "name", "raw"),
    [
        (settings.sensor_interval_override_seconds, "RASTRO_SENSOR_INTERVAL_SECONDS", "abc"),
        (settings.sensor_interval_override_seconds, "RASTRO_SENSOR_INTERVAL_SECONDS", "-5"),
        (settings.sync_lease_seconds, "RASTRO_SYNC_LEASE_SECONDS", "x"),
        (settings.sync_lease_seconds, "RASTRO_SYNC_LEASE_SECONDS", "0"),
        (settings.account_shards, "RASTRO_ACCOUNT_SHARDS", "abc"),
        (settings.account_shards, "RASTRO_ACCOUNT_SHARDS", "0"),
        (settings.partitions_start, "RASTRO_PARTITIONS_START", "yesterday"),
        (settings.idle_live_interval_minutes, "RASTRO_IDLE_LIVE_INTERVAL_MINUTES", "1"),
    ],
)
def test_each_setting_read_when_the_code_loads_names_itself_and_the_bad_value(read, name, raw):
    with pytest.raises(settings.SettingsError) as refused:
        read(raw)
    assert name in str(refused.value) and repr(raw) in str(refused.value)


def test_the_sensor_override_and_the_lease_keep_their_defaults_and_read_whole_seconds():
    assert settings.sensor_interval_override_seconds(None) == 0
    assert settings.sensor_interval_override_seconds("5") == 5
    assert settings.sync_lease_seconds("") == 15 * 60
    assert settings.sync_lease_seconds("20") == 20


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("RASTRO_RETENTION_INTERVAL_SECONDS", "soon"),
        ("RASTRO_RETENTION_INTERVAL_SECONDS", "0"),
        ("RASTRO_RUN_RETENTION_HOURS", "x"),
        ("RASTRO_RUN_RETENTION_HOURS", "-1"),
        ("RASTRO_SYNC_RUN_RETENTION_DAYS", "nan"),
        ("RASTRO_SYNC_RUN_RETENTION_DAYS", "inf"),
    ],
)
def test_a_bad_retention_names_its_variable_and_value(name, raw):
    with pytest.raises(settings.SettingsError) as refused:
        settings.Retention.from_env({name: raw})
    assert name in str(refused.value) and repr(raw) in str(refused.value)


def test_retention_reads_fractions_and_keeps_its_defaults():
    assert settings.Retention.from_env({}) == settings.Retention()
    kept = settings.Retention.from_env({"RASTRO_RUN_RETENTION_HOURS": "0.5",
                                        "RASTRO_SYNC_RUN_RETENTION_DAYS": "7"})
    assert (kept.runs, kept.sync_runs) == (timedelta(minutes=30), timedelta(days=7))


LOADER = """
import sys
import rastro_assets.settings  # a bad value must not break the import itself
import rastro_assets.definitions
"""


def test_the_code_location_fails_to_load_with_the_setting_named_in_one_line():
    env = {**os.environ, "RASTRO_ACCOUNT_SHARDS": "abc"}
    result = subprocess.run([sys.executable, "-c", LOADER], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "rastro_assets.settings.SettingsError: RASTRO_ACCOUNT_SHARDS must be a whole number"
        " from 1 to 500, not 'abc'"
    )

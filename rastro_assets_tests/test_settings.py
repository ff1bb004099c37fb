"""The contract's environment variables, read in one place."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from rastro_assets.settings import (
    NotTheSnapshot,
    Settings,
    SettingsError,
    idle_live_interval_minutes,
    partitions_start,
)


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

"""The contract's environment variables, read in one place."""

from __future__ import annotations

import pytest

from rastro_assets.settings import Settings, SettingsError


def test_the_snapshot_sits_beside_the_pipeline_file_by_default():
    assert Settings.from_env({}).snapshot_path == "data/analytics.duckdb"
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

"""The contract's environment variables, read in one place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
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


HUGE = "99999999999999999999"


def _through_settings(name: str) -> Callable[[str], object]:
    return lambda raw: Settings.from_env({name: raw})


def _through_retention(name: str) -> Callable[[str], object]:
    return lambda raw: settings.Retention.from_env({name: raw})


def _through_thresholds(name: str) -> Callable[[str], object]:
    return lambda raw: settings.AlertThresholds.from_env({name: raw})


# Every numeric setting, read the way the product reads it, and the range its refusal names.
NUMERIC_SETTINGS = {
    "RASTRO_SENSOR_INTERVAL_SECONDS": (settings.sensor_interval_override_seconds, "0", "3,600"),
    "RASTRO_SYNC_LEASE_SECONDS": (settings.sync_lease_seconds, "1", "86,400"),
    "RASTRO_IDLE_LIVE_INTERVAL_MINUTES": (settings.idle_live_interval_minutes, "45", "1,440"),
    "RASTRO_ACCOUNT_SHARDS": (_through_settings("RASTRO_ACCOUNT_SHARDS"), "1", "500"),
    "RASTRO_SHARD_ACCOUNTS": (_through_settings("RASTRO_SHARD_ACCOUNTS"), "1", "10,000"),
    "RASTRO_ANALYTICS_LAG_SECONDS": (
        _through_settings("RASTRO_ANALYTICS_LAG_SECONDS"), "30", "604,800"
    ),
    "RASTRO_ANALYTICS_MODE": (_through_settings("RASTRO_ANALYTICS_MODE"), "0400", "0777"),
    "RASTRO_RETENTION_INTERVAL_SECONDS": (
        _through_retention("RASTRO_RETENTION_INTERVAL_SECONDS"), "1", "86,400"
    ),
    "RASTRO_RUN_RETENTION_HOURS": (_through_retention("RASTRO_RUN_RETENTION_HOURS"), "0", "87,600"),
    "RASTRO_SYNC_RUN_RETENTION_DAYS": (
        _through_retention("RASTRO_SYNC_RUN_RETENTION_DAYS"), "0", "3,650"
    ),
    **{
        name: (_through_thresholds(name), "1", "5,256,000")
        for name in (
            "RASTRO_ALERT_STALE_MINUTES",
            "RASTRO_ALERT_STUCK_MINUTES",
            "RASTRO_ALERT_RATE_LIMITED_MINUTES",
            "RASTRO_ALERT_SNAPSHOT_MINUTES",
            "RASTRO_ALERT_SENSOR_MINUTES",
            "RASTRO_ALERT_REMIND_MINUTES",
        )
    },
    "RASTRO_ALERT_RUN_FAILURES": (_through_thresholds("RASTRO_ALERT_RUN_FAILURES"), "1", "100"),
}


@pytest.mark.parametrize("raw", [HUGE, "-1", "abc", "1e400", "0x10"])
@pytest.mark.parametrize("name", sorted(NUMERIC_SETTINGS))
def test_every_numeric_setting_refuses_what_is_out_of_its_range_in_one_line(name, raw):
    read, least, most = NUMERIC_SETTINGS[name]
    with pytest.raises(SettingsError) as refused:
        read(raw)
    [line] = str(refused.value).splitlines()
    assert line.startswith(f"{name} must be ") and line.endswith(f"not {raw!r}"), line
    assert least in line and most in line, line


@pytest.mark.parametrize("name", sorted(NUMERIC_SETTINGS))
def test_every_numeric_setting_takes_both_ends_of_its_range(name):
    read, least, most = NUMERIC_SETTINGS[name]
    lowest = "1" if name.endswith("RETENTION_HOURS") or name.endswith("RETENTION_DAYS") else least
    for raw in (lowest, most.replace(",", "")):
        read(raw)


def test_a_huge_value_is_shown_cut_with_its_length():
    raw = "9" * 5000
    with pytest.raises(SettingsError) as refused:
        settings.sync_lease_seconds(raw)
    message = str(refused.value)
    assert message.endswith(f"not {'9' * 24!r}... (5,000 characters)") and len(message) < 200


@pytest.mark.parametrize("raw", ["1999-12-31", "9999-12-31", "0001-01-01"])
def test_the_partitions_start_within_this_century(raw):
    with pytest.raises(SettingsError, match="from 2000-01-01 to 2099-12-31"):
        partitions_start(raw)


# Loads the code location as a code server does, then ticks the retention and incident
# sensors as the daemon would, on the warehouse of RASTRO_DUCKDB_PATH.
LOADER = """
import json
import os
import dagster as dg
import rastro_assets.settings  # a bad value must not break the import itself
from rastro_assets.definitions import defs
from rastro_assets.defs.cadence.incidents import INCIDENTS_SENSOR
from rastro_assets.defs.resources import RastroResource
from rastro_assets.settings import SettingsError
from rastro_assets.warehouse import incidents as store
from rastro_assets.warehouse.connection import Warehouse

said = {"sensors": sorted(sensor.name for sensor in defs.sensors)}
with dg.DagsterInstance.ephemeral() as instance:
    for name in ("retention", INCIDENTS_SENSOR):
        sensor = defs.get_sensor_def(name)
        context = dg.build_sensor_context(
            instance=instance, repository_name="__repository__", sensor_name=name,
            definitions=defs, resources={"rastro": RastroResource()},
        )
        try:
            with context:
                result = sensor(context)
            said[name] = getattr(result, "skip_message", None) or "ticked"
        except SettingsError as exc:
            said[name] = f"refused: {exc}"
with Warehouse(os.environ["RASTRO_DUCKDB_PATH"]).connect(read_only=True) as con:
    said["incidents"] = {i.key: i.summary for i in store.open_incidents(con)}
print(json.dumps(said))
"""
SENSORS = [
    "analytics_publisher",
    "meta_accounts",
    "meta_cadence",
    "meta_incidents",
    "meta_records",
    "retention",
]


def _load(warehouse, **variables: str) -> dict:
    env = {**os.environ, "RASTRO_DUCKDB_PATH": str(warehouse.path), **variables}
    result = subprocess.run([sys.executable, "-c", LOADER], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_a_bad_retention_loads_deletes_nothing_and_opens_an_incident(warehouse):
    name = "RASTRO_RUN_RETENTION_HOURS"
    said = _load(warehouse, **{name: HUGE})
    assert said["sensors"] == SENSORS
    refusal = f"{name} must be a number of"
    assert said["retention"].startswith(f"nothing is deleted: {refusal}"), said
    assert HUGE in said["retention"]
    assert said["meta_incidents"] == "ticked"
    assert refusal in said["incidents"]["settings"] and HUGE in said["incidents"]["settings"]


def test_a_bad_lease_loads_with_the_default_and_opens_an_incident(warehouse):
    said = _load(warehouse, RASTRO_SYNC_LEASE_SECONDS="abc")
    assert said["sensors"] == SENSORS
    assert said["incidents"]["settings"].endswith(
        "reads the default instead: RASTRO_SYNC_LEASE_SECONDS must be a whole number of"
        " seconds from 1 to 86,400, not 'abc'"
    )


@pytest.mark.parametrize(
    ("name", "raw"), [("RASTRO_ACCOUNT_SHARDS", "abc"), ("RASTRO_PARTITIONS_START", "-1")]
)
def test_a_bad_setting_that_shapes_the_definitions_loads_and_stops_every_tick(
    warehouse, name, raw
):
    said = _load(warehouse, **{name: raw})
    assert said["sensors"] == SENSORS
    for sensor in ("retention", "meta_incidents"):
        assert said[sensor].startswith(f"refused: {name} must be "), said
        assert said[sensor].endswith(f"not {raw!r}"), said


def test_the_running_guide_gives_every_numeric_setting_its_range():
    guide = (Path(__file__).resolve().parents[1] / "docs/running.md").read_text()
    section = guide[guide.index("\n## Settings\n"):].split("\n\n")
    table = next(chunk for chunk in section if chunk.startswith("| variable"))
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    for name, (_, least, most) in NUMERIC_SETTINGS.items():
        row = rows.get(f"`{name}`") or rows.get(f"`{name}` (octal)")
        if name.startswith("RASTRO_ALERT_") and name.endswith("_MINUTES"):
            row = rows["the `RASTRO_ALERT_*_MINUTES` thresholds"]
        assert row is not None, name
        assert most in row and least in row, row


@pytest.mark.parametrize(
    "raw",
    [
        "mysql://rastro:s3cretPass@db.example/rastro",
        "rastro:s3cretPass@db.example/rastro",
        "postgresql://rastro:s3cretPass@db.example:five432/rastro",
        "postgresql://rastro:s3cretPass@[::1/rastro",
    ],
)
def test_a_malformed_warehouse_url_is_refused_in_one_line_that_hides_it(raw: str):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"RASTRO_WAREHOUSE_URL": raw})
    message = str(refused.value)
    assert "RASTRO_WAREHOUSE_URL" in message and "\n" not in message
    assert "s3cretPass" not in message


def test_the_warehouse_url_is_read_when_set_and_never_shown():
    url = "postgresql://rastro:s3cretPass@db.example:5432/rastro?sslmode=require"
    settings = Settings.from_env({"RASTRO_WAREHOUSE_URL": f"  {url} "})
    assert settings.warehouse_url == url
    assert "s3cretPass" not in repr(settings)
    assert Settings.from_env({"RASTRO_WAREHOUSE_URL": " "}).warehouse_url is None

"""Every variable of the environment the product reads, declared once (`VARIABLES`: its
name, type, default, check and meaning), and the only place that reads the environment
(`environment`); the values fixed when the code loads (`load_time`); where the project's
files are when no variable names them; and the alert thresholds. How each value is checked,
and the error a bad one raises, is in `setting_checks.py`; `Settings`, what a process runs
with (its files, the Graph, the shards), is in `process_settings.py`, and reads its
variables through here.

A reader asks its variable's declaration (`RASTRO_SHARD_ACCOUNTS.read(environ)`), with an
environment given as a mapping (so a test builds settings without touching `os.environ`)
or, when none is given, this process's own.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from rastro_assets.setting_checks import (
    DEFAULT_ACCOUNT_SHARDS,
    DEFAULT_ALERT_RUN_FAILURES,
    DEFAULT_ANALYTICS_LAG_SECONDS,
    DEFAULT_ANALYTICS_MODE,
    DEFAULT_ANALYTICS_STORAGE_VERSION,
    DEFAULT_GRAPH_URL,
    DEFAULT_IDLE_LIVE_INTERVAL_MINUTES,
    DEFAULT_OUTPUT_MAX_MB,
    DEFAULT_PARTITIONS_START,
    DEFAULT_SHARD_ACCOUNTS,
    DEFAULT_SYNC_LEASE_SECONDS,
    SettingsError,
    account_shards,
    alert_minutes,
    alert_run_failures,
    graph_url,
    idle_live_interval_minutes,
    lag_seconds,
    octal_mode,
    partitions_start,
    retention_interval_seconds,
    run_retention_hours,
    sensor_interval_override_seconds,
    shard_accounts,
    sql_output_max_mb,
    storage_version,
    stripped,
    switch,
    sync_lease_seconds,
    sync_run_retention_days,
    text,
    warehouse_url,
)

# Readers ask this module for the checks' constants and helpers too.
from rastro_assets.setting_checks import DEFAULT_DUCKDB_PATH as DEFAULT_DUCKDB_PATH
from rastro_assets.setting_checks import LIVE_INTERVAL_MINUTES as LIVE_INTERVAL_MINUTES
from rastro_assets.setting_checks import MAX_ALERT_MINUTES as MAX_ALERT_MINUTES
from rastro_assets.setting_checks import shown_value as shown_value
from rastro_assets.setting_checks import whole_number as whole_number

ANALYTICS_FILE_NAME = "analytics.duckdb"


@dataclass(frozen=True)
class Retention:
    """How long the instance keeps runs and the warehouse keeps `meta_sync_runs` rows."""

    sensor_seconds: int = 3600
    runs: timedelta = timedelta(hours=24)
    sync_runs: timedelta = timedelta(days=35)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Retention:
        """From the environment; a SettingsError names the first variable with a bad value."""
        return cls(
            sensor_seconds=RASTRO_RETENTION_INTERVAL_SECONDS.read(environ),
            runs=timedelta(hours=RASTRO_RUN_RETENTION_HOURS.read(environ)),
            sync_runs=timedelta(days=RASTRO_SYNC_RUN_RETENTION_DAYS.read(environ)),
        )


@dataclass(frozen=True)
class LoadTime:
    """The values read from the environment when the code loads, and fixed from then on: the
    sensors' intervals, the lease, the retention, the partitions' first date and the shards
    (each a pair of assets) are fixed at definition time, so a new value applies at the code
    location's next restart."""

    sensor_interval_override_seconds: int = 0
    sync_lease_seconds: int = DEFAULT_SYNC_LEASE_SECONDS
    retention: Retention = Retention()
    partitions_start: date = date.fromisoformat(DEFAULT_PARTITIONS_START)
    idle_live_interval_minutes: int = DEFAULT_IDLE_LIVE_INTERVAL_MINUTES
    account_shards: int = DEFAULT_ACCOUNT_SHARDS
    refusals: Mapping[str, str] = field(default_factory=dict)
    """Each refused value, by its field's name: the one line naming the variable, the value
    and the range. A refused value is read as its default."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoadTime:
        """The values of the environment. A bad value never raises here: the code location
        must load whatever the environment holds, or the daemon would lose every sensor."""
        defaults = cls()
        readers: dict[str, Callable[[], object]] = {
            "sensor_interval_override_seconds": (
                lambda: RASTRO_SENSOR_INTERVAL_SECONDS.read(environ)
            ),
            "sync_lease_seconds": lambda: RASTRO_SYNC_LEASE_SECONDS.read(environ),
            "retention": lambda: Retention.from_env(environ),
            "partitions_start": lambda: RASTRO_PARTITIONS_START.read(environ),
            "idle_live_interval_minutes": lambda: RASTRO_IDLE_LIVE_INTERVAL_MINUTES.read(environ),
            "account_shards": lambda: RASTRO_ACCOUNT_SHARDS.read(environ),
        }
        values: dict[str, object] = {}
        refusals: dict[str, str] = {}
        for name, read in readers.items():
            try:
                values[name] = read()
            except SettingsError as exc:
                refusals[name] = str(exc)
                values[name] = getattr(defaults, name)
        return cls(**values, refusals=refusals)  # type: ignore[arg-type]


# Those whose default would define other assets or partitions than the operator's: work
# done on them would be a guess, so it stops until the value is corrected.
DEFINING_SETTINGS = ("partitions_start", "account_shards")


@functools.cache
def load_time() -> LoadTime:
    """This process's values read when the code loads, read at the first call (never when
    this module is imported) and kept. A refused one is read as its default and kept as
    refused, for those who say it or stop on it: `rastro` stops with one line
    (`check_load_time_settings`), the `rastro` resource refuses every tick and run while one
    that shapes the definitions is refused (`check_defining_settings`), the retention sensor
    deletes nothing, and the incident sensor opens a `settings` incident. A test that
    changes the environment reads it again after `load_time.cache_clear()`."""
    return LoadTime.from_env()


def load_time_refusals() -> dict[str, str]:
    """Each value read when the code loads that was refused (and read as its default), by
    its field of `LoadTime`: the one line naming the variable, the value and the range."""
    return dict(load_time().refusals)


def check_load_time_settings() -> None:
    """Read every value read when the code loads: the first bad one raises its
    SettingsError, naming the variable and the value."""
    refusals = load_time_refusals()
    if refusals:
        raise SettingsError(next(iter(refusals.values())))


def check_defining_settings() -> None:
    """Raise the SettingsError of a refused value that shapes the definitions (the
    partitions' first date, the shards)."""
    refusals = load_time_refusals()
    for name in DEFINING_SETTINGS:
        if name in refusals:
            raise SettingsError(refusals[name])


CODE_LOCATION_MODULE = "rastro_assets.definitions"
DATA_DIR = "data"
PIPELINE_FILE_NAME = "rastro.duckdb"


def project_root(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest directory from `start` (default: the working directory) upward whose
    `workspace.yaml` loads this code location: the checkout or install the data belongs to."""
    here = Path(os.getcwd() if start is None else start).absolute()
    return next((d for d in (here, *here.parents) if _is_project_root(d)), None)


def _is_project_root(directory: Path) -> bool:
    try:
        return CODE_LOCATION_MODULE in (directory / "workspace.yaml").read_text()
    except (OSError, UnicodeDecodeError):
        return False


def find_data_dir(start: str | os.PathLike[str] | None = None) -> Path | None:
    """Where the product's files are when no variable says: the `data/` of the nearest
    directory, from `start` (default: the working directory) upward, that is the project's
    root (`project_root`) or holds a `data/` with the pipeline's file or the snapshot.

    So a notebook in `notebooks/`, or a shell anywhere inside the checkout, finds the same
    files as the repo root; None when nothing up to `/` is the project's."""
    here = Path(os.getcwd() if start is None else start).absolute()
    for directory in (here, *here.parents):
        data = directory / DATA_DIR
        if (data / PIPELINE_FILE_NAME).is_file() or (data / ANALYTICS_FILE_NAME).is_file():
            return data
        if _is_project_root(directory):
            return data
    return None


@dataclass(frozen=True)
class AlertThresholds:
    """When a condition becomes an incident, and how often an open one is said again.

    The defaults follow the cadence: an active account's today is read every 45 minutes,
    so 3 hours without it is several missed reads, not one slow run.
    """

    stale: timedelta = timedelta(hours=3)
    """An account's today older than this (longer for an idle account, by as much as its
    live interval is longer) is stale."""
    stuck: timedelta = timedelta(hours=1)
    """A backfill or gap fill with no block read for this long is stuck."""
    rate_limited: timedelta = timedelta(hours=2)
    """An account refused by Meta's rate limits for this long, every try in between."""
    snapshot: timedelta = timedelta(hours=1)
    """Changes left out of the analytics snapshot for this long."""
    run_failures: int = DEFAULT_ALERT_RUN_FAILURES
    """This many failed runs of one job in a row, with none succeeding in between."""
    sensor: timedelta = timedelta(minutes=10)
    """A cadence sensor, or the daemon's incident check itself, silent for this long."""
    remind: timedelta = timedelta(hours=4)
    """How often an open incident is said again."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AlertThresholds:
        """From the environment; a SettingsError names the first variable with a bad value."""
        return cls(
            stale=RASTRO_ALERT_STALE_MINUTES.read(environ),
            stuck=RASTRO_ALERT_STUCK_MINUTES.read(environ),
            rate_limited=RASTRO_ALERT_RATE_LIMITED_MINUTES.read(environ),
            snapshot=RASTRO_ALERT_SNAPSHOT_MINUTES.read(environ),
            run_failures=RASTRO_ALERT_RUN_FAILURES.read(environ),
            sensor=RASTRO_ALERT_SENSOR_MINUTES.read(environ),
            remind=RASTRO_ALERT_REMIND_MINUTES.read(environ),
        )


def environment(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """`environ`, or this process's own environment when None: every variable is read from
    what this returns. A child process is given a copy (`dict(environment())`) to add to."""
    return os.environ if environ is None else environ


# When a variable is read: when the code loads (`load_time`), at each read of a process's
# settings, at each check of the incidents, when a command needs it, or a secret read only
# where it is used. `dagster` ones are Dagster's own, read here so every read is in one place.
LOAD, PROCESS, CHECK, COMMAND, SECRET, DAGSTER = (
    "load", "process", "check", "command", "secret", "dagster"
)


@dataclass(frozen=True)
class Variable:
    """One variable of the environment: its name, the type its check returns, the value an
    unset one reads as, its check (a parse that raises SettingsError, in one line naming the
    variable, for a value it refuses), when it is read, and what it means."""

    name: str
    type: type
    default: object = field(repr=False)
    check: Callable[[str | None], object] = field(repr=False)
    when: str
    meaning: str

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """Its value as the environment holds it; None when unset."""
        return environment(environ).get(self.name)

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether it holds more than blanks."""
        return bool((self.raw(environ) or "").strip())

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        """Its value, checked: the default when unset, SettingsError when refused."""
        return self.check(self.raw(environ))


RASTRO_DUCKDB_PATH = Variable(
    "RASTRO_DUCKDB_PATH", str, None, text, PROCESS,
    "the DuckDB warehouse file; unset: the project's data/rastro.duckdb, found from the"
    " working directory upward",
)
RASTRO_WAREHOUSE_URL = Variable(
    "RASTRO_WAREHOUSE_URL", str, None, warehouse_url, PROCESS,
    "postgresql://...: the warehouse on PostgreSQL instead of the DuckDB file; a secret",
)
RASTRO_SECRETS_KEY = Variable(
    "RASTRO_SECRETS_KEY", str, None, stripped, SECRET,
    "base64 of 32 random bytes; seals and opens tokens (AES-256-GCM)",
)
RASTRO_META_GRAPH_URL = Variable(
    "RASTRO_META_GRAPH_URL", str, DEFAULT_GRAPH_URL, graph_url, PROCESS,
    "Graph API base, version included",
)
RASTRO_META_FAKE = Variable(
    "RASTRO_META_FAKE", bool, False, switch, PROCESS,
    "true: use the built-in fake Graph instead of the network",
)
RASTRO_ANALYTICS_PATH = Variable(
    "RASTRO_ANALYTICS_PATH", str, None, text, PROCESS,
    "the analytics snapshot (default: analytics.duckdb beside the pipeline's file)",
)
RASTRO_ANALYTICS_MODE = Variable(
    "RASTRO_ANALYTICS_MODE", int, DEFAULT_ANALYTICS_MODE, octal_mode, PROCESS,
    "the snapshot's file mode, octal",
)
RASTRO_ANALYTICS_LAG_SECONDS = Variable(
    "RASTRO_ANALYTICS_LAG_SECONDS", int, DEFAULT_ANALYTICS_LAG_SECONDS, lag_seconds, PROCESS,
    "how far the snapshot may lag a write to the pipeline's file",
)
RASTRO_ANALYTICS_STORAGE_VERSION = Variable(
    "RASTRO_ANALYTICS_STORAGE_VERSION", str, DEFAULT_ANALYTICS_STORAGE_VERSION, storage_version,
    PROCESS, "the DuckDB storage version the snapshot is written in",
)
RASTRO_ACCOUNT_SHARDS = Variable(
    "RASTRO_ACCOUNT_SHARDS", int, DEFAULT_ACCOUNT_SHARDS, account_shards, LOAD,
    "how many spend asset pairs (shards) hold the accounts",
)
RASTRO_SHARD_ACCOUNTS = Variable(
    "RASTRO_SHARD_ACCOUNTS", int, DEFAULT_SHARD_ACCOUNTS, shard_accounts, PROCESS,
    "how many accounts `rastro link` puts in a shard before the next",
)
RASTRO_PARTITIONS_START = Variable(
    "RASTRO_PARTITIONS_START", date, date.fromisoformat(DEFAULT_PARTITIONS_START),
    partitions_start, LOAD, "the first local date the spend partitions have",
)
RASTRO_SENSOR_INTERVAL_SECONDS = Variable(
    "RASTRO_SENSOR_INTERVAL_SECONDS", int, 0, sensor_interval_override_seconds, LOAD,
    "every sensor's interval, in seconds; 0: each sensor's own",
)
RASTRO_SYNC_LEASE_SECONDS = Variable(
    "RASTRO_SYNC_LEASE_SECONDS", int, DEFAULT_SYNC_LEASE_SECONDS, sync_lease_seconds, LOAD,
    "how long a started sync holds its account, in seconds",
)
RASTRO_IDLE_LIVE_INTERVAL_MINUTES = Variable(
    "RASTRO_IDLE_LIVE_INTERVAL_MINUTES", int, DEFAULT_IDLE_LIVE_INTERVAL_MINUTES,
    idle_live_interval_minutes, LOAD, "how often an idle account's today is read, in minutes",
)
RASTRO_RETENTION_INTERVAL_SECONDS = Variable(
    "RASTRO_RETENTION_INTERVAL_SECONDS", int, Retention.sensor_seconds,
    retention_interval_seconds, LOAD, "how often the retention sensor ticks, in seconds",
)
RASTRO_RUN_RETENTION_HOURS = Variable(
    "RASTRO_RUN_RETENTION_HOURS", float, 24.0, run_retention_hours, LOAD,
    "how long the instance keeps a run, in hours",
)
RASTRO_SYNC_RUN_RETENTION_DAYS = Variable(
    "RASTRO_SYNC_RUN_RETENTION_DAYS", float, 35.0, sync_run_retention_days, LOAD,
    "how long the warehouse keeps a meta_sync_runs row, in days",
)
RASTRO_ALERT_STALE_MINUTES = Variable(
    "RASTRO_ALERT_STALE_MINUTES", timedelta, AlertThresholds.stale,
    alert_minutes("RASTRO_ALERT_STALE_MINUTES", AlertThresholds.stale), CHECK,
    "an account's local today has not been read for this long: stale",
)
RASTRO_ALERT_STUCK_MINUTES = Variable(
    "RASTRO_ALERT_STUCK_MINUTES", timedelta, AlertThresholds.stuck,
    alert_minutes("RASTRO_ALERT_STUCK_MINUTES", AlertThresholds.stuck), CHECK,
    "a backfill or gap fill has read no block for this long: stuck",
)
RASTRO_ALERT_RATE_LIMITED_MINUTES = Variable(
    "RASTRO_ALERT_RATE_LIMITED_MINUTES", timedelta, AlertThresholds.rate_limited,
    alert_minutes("RASTRO_ALERT_RATE_LIMITED_MINUTES", AlertThresholds.rate_limited), CHECK,
    "every try of an account since its first throttle has been refused for this long",
)
RASTRO_ALERT_SNAPSHOT_MINUTES = Variable(
    "RASTRO_ALERT_SNAPSHOT_MINUTES", timedelta, AlertThresholds.snapshot,
    alert_minutes("RASTRO_ALERT_SNAPSHOT_MINUTES", AlertThresholds.snapshot), CHECK,
    "changes are owed to the snapshot and its last publish is this old",
)
RASTRO_ALERT_RUN_FAILURES = Variable(
    "RASTRO_ALERT_RUN_FAILURES", int, AlertThresholds.run_failures, alert_run_failures, CHECK,
    "this many runs of one job failed in a row",
)
RASTRO_ALERT_SENSOR_MINUTES = Variable(
    "RASTRO_ALERT_SENSOR_MINUTES", timedelta, AlertThresholds.sensor,
    alert_minutes("RASTRO_ALERT_SENSOR_MINUTES", AlertThresholds.sensor), CHECK,
    "a cadence sensor, or the daemon's incident check, silent or failing this long",
)
RASTRO_ALERT_REMIND_MINUTES = Variable(
    "RASTRO_ALERT_REMIND_MINUTES", timedelta, AlertThresholds.remind,
    alert_minutes("RASTRO_ALERT_REMIND_MINUTES", AlertThresholds.remind), CHECK,
    "how often an open incident is said again",
)
RASTRO_ALERT_WEBHOOK_URLS = Variable(
    "RASTRO_ALERT_WEBHOOK_URLS", str, None, text, SECRET,
    "comma-separated URLs; each incident is POSTed as JSON; a secret",
)
RASTRO_ALERT_SMTP_URL = Variable(
    "RASTRO_ALERT_SMTP_URL", str, None, stripped, SECRET,
    "smtp://user:password@host:port: the incidents by email; a secret",
)
RASTRO_ALERT_EMAIL_TO = Variable(
    "RASTRO_ALERT_EMAIL_TO", str, None, text, CHECK, "comma-separated recipients",
)
RASTRO_ALERT_EMAIL_FROM = Variable(
    "RASTRO_ALERT_EMAIL_FROM", str, None, stripped, CHECK, "the email's sender",
)
RASTRO_SQL_OUTPUT_MAX_MB = Variable(
    "RASTRO_SQL_OUTPUT_MAX_MB", int, DEFAULT_OUTPUT_MAX_MB, sql_output_max_mb, COMMAND,
    "the largest file `rastro sql --output` writes, in MiB",
)
DAGSTER_HOME = Variable(
    "DAGSTER_HOME", str, None, text, DAGSTER, "Dagster's instance: its dagster.yaml and storage",
)

VARIABLES: tuple[Variable, ...] = (
    RASTRO_DUCKDB_PATH,
    RASTRO_WAREHOUSE_URL,
    RASTRO_SECRETS_KEY,
    RASTRO_META_GRAPH_URL,
    RASTRO_META_FAKE,
    RASTRO_ANALYTICS_PATH,
    RASTRO_ANALYTICS_MODE,
    RASTRO_ANALYTICS_LAG_SECONDS,
    RASTRO_ANALYTICS_STORAGE_VERSION,
    RASTRO_ACCOUNT_SHARDS,
    RASTRO_SHARD_ACCOUNTS,
    RASTRO_PARTITIONS_START,
    RASTRO_SENSOR_INTERVAL_SECONDS,
    RASTRO_SYNC_LEASE_SECONDS,
    RASTRO_IDLE_LIVE_INTERVAL_MINUTES,
    RASTRO_RETENTION_INTERVAL_SECONDS,
    RASTRO_RUN_RETENTION_HOURS,
    RASTRO_SYNC_RUN_RETENTION_DAYS,
    RASTRO_ALERT_STALE_MINUTES,
    RASTRO_ALERT_STUCK_MINUTES,
    RASTRO_ALERT_RATE_LIMITED_MINUTES,
    RASTRO_ALERT_SNAPSHOT_MINUTES,
    RASTRO_ALERT_RUN_FAILURES,
    RASTRO_ALERT_SENSOR_MINUTES,
    RASTRO_ALERT_REMIND_MINUTES,
    RASTRO_ALERT_WEBHOOK_URLS,
    RASTRO_ALERT_SMTP_URL,
    RASTRO_ALERT_EMAIL_TO,
    RASTRO_ALERT_EMAIL_FROM,
    RASTRO_SQL_OUTPUT_MAX_MB,
    DAGSTER_HOME,
)
"""Every variable the product reads, each once."""

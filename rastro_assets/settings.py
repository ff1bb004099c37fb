"""Configuration read from the environment: the values fixed when the code loads, where the
project's files are when no variable names them, the alert thresholds, and the error a bad
value raises. `Settings`, what a process runs with (its files, the Graph, the shards), is in
`process_settings.py`.

The contract names the variables; the code reads them through here so a test
can build a `Settings` without touching `os.environ`. Two kinds are read where
they are used instead: the secrets key, `RASTRO_SECRETS_KEY` (`vault.py`,
`Vault.from_env`; `rastro` and the demo also look whether it is set), and the
alert channels, `RASTRO_ALERT_WEBHOOK_URLS`, `RASTRO_ALERT_SMTP_URL`,
`RASTRO_ALERT_EMAIL_TO` and `RASTRO_ALERT_EMAIL_FROM` (`alerts/channels.py`,
`channels_from_env`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

ANALYTICS_FILE_NAME = "analytics.duckdb"

# Operators may make the sensors tick faster (tests, demos): `SENSOR_INTERVAL_OVERRIDE_SECONDS`.
# How long a started sync holds its account (15 minutes, a wave's run timeout too); a test or
# demo that kills runs may shorten it: `SYNC_LEASE_SECONDS`. Both read when the code loads
# (`LOAD_TIME_SETTINGS` below).
DEFAULT_SYNC_LEASE_SECONDS = 15 * 60
# Every account's today and yesterday are read this often; an idle one (no spend today or
# yesterday, no ACTIVE ad) every RASTRO_IDLE_LIVE_INTERVAL_MINUTES, where setting the live
# interval itself turns idling off.
LIVE_INTERVAL_MINUTES = 45
DEFAULT_IDLE_LIVE_INTERVAL_MINUTES = 180

# The upper ends of the numeric settings' ranges: each is far beyond any useful value, and
# close enough that a typo (an extra digit or ten) is refused instead of overflowing a
# timedelta or silently switching a behaviour off. `docs/running.md`, "Settings", lists them.
DAY_SECONDS = 24 * 60 * 60
MAX_IDLE_LIVE_INTERVAL_MINUTES = 24 * 60
MAX_SENSOR_INTERVAL_SECONDS = 60 * 60
MAX_RUN_RETENTION_HOURS = 10 * 365 * 24
MAX_SYNC_RUN_RETENTION_DAYS = 10 * 365
# Ten years: a threshold that high never fires, which is how one kind of incident is
# turned off.
MAX_ALERT_MINUTES = 10 * 365 * 24 * 60
# Runs failing in a row for longer than this have long been somebody's problem: a higher
# threshold would only keep the incident from being said.
MAX_ALERT_RUN_FAILURES = 100
# A value longer than this is shown cut, with its length: a refusal stays one short line.
SHOWN_VALUE_CHARS = 24


@dataclass(frozen=True)
class Retention:
    """How long the instance keeps runs and the warehouse keeps `meta_sync_runs` rows."""

    sensor_seconds: int = 3600
    runs: timedelta = timedelta(hours=24)
    sync_runs: timedelta = timedelta(days=35)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Retention:
        """From the environment; a SettingsError names the first variable with a bad value."""
        env = os.environ if environ is None else environ
        return cls(
            sensor_seconds=whole_number(
                env.get("RASTRO_RETENTION_INTERVAL_SECONDS"),
                3600,
                least=1,
                most=DAY_SECONDS,
                refusal="RASTRO_RETENTION_INTERVAL_SECONDS must be a whole number of seconds"
                f" from 1 to {DAY_SECONDS:,}",
            ),
            runs=timedelta(
                hours=_positive_number(
                    env.get("RASTRO_RUN_RETENTION_HOURS"),
                    24,
                    "hours",
                    "RASTRO_RUN_RETENTION_HOURS",
                    most=MAX_RUN_RETENTION_HOURS,
                )
            ),
            sync_runs=timedelta(
                days=_positive_number(
                    env.get("RASTRO_SYNC_RUN_RETENTION_DAYS"),
                    35,
                    "days",
                    "RASTRO_SYNC_RUN_RETENTION_DAYS",
                    most=MAX_SYNC_RUN_RETENTION_DAYS,
                )
            ),
        )


class SettingsError(ValueError):
    """A variable of the environment holds a value the product cannot use."""



def idle_live_interval_minutes(raw: str | None) -> int:
    """`RASTRO_IDLE_LIVE_INTERVAL_MINUTES`: whole minutes, at least the live interval."""
    return whole_number(
        raw,
        DEFAULT_IDLE_LIVE_INTERVAL_MINUTES,
        least=LIVE_INTERVAL_MINUTES,
        most=MAX_IDLE_LIVE_INTERVAL_MINUTES,
        refusal=f"RASTRO_IDLE_LIVE_INTERVAL_MINUTES must be a whole number of minutes from"
        f" {LIVE_INTERVAL_MINUTES} (idle accounts read like the others) to"
        f" {MAX_IDLE_LIVE_INTERVAL_MINUTES:,}",
    )


def sensor_interval_override_seconds(raw: str | None) -> int:
    """`RASTRO_SENSOR_INTERVAL_SECONDS`: whole seconds; 0 or unset keeps each sensor's own."""
    return whole_number(
        raw,
        0,
        least=0,
        most=MAX_SENSOR_INTERVAL_SECONDS,
        refusal="RASTRO_SENSOR_INTERVAL_SECONDS must be a whole number of seconds from 0 (or"
        f" unset: each sensor's own interval) to {MAX_SENSOR_INTERVAL_SECONDS:,}",
    )


def sync_lease_seconds(raw: str | None) -> int:
    """`RASTRO_SYNC_LEASE_SECONDS`: how long a started sync holds its account, whole seconds."""
    return whole_number(
        raw,
        DEFAULT_SYNC_LEASE_SECONDS,
        least=1,
        most=DAY_SECONDS,
        refusal=f"RASTRO_SYNC_LEASE_SECONDS must be a whole number of seconds from 1 to"
        f" {DAY_SECONDS:,}",
    )


def _positive_number(
    raw: str | None, default: float, unit: str, name: str, *, most: float
) -> float:
    """`raw` as a number above 0 and at most `most` (fractions allowed), `default` when
    empty."""
    if not raw:
        return default
    try:
        number = float(raw)
    except ValueError:
        number = math.nan
    if not (0 < number <= most):
        raise SettingsError(
            f"{name} must be a number of {unit} above 0 and at most {most:,}, not"
            f" {shown_value(raw)}"
        )
    return number


def shown_value(raw: str) -> str:
    """`raw` quoted for a refusal's one line: cut, with its length, when it is long."""
    if len(raw) <= SHOWN_VALUE_CHARS:
        return repr(raw)
    return f"{raw[:SHOWN_VALUE_CHARS]!r}... ({len(raw):,} characters)"


def whole_number(raw: str | None, default: int, *, least: int, most: int, refusal: str) -> int:
    """`raw` as a whole number from `least` to `most`, `default` when empty; otherwise a
    SettingsError that says `refusal` and the value given."""
    if not raw:
        return default
    try:
        number = int(raw)
    except ValueError:  # also a string of more digits than Python converts
        number = least - 1
    if not least <= number <= most:
        raise SettingsError(f"{refusal}, not {shown_value(raw)}")
    return number


DEFAULT_PARTITIONS_START = "2026-08-01"


# Meta keeps 37 months of insights: an axis that starts long before only adds keys that
# Dagster lists for every backfill and Meta never answers for, and one far ahead is a typo.
EARLIEST_PARTITIONS_START = date(2000, 1, 1)
LATEST_PARTITIONS_START = date(2099, 12, 31)


def partitions_start(raw: str | None) -> date:
    """`RASTRO_PARTITIONS_START`: the first local date the spend partitions have."""
    if not raw:
        return date.fromisoformat(DEFAULT_PARTITIONS_START)
    try:
        start = date.fromisoformat(raw)
    except ValueError:
        start = None
    if start is None or not EARLIEST_PARTITIONS_START <= start <= LATEST_PARTITIONS_START:
        raise SettingsError(
            f"RASTRO_PARTITIONS_START must be a date like 2025-01-01, from"
            f" {EARLIEST_PARTITIONS_START} to {LATEST_PARTITIONS_START}, not {shown_value(raw)}"
        )
    return start


DEFAULT_ACCOUNT_SHARDS = 1
MAX_ACCOUNT_SHARDS = 500
# Accounts whose spend one asset serves within the partitions page's goals, warm and after
# a link, with a year of history (bench/README.md, "Dagster at scale").
DEFAULT_SHARD_ACCOUNTS = 100
MAX_SHARD_ACCOUNTS = 10_000


def account_shards(raw: str | None) -> int:
    """`RASTRO_ACCOUNT_SHARDS`: how many spend asset pairs hold the accounts (1 to 500)."""
    return whole_number(
        raw,
        DEFAULT_ACCOUNT_SHARDS,
        least=1,
        most=MAX_ACCOUNT_SHARDS,
        refusal=f"RASTRO_ACCOUNT_SHARDS must be a whole number from 1 to {MAX_ACCOUNT_SHARDS}",
    )


def account_shards_in(env: Mapping[str, str]) -> int:
    # The definitions (at load) and the CLI (`Settings`) must agree on the shards, or
    # `rastro link` would place accounts in pairs the code location does not define.
    return account_shards(env.get("RASTRO_ACCOUNT_SHARDS"))


def shard_accounts(raw: str | None) -> int:
    """`RASTRO_SHARD_ACCOUNTS`: how many accounts `rastro link` puts in a shard before the
    next, and above which it warns (1 to 10,000; 100 by default)."""
    return whole_number(
        raw,
        DEFAULT_SHARD_ACCOUNTS,
        least=1,
        most=MAX_SHARD_ACCOUNTS,
        refusal=f"RASTRO_SHARD_ACCOUNTS must be a whole number from 1 to {MAX_SHARD_ACCOUNTS:,}",
    )


# Read from the environment when the code loads, and fixed from then on: the sensors'
# intervals, the lease, the retention, the partitions' first date and the shards (each a
# pair of assets) are fixed at definition time, so a new value applies at the code location's
# next restart. Each is read at its first use, not when this module is imported, and a bad
# value never raises there: the code location must load whatever the environment holds, or
# the daemon would lose every sensor. A bad one is read as its default instead and kept as
# refused (`load_time_refusals`), for those who say it or stop on it: `rastro` stops with
# one line (`check_load_time_settings`), the `rastro` resource refuses every tick and run
# while one that shapes the definitions is refused (`check_defining_settings`), the
# retention sensor deletes nothing, and the incident sensor opens a `settings` incident.
LOAD_TIME_SETTINGS: dict[str, tuple[Callable[[], object], object]] = {
    "SENSOR_INTERVAL_OVERRIDE_SECONDS": (
        lambda: sensor_interval_override_seconds(os.environ.get("RASTRO_SENSOR_INTERVAL_SECONDS")),
        0,
    ),
    "SYNC_LEASE_SECONDS": (
        lambda: sync_lease_seconds(os.environ.get("RASTRO_SYNC_LEASE_SECONDS")),
        DEFAULT_SYNC_LEASE_SECONDS,
    ),
    "RETENTION": (lambda: Retention.from_env(), Retention()),
    "PARTITIONS_START": (
        lambda: partitions_start(os.environ.get("RASTRO_PARTITIONS_START")),
        date.fromisoformat(DEFAULT_PARTITIONS_START),
    ),
    "IDLE_LIVE_INTERVAL_MINUTES": (
        lambda: idle_live_interval_minutes(os.environ.get("RASTRO_IDLE_LIVE_INTERVAL_MINUTES")),
        DEFAULT_IDLE_LIVE_INTERVAL_MINUTES,
    ),
    "ACCOUNT_SHARDS": (lambda: account_shards_in(os.environ), DEFAULT_ACCOUNT_SHARDS),
}
# Those whose default would define other assets or partitions than the operator's: work
# done on them would be a guess, so it stops until the value is corrected.
DEFINING_SETTINGS = ("PARTITIONS_START", "ACCOUNT_SHARDS")
_refused: dict[str, SettingsError] = {}


def __getattr__(name: str) -> object:
    # `from rastro_assets.settings import ACCOUNT_SHARDS` lands here the first time.
    entry = LOAD_TIME_SETTINGS.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    read, default = entry
    try:
        value = read()
    except SettingsError as exc:
        _refused[name] = exc
        value = default
    globals()[name] = value
    return value


def load_time_refusals() -> dict[str, str]:
    """Each value read when the code loads that was refused (and read as its default), by
    its name in this module: the one line naming the variable, the value and the range."""
    for name in LOAD_TIME_SETTINGS:
        if name not in globals():
            __getattr__(name)
    return {name: str(exc) for name, exc in _refused.items()}


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
    run_failures: int = 3
    """This many failed runs of one job in a row, with none succeeding in between."""
    sensor: timedelta = timedelta(minutes=10)
    """A cadence sensor, or the daemon's incident check itself, silent for this long."""
    remind: timedelta = timedelta(hours=4)
    """How often an open incident is said again."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AlertThresholds:
        """From the environment; a SettingsError names the first variable with a bad value."""
        env = os.environ if environ is None else environ

        def minutes(name: str, default: timedelta) -> timedelta:
            value = whole_number(
                env.get(name),
                int(default.total_seconds() // 60),
                least=1,
                most=MAX_ALERT_MINUTES,
                refusal=f"{name} must be a whole number of minutes from 1 to"
                f" {MAX_ALERT_MINUTES:,}",
            )
            return timedelta(minutes=value)

        return cls(
            stale=minutes("RASTRO_ALERT_STALE_MINUTES", cls.stale),
            stuck=minutes("RASTRO_ALERT_STUCK_MINUTES", cls.stuck),
            rate_limited=minutes("RASTRO_ALERT_RATE_LIMITED_MINUTES", cls.rate_limited),
            snapshot=minutes("RASTRO_ALERT_SNAPSHOT_MINUTES", cls.snapshot),
            run_failures=whole_number(
                env.get("RASTRO_ALERT_RUN_FAILURES"),
                cls.run_failures,
                least=1,
                most=MAX_ALERT_RUN_FAILURES,
                refusal="RASTRO_ALERT_RUN_FAILURES must be a whole number of runs from 1 to"
                f" {MAX_ALERT_RUN_FAILURES}",
            ),
            sensor=minutes("RASTRO_ALERT_SENSOR_MINUTES", cls.sensor),
            remind=minutes("RASTRO_ALERT_REMIND_MINUTES", cls.remind),
        )

"""How each variable of the environment is checked: the parse of each (a value refused
raises `SettingsError`, one line naming the variable, the value and the range), the ranges'
ends and the defaults. `settings.py` declares the variables with these as their checks;
readers ask it, not this module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import date, timedelta
from urllib.parse import urlsplit

# Operators may make the sensors tick faster (tests, demos): `RASTRO_SENSOR_INTERVAL_SECONDS`.
# How long a started sync holds its account (15 minutes, a wave's run timeout too); a test or
# demo that kills runs may shorten it: `RASTRO_SYNC_LEASE_SECONDS`. Both read when the code
# loads (`load_time` below).
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
DEFAULT_ALERT_RUN_FAILURES = 3
# A value longer than this is shown cut, with its length: a refusal stays one short line.
SHOWN_VALUE_CHARS = 24


def retention_interval_seconds(raw: str | None) -> int:
    """`RASTRO_RETENTION_INTERVAL_SECONDS`: how often the retention sensor ticks."""
    return whole_number(
        raw,
        3600,
        least=1,
        most=DAY_SECONDS,
        refusal="RASTRO_RETENTION_INTERVAL_SECONDS must be a whole number of seconds"
        f" from 1 to {DAY_SECONDS:,}",
    )


def run_retention_hours(raw: str | None) -> float:
    """`RASTRO_RUN_RETENTION_HOURS`: how long the instance keeps a run."""
    return _positive_number(
        raw, 24.0, "hours", "RASTRO_RUN_RETENTION_HOURS", most=MAX_RUN_RETENTION_HOURS
    )


def sync_run_retention_days(raw: str | None) -> float:
    """`RASTRO_SYNC_RUN_RETENTION_DAYS`: how long the warehouse keeps a `meta_sync_runs` row."""
    return _positive_number(
        raw, 35.0, "days", "RASTRO_SYNC_RUN_RETENTION_DAYS", most=MAX_SYNC_RUN_RETENTION_DAYS
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


def alert_minutes(name: str, default: timedelta) -> Callable[[str | None], timedelta]:
    """The check of the threshold `name`: whole minutes from 1 to ten years."""

    def minutes(raw: str | None) -> timedelta:
        value = whole_number(
            raw,
            int(default.total_seconds() // 60),
            least=1,
            most=MAX_ALERT_MINUTES,
            refusal=f"{name} must be a whole number of minutes from 1 to {MAX_ALERT_MINUTES:,}",
        )
        return timedelta(minutes=value)

    return minutes


def alert_run_failures(raw: str | None) -> int:
    """`RASTRO_ALERT_RUN_FAILURES`: failed runs of one job in a row that make an incident."""
    return whole_number(
        raw,
        DEFAULT_ALERT_RUN_FAILURES,
        least=1,
        most=MAX_ALERT_RUN_FAILURES,
        refusal="RASTRO_ALERT_RUN_FAILURES must be a whole number of runs from 1 to"
        f" {MAX_ALERT_RUN_FAILURES}",
    )


DEFAULT_DUCKDB_PATH = "data/rastro.duckdb"
DEFAULT_GRAPH_URL = "https://graph.facebook.com/v25.0"
DEFAULT_ANALYTICS_MODE = 0o644
DEFAULT_ANALYTICS_LAG_SECONDS = 300
# A week: a benchmark that must never publish mid-measure still fits.
MAX_ANALYTICS_LAG_SECONDS = 7 * 24 * 60 * 60
# The oldest DuckDB storage that holds every type of the snapshot (DECIMAL, TIMESTAMPTZ, BLOB,
# lists): DuckDB 1.0 and later, and the tools that bundle one (DBeaver, Metabase, Evidence),
# open it; the newest storage would shut out every DuckDB older than the pipeline's.
DEFAULT_ANALYTICS_STORAGE_VERSION = "v1.0.0"
DEFAULT_OUTPUT_MAX_MB = 1024
MOST_OUTPUT_MAX_MB = 1 << 20


def storage_version(raw: str | None) -> str:
    """`RASTRO_ANALYTICS_STORAGE_VERSION`: a DuckDB release, `v1.0.0` or later, like `v1.2.0`."""
    if not raw:
        return DEFAULT_ANALYTICS_STORAGE_VERSION
    if not re.fullmatch(r"v[1-9][0-9]*\.[0-9]+\.[0-9]+", raw.strip()):
        raise SettingsError(
            f"RASTRO_ANALYTICS_STORAGE_VERSION must be a DuckDB release from v1.0.0 on, like"
            f" {DEFAULT_ANALYTICS_STORAGE_VERSION} or v1.2.0, not {shown_value(raw)}"
        )
    return raw.strip()


def octal_mode(raw: str | None) -> int:
    """`RASTRO_ANALYTICS_MODE`: an octal file mode its owner can read."""
    if not raw:
        return DEFAULT_ANALYTICS_MODE
    try:
        mode = int(raw, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777 or not mode & 0o400:
        raise SettingsError(
            f"RASTRO_ANALYTICS_MODE must be an octal file mode from 0400 to 0777 that the owner"
            f" can read, like 0644 or 0640, not {shown_value(raw)}"
        )
    return mode


def lag_seconds(raw: str | None) -> int:
    """`RASTRO_ANALYTICS_LAG_SECONDS`: how far the snapshot may lag a write, whole seconds."""
    return whole_number(
        raw,
        DEFAULT_ANALYTICS_LAG_SECONDS,
        least=30,
        most=MAX_ANALYTICS_LAG_SECONDS,
        refusal="RASTRO_ANALYTICS_LAG_SECONDS must be a whole number of seconds from 30 to"
        f" {MAX_ANALYTICS_LAG_SECONDS:,}",
    )


def warehouse_url(raw: str | None) -> str | None:
    """RASTRO_WAREHOUSE_URL, checked for its scheme and its shape: the server says the rest."""
    if raw is None or not raw.strip():
        return None
    url = raw.strip()
    # The value is never quoted back: it may carry the database's password.
    if url.split(":", 1)[0] not in {"postgresql", "postgres"} or not _parses(url):
        raise SettingsError(
            "RASTRO_WAREHOUSE_URL must be a postgresql://user@host/database URL;"
            " leave it unset for the DuckDB file of RASTRO_DUCKDB_PATH"
        )
    return url


def _parses(url: str) -> bool:
    """Whether `url` splits into its parts with a numeric port, if it names one."""
    try:
        urlsplit(url).port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return True


def sql_output_max_mb(raw: str | None) -> int:
    """`RASTRO_SQL_OUTPUT_MAX_MB`: the largest file `rastro sql --output` writes, in MiB."""
    return whole_number(
        raw,
        DEFAULT_OUTPUT_MAX_MB,
        least=1,
        most=MOST_OUTPUT_MAX_MB,
        refusal=f"RASTRO_SQL_OUTPUT_MAX_MB must be a whole number of MiB from 1 to"
        f" {MOST_OUTPUT_MAX_MB:,}",
    )


def text(raw: str | None) -> str | None:
    """The value as given, None when unset or empty: checked where it is used."""
    return raw or None


def stripped(raw: str | None) -> str | None:
    """The value without the blanks around it, None when nothing is left."""
    return (raw or "").strip() or None


def switch(raw: str | None) -> bool:
    """`1`, `true` or `yes` (any case) turn it on; anything else leaves it off."""
    return (raw or "").strip().lower() in {"1", "true", "yes"}


def graph_url(raw: str | None) -> str:
    """`RASTRO_META_GRAPH_URL`: the Graph API's base, without a trailing slash."""
    return (raw or DEFAULT_GRAPH_URL).rstrip("/")

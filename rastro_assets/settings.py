"""Configuration read from the environment, in one place.

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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

DEFAULT_DUCKDB_PATH = "data/rastro.duckdb"
DEFAULT_GRAPH_URL = "https://graph.facebook.com/v25.0"
ANALYTICS_FILE_NAME = "analytics.duckdb"
DEFAULT_ANALYTICS_MODE = 0o644
DEFAULT_ANALYTICS_LAG_SECONDS = 300
# The oldest DuckDB storage that holds every type of the snapshot (DECIMAL, TIMESTAMPTZ, BLOB,
# lists): DuckDB 1.0 and later, and the tools that bundle one (DBeaver, Metabase, Evidence),
# open it; the newest storage would shut out every DuckDB older than the pipeline's.
DEFAULT_ANALYTICS_STORAGE_VERSION = "v1.0.0"

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
            sensor_seconds=_whole_number(
                env.get("RASTRO_RETENTION_INTERVAL_SECONDS"),
                3600,
                least=1,
                refusal="RASTRO_RETENTION_INTERVAL_SECONDS must be a whole number of seconds,"
                " 1 or more",
            ),
            runs=timedelta(
                hours=_positive_number(
                    env.get("RASTRO_RUN_RETENTION_HOURS"), 24, "hours", "RASTRO_RUN_RETENTION_HOURS"
                )
            ),
            sync_runs=timedelta(
                days=_positive_number(
                    env.get("RASTRO_SYNC_RUN_RETENTION_DAYS"),
                    35,
                    "days",
                    "RASTRO_SYNC_RUN_RETENTION_DAYS",
                )
            ),
        )


class SettingsError(ValueError):
    """A variable of the environment holds a value the product cannot use."""


class NotTheSnapshot(SettingsError):
    """The analytics snapshot's path names the pipeline's own file, or a file that holds
    the pipeline's own tables."""


def check_not_the_pipeline_file(
    snapshot_path: str | os.PathLike[str], pipeline_path: str | os.PathLike[str]
) -> None:
    """Raise `NotTheSnapshot` when the snapshot's path is the pipeline's own file (the same
    path, relative or absolute, or another name of the same file).

    A publish renames a new file over the snapshot: over the pipeline's file it would destroy
    the registry, the sealed tokens and the sync history. And an analyst's session on the
    pipeline's file, even read-only, would hold up its writers.
    """
    if _same_file(Path(snapshot_path), Path(pipeline_path)):
        named, real = os.path.abspath(snapshot_path), os.path.realpath(pipeline_path)
        raise NotTheSnapshot(
            f"{named} is the pipeline's own file"
            f" ({'' if real == named else real + ', '}RASTRO_DUCKDB_PATH), not the analytics"
            " snapshot: point RASTRO_ANALYTICS_PATH at another file (default: analytics.duckdb"
            " beside the pipeline's file)"
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist yet: where each would be, links followed
        return os.path.realpath(a) == os.path.realpath(b)


def idle_live_interval_minutes(raw: str | None) -> int:
    """`RASTRO_IDLE_LIVE_INTERVAL_MINUTES`: whole minutes, at least the live interval."""
    return _whole_number(
        raw,
        DEFAULT_IDLE_LIVE_INTERVAL_MINUTES,
        least=LIVE_INTERVAL_MINUTES,
        refusal=f"RASTRO_IDLE_LIVE_INTERVAL_MINUTES must be a whole number of minutes,"
        f" {LIVE_INTERVAL_MINUTES} (idle accounts read like the others) or more",
    )


def sensor_interval_override_seconds(raw: str | None) -> int:
    """`RASTRO_SENSOR_INTERVAL_SECONDS`: whole seconds; 0 or unset keeps each sensor's own."""
    return _whole_number(
        raw,
        0,
        least=0,
        refusal="RASTRO_SENSOR_INTERVAL_SECONDS must be a whole number of seconds (0 or unset:"
        " each sensor's own interval)",
    )


def sync_lease_seconds(raw: str | None) -> int:
    """`RASTRO_SYNC_LEASE_SECONDS`: how long a started sync holds its account, whole seconds."""
    return _whole_number(
        raw,
        DEFAULT_SYNC_LEASE_SECONDS,
        least=1,
        refusal="RASTRO_SYNC_LEASE_SECONDS must be a whole number of seconds, 1 or more",
    )


def _positive_number(raw: str | None, default: float, unit: str, name: str) -> float:
    """`raw` as a number above 0 (fractions allowed), `default` when empty."""
    if not raw:
        return default
    try:
        number = float(raw)
    except ValueError:
        number = math.nan
    if not (0 < number < math.inf):
        raise SettingsError(f"{name} must be a number of {unit} above 0, not {raw!r}")
    return number


def _whole_number(
    raw: str | None, default: int, *, least: int, most: int | None = None, refusal: str
) -> int:
    """`raw` as a whole number from `least` to `most`, `default` when empty; otherwise a
    SettingsError that says `refusal` and the value given."""
    if not raw:
        return default
    try:
        number = int(raw)
    except ValueError:
        number = least - 1
    if number < least or (most is not None and number > most):
        raise SettingsError(f"{refusal}, not {raw!r}")
    return number


DEFAULT_PARTITIONS_START = "2026-08-01"


def partitions_start(raw: str | None) -> date:
    """`RASTRO_PARTITIONS_START`: the first local date the spend partitions have."""
    if not raw:
        return date.fromisoformat(DEFAULT_PARTITIONS_START)
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise SettingsError(
            f"RASTRO_PARTITIONS_START must be a date like 2025-01-01, not {raw!r}"
        ) from None


DEFAULT_ACCOUNT_SHARDS = 1
MAX_ACCOUNT_SHARDS = 500
# Accounts whose spend one asset serves within the partitions page's goals, warm and after
# a link, with a year of history (bench/README.md, "Dagster at scale").
DEFAULT_SHARD_ACCOUNTS = 100
MAX_SHARD_ACCOUNTS = 10_000


def account_shards(raw: str | None) -> int:
    """`RASTRO_ACCOUNT_SHARDS`: how many spend asset pairs hold the accounts (1 to 500)."""
    return _whole_number(
        raw,
        DEFAULT_ACCOUNT_SHARDS,
        least=1,
        most=MAX_ACCOUNT_SHARDS,
        refusal=f"RASTRO_ACCOUNT_SHARDS must be a whole number from 1 to {MAX_ACCOUNT_SHARDS}",
    )


def _account_shards_in(env: Mapping[str, str]) -> int:
    # The definitions (at load) and the CLI (`Settings`) must agree on the shards, or
    # `rastro link` would place accounts in pairs the code location does not define.
    return account_shards(env.get("RASTRO_ACCOUNT_SHARDS"))


def shard_accounts(raw: str | None) -> int:
    """`RASTRO_SHARD_ACCOUNTS`: how many accounts `rastro link` puts in a shard before the
    next, and above which it warns (1 to 10,000; 100 by default)."""
    return _whole_number(
        raw,
        DEFAULT_SHARD_ACCOUNTS,
        least=1,
        most=MAX_SHARD_ACCOUNTS,
        refusal=f"RASTRO_SHARD_ACCOUNTS must be a whole number from 1 to {MAX_SHARD_ACCOUNTS:,}",
    )


# Read from the environment when the code loads, and fixed from then on: the sensors'
# intervals, the lease, the retention, the partitions' first date and the shards (each a
# pair of assets) are fixed at definition time, so a new value applies at the code location's
# next restart. Each is read at its first use, not when this module is imported: a bad value
# raises its SettingsError where the caller reports it (`rastro` as one line, the code
# location as its load error) instead of breaking every import of this module.
LOAD_TIME_SETTINGS: dict[str, Callable[[], object]] = {
    "SENSOR_INTERVAL_OVERRIDE_SECONDS": lambda: sensor_interval_override_seconds(
        os.environ.get("RASTRO_SENSOR_INTERVAL_SECONDS")
    ),
    "SYNC_LEASE_SECONDS": lambda: sync_lease_seconds(os.environ.get("RASTRO_SYNC_LEASE_SECONDS")),
    "RETENTION": lambda: Retention.from_env(),
    "PARTITIONS_START": lambda: partitions_start(os.environ.get("RASTRO_PARTITIONS_START")),
    "IDLE_LIVE_INTERVAL_MINUTES": lambda: idle_live_interval_minutes(
        os.environ.get("RASTRO_IDLE_LIVE_INTERVAL_MINUTES")
    ),
    "ACCOUNT_SHARDS": lambda: _account_shards_in(os.environ),
}


def __getattr__(name: str) -> object:
    # `from rastro_assets.settings import ACCOUNT_SHARDS` lands here the first time.
    read = LOAD_TIME_SETTINGS.get(name)
    if read is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = read()
    globals()[name] = value
    return value


def check_load_time_settings() -> None:
    """Read every value read when the code loads: the first bad one raises its
    SettingsError, naming the variable and the value."""
    for name in LOAD_TIME_SETTINGS:
        if name not in globals():
            __getattr__(name)


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


def _not_found(variable: str, tried: Path, here: Path) -> str:
    return (
        f"{variable} is not set and no project of rastro_assets was found from {here} upward (a"
        f" directory whose workspace.yaml loads {CODE_LOCATION_MODULE}, or whose {DATA_DIR}/"
        f" holds {PIPELINE_FILE_NAME} or {ANALYTICS_FILE_NAME}); tried {tried}: set {variable}"
        " to the file's path, or run from inside the project"
    )


def check_not_beside_a_guess(snapshot_path: str | os.PathLike[str]) -> None:
    """When no variable names the pipeline's file, its path is a guess that may name
    nothing, and a snapshot path that is a link to the pipeline's file would match nothing.
    So the snapshot is also compared with the pipeline's file beside the file it really is,
    links followed: `NotTheSnapshot` when it is that file. A file of the pipeline's under
    another name is caught by its tables when it is opened (`open_snapshot`)."""
    real = Path(os.path.realpath(snapshot_path))
    check_not_the_pipeline_file(snapshot_path, real.parent / PIPELINE_FILE_NAME)


def default_analytics_path(duckdb_path: str) -> str:
    """The snapshot beside the pipeline's file: `data/analytics.duckdb` by default."""
    return str(Path(duckdb_path).parent / ANALYTICS_FILE_NAME)


@dataclass(frozen=True)
class Settings:
    duckdb_path: str = DEFAULT_DUCKDB_PATH
    graph_url: str = DEFAULT_GRAPH_URL
    use_fake_graph: bool = False
    analytics_path: str | None = None
    """The analytics snapshot; None: `analytics.duckdb` beside the pipeline's file."""
    analytics_mode: int = DEFAULT_ANALYTICS_MODE
    analytics_lag_seconds: int = DEFAULT_ANALYTICS_LAG_SECONDS
    """How far the snapshot may lag a write to the pipeline's file."""
    account_shards: int = DEFAULT_ACCOUNT_SHARDS
    """How many spend asset pairs (shards) the code location defines."""
    shard_accounts: int = DEFAULT_SHARD_ACCOUNTS
    """How many accounts a shard takes before new ones go to the next."""
    analytics_storage_version: str = DEFAULT_ANALYTICS_STORAGE_VERSION
    """The DuckDB storage version the snapshot is written in (`STORAGE_VERSION`)."""
    not_found: str | None = field(default=None, compare=False)
    """Why `duckdb_path` is only a guess: no variable named it and no project was found
    from the working directory (`from_env`); None when it was named or found."""

    def __post_init__(self) -> None:
        check_not_the_pipeline_file(self.snapshot_path, self.duckdb_path)

    @property
    def snapshot_path(self) -> str:
        return self.analytics_path or default_analytics_path(self.duckdb_path)

    def require_duckdb_path(self) -> str:
        """The pipeline's file; SettingsError (one line, naming the path tried and the
        variable to set) when it is only a guess."""
        if self.not_found is not None:
            raise SettingsError(self.not_found)
        return self.duckdb_path

    def require_snapshot_path(self) -> str:
        """The analytics snapshot; SettingsError when it is only a guess."""
        if self.not_found is not None and self.analytics_path is None:
            raise SettingsError(
                _not_found(
                    "RASTRO_ANALYTICS_PATH",
                    Path(self.snapshot_path).absolute(),
                    Path(self.duckdb_path).absolute().parent.parent,
                )
            )
        return self.snapshot_path

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
    ) -> Settings:
        """The settings of the environment; the files, when no variable names them, are
        found from `cwd` (default: the working directory) upward (`find_data_dir`)."""
        env = os.environ if environ is None else environ
        duckdb_path, not_found = env.get("RASTRO_DUCKDB_PATH"), None
        if not duckdb_path:
            here = Path(os.getcwd() if cwd is None else cwd).absolute()
            data = find_data_dir(here)
            if data is None:
                guess = here / DEFAULT_DUCKDB_PATH
                not_found = _not_found("RASTRO_DUCKDB_PATH", guess, here)
                duckdb_path = str(guess)
            else:
                duckdb_path = str(data / PIPELINE_FILE_NAME)
        settings = cls(
            duckdb_path=duckdb_path,
            not_found=not_found,
            graph_url=(env.get("RASTRO_META_GRAPH_URL") or DEFAULT_GRAPH_URL).rstrip("/"),
            use_fake_graph=(
                env.get("RASTRO_META_FAKE", "").strip().lower() in {"1", "true", "yes"}
            ),
            analytics_path=env.get("RASTRO_ANALYTICS_PATH") or None,
            analytics_mode=_octal_mode(env.get("RASTRO_ANALYTICS_MODE")),
            analytics_lag_seconds=_lag_seconds(env.get("RASTRO_ANALYTICS_LAG_SECONDS")),
            analytics_storage_version=storage_version(env.get("RASTRO_ANALYTICS_STORAGE_VERSION")),
            account_shards=_account_shards_in(env),
            shard_accounts=shard_accounts(env.get("RASTRO_SHARD_ACCOUNTS")),
        )
        if not env.get("RASTRO_DUCKDB_PATH"):
            check_not_beside_a_guess(settings.snapshot_path)
        return settings


def storage_version(raw: str | None) -> str:
    """`RASTRO_ANALYTICS_STORAGE_VERSION`: a DuckDB release, `v1.0.0` or later, like `v1.2.0`."""
    if not raw:
        return DEFAULT_ANALYTICS_STORAGE_VERSION
    if not re.fullmatch(r"v[1-9][0-9]*\.[0-9]+\.[0-9]+", raw.strip()):
        raise SettingsError(
            f"RASTRO_ANALYTICS_STORAGE_VERSION must be a DuckDB release from v1.0.0 on, like"
            f" {DEFAULT_ANALYTICS_STORAGE_VERSION} or v1.2.0, not {raw!r}"
        )
    return raw.strip()


def _octal_mode(raw: str | None) -> int:
    if not raw:
        return DEFAULT_ANALYTICS_MODE
    try:
        mode = int(raw, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777 or not mode & 0o400:
        raise SettingsError(
            f"RASTRO_ANALYTICS_MODE must be an octal file mode the owner can read, like 0644"
            f" or 0640, not {raw!r}"
        )
    return mode


def _lag_seconds(raw: str | None) -> int:
    return _whole_number(
        raw,
        DEFAULT_ANALYTICS_LAG_SECONDS,
        least=30,
        refusal="RASTRO_ANALYTICS_LAG_SECONDS must be a whole number of seconds, 30 or more",
    )


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
            value = _whole_number(
                env.get(name),
                int(default.total_seconds() // 60),
                least=1,
                refusal=f"{name} must be a whole number of minutes, 1 or more",
            )
            return timedelta(minutes=value)

        return cls(
            stale=minutes("RASTRO_ALERT_STALE_MINUTES", cls.stale),
            stuck=minutes("RASTRO_ALERT_STUCK_MINUTES", cls.stuck),
            rate_limited=minutes("RASTRO_ALERT_RATE_LIMITED_MINUTES", cls.rate_limited),
            snapshot=minutes("RASTRO_ALERT_SNAPSHOT_MINUTES", cls.snapshot),
            run_failures=_whole_number(
                env.get("RASTRO_ALERT_RUN_FAILURES"),
                cls.run_failures,
                least=1,
                refusal="RASTRO_ALERT_RUN_FAILURES must be a whole number of runs, 1 or more",
            ),
            sensor=minutes("RASTRO_ALERT_SENSOR_MINUTES", cls.sensor),
            remind=minutes("RASTRO_ALERT_REMIND_MINUTES", cls.remind),
        )

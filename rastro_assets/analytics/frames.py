"""The analytics snapshot from a notebook, as polars DataFrames.

```python
from rastro_assets.analytics.frames import Snapshot

snap = Snapshot()                          # RASTRO_ANALYTICS_PATH, else the project's
                                           # data/analytics.duckdb, found from the working
                                           # directory upward (so from notebooks/ too)
snap = Snapshot("data/analytics.duckdb")   # or a path of your choosing
snap.spend("2026-11-01", "2026-11-30", by="campaign", site_id="shop-1")
snap.spend("2026-11-01", "2026-11-30", by=["account", "day"])
snap.status()                              # each account's sync state when it was published
snap.sql("SELECT * FROM ad_catalog WHERE ad_status = ?", ["ACTIVE"])
```

Only the snapshot is ever opened, never the pipeline's own file, and always
read-only and sandboxed: a query reaches the snapshot and nothing else (no
other file, no URL, no extension), and cannot change the connection's
settings (`open_snapshot`). Each call opens the file, runs one query and closes it, so the
next call reads the latest publish; `with snap.connect() as con:` keeps one
publish for several queries. A call opens its own in-memory DuckDB and
attaches the snapshot to it (as `analytics`, the current catalog) rather
than `duckdb.connect(path)`: DuckDB shares one database per path within a
process, so a plain connect would keep reading an old publish for as long
as any other connection of the notebook has the path open.

Money never goes through a float: `spend` is a polars `Decimal` (summed by
DuckDB as `DECIMAL(38,4)`), exactly what Meta reported, and it is never
summed across currencies: every `spend` result has a `currency` column and
splits by it.

`rastro sql` opens the snapshot the same way (`open_snapshot`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

# Named here too: a notebook catches it beside SnapshotMissing.
from rastro_assets.process_settings import NotTheSnapshot as NotTheSnapshot
from rastro_assets.process_settings import Settings, check_not_the_pipeline_file
from rastro_assets.settings import SettingsError, environment

if TYPE_CHECKING:
    import polars as pl

CATALOG = "analytics"
"""The name the snapshot is attached under: `analytics.ad_spend_daily` works everywhere."""

# Loads no Dagster, so none of its superseded, preview or beta warnings.
PUBLISH_NOW = "rastro publish"


class SnapshotMissing(FileNotFoundError):
    """No snapshot has been published at the path yet."""


def missing_message(
    path: str | os.PathLike[str], pipeline_path: str | os.PathLike[str] | None = None
) -> str:
    """Why there is no snapshot at `path`: not published yet when the pipeline's file is
    there; otherwise only that no file is, so a wrong path never reads as "wait"."""
    where = os.path.abspath(path)
    if pipeline_path is not None and os.path.isfile(pipeline_path):
        return (
            f"no analytics snapshot has been published yet at {where}: the daemon publishes"
            f" one within minutes of the first sync; to publish one now, run `{PUBLISH_NOW}`"
        )
    pipeline = (
        f" (nor is the pipeline's file at {os.path.abspath(pipeline_path)})"
        if pipeline_path is not None
        else ""
    )
    return (
        f"no analytics snapshot at {where}: no such file{pipeline}; set RASTRO_ANALYTICS_PATH"
        " to the snapshot's path, or run from inside the project"
    )


@contextmanager
def open_snapshot(
    path: str | os.PathLike[str], *, pipeline_path: str | os.PathLike[str] | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only, sandboxed connection on the snapshot at `path`, closed when the `with`
    ends: it reaches the snapshot and nothing else (no other file, no URL, no extension),
    and its configuration is locked (`lock_down`).

    Never creates a file: a missing snapshot raises `SnapshotMissing`. Refuses
    (`NotTheSnapshot`) a path that is the pipeline's own file (`pipeline_path`), and any
    file that holds the pipeline's own tables whatever its path (a symlink, a copy, a
    guessed `data/analytics.duckdb`), since the pipeline's file holds the sealed tokens and
    even a read-only session there would hold up the pipeline's writers.
    """
    path = Path(path)
    if pipeline_path is not None:
        check_not_the_pipeline_file(path, pipeline_path)
    if not path.is_file():
        raise SnapshotMissing(missing_message(path, pipeline_path))
    con = sandbox_connection()
    try:
        try:
            con.execute(f"ATTACH ? AS {CATALOG} (READ_ONLY)", [str(path)])
        except duckdb.IOException as exc:
            if not path.is_file():  # removed between the check and the open
                raise SnapshotMissing(missing_message(path, pipeline_path)) from exc
            raise
        # Checked on the file DuckDB opened, so no rename or symlink swap after the path
        # checks above can slip the pipeline's file in; a refusal closes it at once.
        refuse_pipeline_tables(con, path)
        con.execute(f"USE {CATALOG}")
        lock_down(con)
        yield con
    finally:
        con.close()


NO_EXTENSIONS = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
}
"""A connection's settings that keep every extension out: nothing installed from the
network, nothing loaded behind a query's back (an `http://` path would load httpfs)."""

NO_SPILLING = {"temp_directory": ""}
"""DuckDB's default spill directory is `.tmp` in the working directory, and once external
access is off DuckDB allows whatever that resolves to, so a `.tmp` symlink to `/` would open
the whole disk. With none, a query that outgrows memory fails instead of spilling."""

PIPELINE_ONLY_TABLES = (
    "meta_connections",
    "meta_sync_runs",
    "schema_version",
    "analytics_snapshot_state",
)
"""Tables the pipeline's file has and a snapshot never does."""


class SandboxUnavailable(RuntimeError):
    """This DuckDB did not close the connection as `lock_down` requires."""


def sandbox_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory connection that loads no extension, spills nowhere, and allows no
    directory and no path of its own: only what it attaches before `lock_down`."""
    con = duckdb.connect(config={**NO_EXTENSIONS, **NO_SPILLING})
    try:
        con.execute("SET allowed_directories = []")
        con.execute("SET allowed_paths = []")
    except BaseException:
        con.close()
        raise
    return con


def refuse_pipeline_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Raise `NotTheSnapshot` when the database attached as `CATALOG` holds a table only the
    pipeline's file has."""
    marks = ", ".join("?" * len(PIPELINE_ONLY_TABLES))
    found = [
        name
        for (name,) in con.execute(
            "SELECT DISTINCT table_name FROM information_schema.tables"
            f" WHERE table_catalog = ? AND table_name IN ({marks}) ORDER BY 1",
            [CATALOG, *PIPELINE_ONLY_TABLES],
        ).fetchall()
    ]
    if found:
        raise NotTheSnapshot(
            f"{os.path.abspath(path)} holds the pipeline's own tables ({', '.join(found)}), so"
            " it is not the analytics snapshot: point RASTRO_ANALYTICS_PATH at the snapshot"
            " the pipeline publishes"
        )


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Close the connection to everything but the databases it has attached.

    With external access off, DuckDB refuses any URL and any path it does not allow: its
    file functions (`read_text`, `read_blob`, `read_csv`, `glob`...), `COPY`, `ATTACH`,
    `INSTALL` and `LOAD`. But it then allows each attached file and its write-ahead log's
    names, following symlinks, and those names stay in `allowed_paths` for good: a symlink
    planted at `<snapshot>.wal`, or a snapshot path retargeted after the attach, would name
    any file. So the local file system is switched off as well; the attached snapshot
    keeps reading through the handle DuckDB already holds. Set after the snapshot is
    attached, then locked, so no query turns any of it back on; then checked, since a
    DuckDB that ignored a setting would leave the disk open.
    """
    con.execute("SET enable_external_access = false")
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET lock_configuration = true")
    check_locked_down(con)


def check_locked_down(con: duckdb.DuckDBPyConnection) -> None:
    """Raise `SandboxUnavailable` unless no directory is allowed, nothing spills, and no
    path, the allowed ones included, can be listed."""
    directories, temp_directory, paths = con.execute(
        "SELECT current_setting('allowed_directories'), current_setting('temp_directory'),"
        " current_setting('allowed_paths')"
    ).fetchone()
    if directories or temp_directory:
        raise SandboxUnavailable(
            f"DuckDB {duckdb.__version__} kept allowed_directories={directories!r},"
            f" temp_directory={temp_directory!r} after the sandbox was locked; refusing to run"
        )
    for probe in ["/", *paths]:
        try:
            con.execute("SELECT count(*) FROM glob(?)", [probe]).fetchall()
        except duckdb.PermissionException:
            continue
        raise SandboxUnavailable(
            f"DuckDB {duckdb.__version__} still lists {probe} after the sandbox was locked;"
            " refusing to run"
        )


# spend ----------------------------------------------------------------------

# Each dimension: the columns it adds, as (name, SQL). Names are chosen by an aggregate
# over the group (the newest catalog name of a campaign or ad set wins), ids group.
_ACCOUNT = [
    ("ad_account_id", "s.ad_account_id"),
    ("account_name", "any_value(m.name)"),
]
_CAMPAIGN = [
    ("campaign_id", "c.campaign_id"),
    ("campaign_name", "arg_max(c.campaign_name, c.updated_at)"),
]
_ADSET = [
    ("adset_id", "c.adset_id"),
    ("adset_name", "arg_max(c.adset_name, c.updated_at)"),
]
_AD = [
    ("ad_id", "s.ad_id"),
    ("ad_name", "arg_max(c.ad_name, c.updated_at)"),
]
DIMENSIONS: dict[str, list[tuple[str, str]]] = {
    "day": [("day", "s.day")],
    "account": _ACCOUNT,
    "campaign": _ACCOUNT + _CAMPAIGN,
    "adset": _ACCOUNT + _CAMPAIGN + _ADSET,
    "ad": _ACCOUNT + _CAMPAIGN + _ADSET + _AD,
    "site": [("site_id", "l.site_id"), ("site_name", "any_value(st.name)")],
}
"""What `spend(by=...)` accepts. Campaigns, ad sets and ads come with their account."""

_GROUPED = {"day", "ad_account_id", "campaign_id", "adset_id", "ad_id", "site_id"}

_METRICS = """
    m.currency AS currency,
    sum(s.spend) AS spend,
    sum(s.impressions)::BIGINT AS impressions,
    sum(s.clicks)::BIGINT AS clicks,
    sum(s.conversations)::BIGINT AS conversations"""


def spend_query(
    by: str | Sequence[str], *, sites: int = 0, accounts: int = 0
) -> tuple[str, list[str]]:
    """The SQL behind `Snapshot.spend` and the names of its key columns.

    Parameters, in order: since, until, then `sites` site ids, then `accounts` account
    ids. Spend of ads not in the catalog yet has null campaign, ad set and names, so
    totals always equal `ad_spend_daily`'s; an account linked to two sites counts once
    unless `site` is a dimension.
    """
    dimensions = [by] if isinstance(by, str) else list(by)
    if not dimensions:
        raise ValueError(f"by needs at least one of {', '.join(DIMENSIONS)}")
    unknown = [name for name in dimensions if name not in DIMENSIONS]
    if unknown:
        raise ValueError(
            f"spend(by=...) knows {', '.join(DIMENSIONS)}; not {', '.join(map(repr, unknown))}"
        )
    columns: dict[str, str] = {}
    for name in dimensions:
        for column, expression in DIMENSIONS[name]:
            columns.setdefault(column, expression)
    by_site = "site" in dimensions
    where = ["s.day BETWEEN ? AND ?"]
    if sites:
        marks = ", ".join("?" * sites)
        where.append(
            f"l.site_id IN ({marks})"
            if by_site
            else "s.ad_account_id IN (SELECT ad_account_id FROM site_ad_accounts"
            f" WHERE site_id IN ({marks}))"
        )
    if accounts:
        where.append(f"s.ad_account_id IN ({', '.join('?' * accounts)})")
    keys = [column for column in columns if column in _GROUPED]
    select = ",\n    ".join(f"{expression} AS {column}" for column, expression in columns.items())
    site_join = (
        "JOIN site_ad_accounts l ON l.ad_account_id = s.ad_account_id\n"
        "LEFT JOIN sites st ON st.site_id = l.site_id\n"
        if by_site
        else ""
    )
    group = ", ".join([columns[key] for key in keys] + ["m.currency"])
    order = ", ".join(
        [f"{column} NULLS LAST" for column in columns if column in _GROUPED] + ["currency"]
    )
    sql = (
        f"SELECT\n    {select},{_METRICS}\n"
        "FROM ad_spend_daily s\n"
        "JOIN meta_ad_accounts m ON m.ad_account_id = s.ad_account_id\n"
        "LEFT JOIN ad_catalog c ON c.ad_id = s.ad_id\n"
        f"{site_join}"
        f"WHERE {' AND '.join(where)}\n"
        f"GROUP BY {group}\n"
        f"ORDER BY {order}"
    )
    return sql, [*columns]


def _day(value: date | str, name: str) -> date:
    if isinstance(value, datetime):
        raise TypeError(f"{name} is a day (a date or 'YYYY-MM-DD'), not an instant: {value!r}")
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a date or 'YYYY-MM-DD', not {value!r}") from None


def _ids(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


class Snapshot:
    """The analytics snapshot at one path; every method reads the latest publish."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        settings = Settings.from_env(dict(environment(environ)))
        if path is None:
            try:
                path = settings.require_snapshot_path()
            except SettingsError as exc:
                raise SnapshotMissing(str(exc)) from None
        self.path = Path(path)
        self.pipeline_path = settings.duckdb_path

    def __repr__(self) -> str:
        return f"Snapshot({str(self.path)!r})"

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One read-only connection, for several queries over the same publish."""
        with open_snapshot(self.path, pipeline_path=self.pipeline_path) as con:
            yield con

    def sql(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None):
        """The result of `query` (with `?` or `$name` parameters) as a polars DataFrame."""
        with self.connect() as con:
            return _frame(con, query, params)

    def spend(
        self,
        since: date | str,
        until: date | str,
        by: str | Sequence[str] = "day",
        *,
        site_id: str | Sequence[str] | None = None,
        ad_account_id: str | Sequence[str] | None = None,
    ) -> pl.DataFrame:
        """Spend, impressions, clicks and conversations from `since` to `until` (both
        included, account-local days), one row per value of `by` and currency.

        `by` is one of `DIMENSIONS` or a list of them: `day`, `account`, `campaign`,
        `adset`, `ad` (each with its ids and newest names, and its account) or `site`.
        `site_id` and `ad_account_id` (one id or a list) narrow the accounts read.
        `spend` is a Decimal in the row's `currency`.
        """
        first, last = _day(since, "since"), _day(until, "until")
        if first > last:
            raise ValueError(f"since ({first}) is after until ({last})")
        sites, accounts = _ids(site_id), _ids(ad_account_id)
        query, _ = spend_query(by, sites=len(sites), accounts=len(accounts))
        return self.sql(query, [first, last, *sites, *accounts])

    def status(self) -> pl.DataFrame:
        """Each linked account's sync status when the snapshot was published: state, last
        and next sync, backfill progress, last error, and how fresh its local today is."""
        return self.sql("SELECT * FROM account_sync_status ORDER BY ad_account_id")

    def published_at(self) -> datetime:
        """When the snapshot was published."""
        with self.connect() as con:
            return con.execute("SELECT max(published_at) FROM snapshot_info").fetchone()[0]


def _frame(con: duckdb.DuckDBPyConnection, query: str, params) -> pl.DataFrame:
    import polars as pl

    relation = con.sql(query, params=params)
    return pl.DataFrame() if relation is None else relation.pl()

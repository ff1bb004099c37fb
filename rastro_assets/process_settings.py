"""`Settings`: what one process (a `rastro` command, the code location) runs with, read
from the environment: the pipeline's file (else found from the working directory), the
analytics snapshot beside it and how it is written, the Graph to ask, and the shards.

A leaf like `settings.py`, whose parsing and error it shares.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rastro_assets.settings import (
    ANALYTICS_FILE_NAME,
    CODE_LOCATION_MODULE,
    DATA_DIR,
    DEFAULT_ACCOUNT_SHARDS,
    DEFAULT_ANALYTICS_LAG_SECONDS,
    DEFAULT_ANALYTICS_MODE,
    DEFAULT_ANALYTICS_STORAGE_VERSION,
    DEFAULT_DUCKDB_PATH,
    DEFAULT_GRAPH_URL,
    DEFAULT_SHARD_ACCOUNTS,
    PIPELINE_FILE_NAME,
    RASTRO_ACCOUNT_SHARDS,
    RASTRO_ANALYTICS_LAG_SECONDS,
    RASTRO_ANALYTICS_MODE,
    RASTRO_ANALYTICS_PATH,
    RASTRO_ANALYTICS_STORAGE_VERSION,
    RASTRO_DUCKDB_PATH,
    RASTRO_META_FAKE,
    RASTRO_META_GRAPH_URL,
    RASTRO_SHARD_ACCOUNTS,
    RASTRO_WAREHOUSE_URL,
    SettingsError,
    environment,
    find_data_dir,
)


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
    warehouse_url: str | None = field(default=None, repr=False)
    """RASTRO_WAREHOUSE_URL: the warehouse on a PostgreSQL server instead of the DuckDB file
    of `duckdb_path`. Never shown: it may carry a password."""
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
        env = environment(environ)
        duckdb_path, not_found = RASTRO_DUCKDB_PATH.read(env), None
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
            graph_url=RASTRO_META_GRAPH_URL.read(env),
            use_fake_graph=RASTRO_META_FAKE.read(env),
            analytics_path=RASTRO_ANALYTICS_PATH.read(env),
            warehouse_url=RASTRO_WAREHOUSE_URL.read(env),
            analytics_mode=RASTRO_ANALYTICS_MODE.read(env),
            analytics_lag_seconds=RASTRO_ANALYTICS_LAG_SECONDS.read(env),
            analytics_storage_version=RASTRO_ANALYTICS_STORAGE_VERSION.read(env),
            # The definitions (at load) and the CLI must agree on the shards, or `rastro
            # link` would place accounts in pairs the code location does not define.
            account_shards=RASTRO_ACCOUNT_SHARDS.read(env),
            shard_accounts=RASTRO_SHARD_ACCOUNTS.read(env),
        )
        if not RASTRO_DUCKDB_PATH.read(env):
            check_not_beside_a_guess(settings.snapshot_path)
        return settings


def warehouse_engine(environ: Mapping[str, str] | None = None) -> str:
    """`postgres` when RASTRO_WAREHOUSE_URL is set, else `duckdb`: what the definitions show
    as the warehouse tables' kind."""
    return "postgres" if RASTRO_WAREHOUSE_URL.is_set(environ) else "duckdb"

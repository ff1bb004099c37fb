"""Publishing the analytics snapshot: a new file renamed over the old one.

A session open on the snapshot holds the file it opened (its inode), and
DuckDB's lock is on that inode: so each publish writes a whole new file beside
the old one, flushes it, and renames it over the old name. An open session
keeps reading its copy undisturbed, the next session opens the new one, and
no reader ever sees a half-written file. A publish that dies (disk full,
killed) leaves the previous snapshot whole, and the next one retries.

A new file costs a copy of every byte, so the copy is all a publish does on
the analysts' side: the private staging file it copies is kept current by
`staging.refresh`, which applies only what changed.

Analysts bring their own DuckDB (a shell, DBeaver, Metabase, a notebook), often
older than the pipeline's, and DuckDB reads no file written in a newer storage
format than its own. So the staging file, and with it each byte-for-byte copy,
is written in `Settings.analytics_storage_version` (DuckDB's `STORAGE_VERSION`,
`v1.0.0` by default); a staging file in another version is rebuilt whole.

Publishes ride on the runs that wrote (`publish_if_due` at their end),
debounced by `Settings.analytics_lag_seconds`; a sensor publishes what no run
got to (see `rastro_assets.defs.analytics`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import duckdb

from rastro_assets.analytics import pg_reader, staging, staging_pg
from rastro_assets.analytics.status import status_table
from rastro_assets.planner.history import planned_accounts
from rastro_assets.process_settings import Settings, check_not_the_pipeline_file
from rastro_assets.settings import DEFAULT_ANALYTICS_STORAGE_VERSION, storage_version
from rastro_assets.timekeeping import Clock, system_clock
from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse


class PublishError(Exception):
    """The snapshot could not be published; the previous one is untouched."""


@dataclass(frozen=True)
class PublishResult:
    """One publish, as the `analytics_snapshot` asset's metadata shows it."""

    path: str
    published_at: datetime
    bytes: int
    rows: dict[str, int]
    duration_seconds: float
    refresh_seconds: float
    copy_seconds: float
    lag_seconds: float | None
    """How long the oldest change it carries waited to be published."""
    rebuilt: tuple[str, ...]
    healed: tuple[str, ...]
    """Tables rebuilt whole because the delta left them unequal to the pipeline."""
    changed_account_days: int


@dataclass(frozen=True)
class PublishState:
    """What the pipeline's file remembers of the last publish to a path."""

    fingerprint: str | None
    published_at: datetime | None
    current_fingerprint: str
    stray_wal: bool = False
    """A write-ahead log sits beside the snapshot: an analyst wrote into it, and every new
    session fails replaying that log until a publish removes it."""

    @property
    def owed(self) -> bool:
        return self.stray_wal or self.fingerprint != self.current_fingerprint


class Publisher:
    """Publishes the snapshot of one warehouse to one path."""

    def __init__(
        self,
        warehouse: Warehouse | PostgresWarehouse,
        target: str | os.PathLike[str],
        *,
        mode: int = 0o644,
        lag: timedelta = timedelta(seconds=300),
        clock: Clock = system_clock,
        timer: Clock = system_clock,
        storage: str = DEFAULT_ANALYTICS_STORAGE_VERSION,
    ) -> None:
        check_not_the_pipeline_file(target, warehouse.path)
        # Checked here too: it is spliced into the ATTACH statement.
        self.storage = storage_version(storage)
        self.warehouse = warehouse
        self.target = Path(target)
        self.mode = mode
        self.lag = lag
        # `clock` is the product's "now" for the accounts' status (pinned in replays);
        # `timer` dates the publishes themselves, so the debounce runs on real time.
        self.clock = clock
        self.timer = timer
        # Private to the publisher: never opened by analysts, copied at each publish.
        self.staging = self.target.with_name(f".{self.target.name}.staging")
        self._lock_path = self.target.with_name(f".{self.target.name}.lock")

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        warehouse: Warehouse | PostgresWarehouse,
        clock: Clock = system_clock,
        timer: Clock = system_clock,
    ) -> Publisher:
        return cls(
            warehouse,
            settings.snapshot_path,
            mode=settings.analytics_mode,
            lag=timedelta(seconds=settings.analytics_lag_seconds),
            clock=clock,
            timer=timer,
            storage=settings.analytics_storage_version,
        )

    @property
    def run_interval(self) -> timedelta:
        """A run that wrote publishes when the last publish is at least this old."""
        return self.lag / 2

    @property
    def sensor_interval(self) -> timedelta:
        """The sensor publishes what runs left unpublished this long; with its tick and
        the run's start, a write still reaches the snapshot within `lag`."""
        return self.lag * 0.7

    def state(self, con: duckdb.DuckDBPyConnection) -> PublishState:
        row = con.execute(
            "SELECT fingerprint, published_at FROM analytics_snapshot_state WHERE target = ?",
            [self._key],
        ).fetchone()
        fingerprint, published_at = row if row else (None, None)
        if not self.target.exists():
            fingerprint = None
        return PublishState(
            fingerprint,
            published_at,
            staging.fingerprint(con),
            stray_wal=_wal(self.target).exists(),
        )

    def is_due(self, state: PublishState, now: datetime, interval: timedelta) -> bool:
        """Owed, and the last publish is at least `interval` old (or there is none); at
        once when a stray write-ahead log keeps new sessions out."""
        if not state.owed:
            return False
        if state.stray_wal:
            return True
        return state.published_at is None or now - state.published_at >= interval

    def publish_if_due(self, interval: timedelta | None = None) -> PublishResult | None:
        """Publish when changes are owed and the last publish is older than `interval`
        (default: `run_interval`); None when not due or another process is publishing."""
        interval = self.run_interval if interval is None else interval
        with self.warehouse.connect() as con:
            due = self.is_due(self.state(con), self.timer(), interval)
        return self.publish() if due else None

    def publish(self) -> PublishResult | None:
        """Refresh the staging file, then publish a copy of it; None when another process
        is publishing right now (its publish carries what this one would have)."""
        with self._exclusive() as held:
            if not held:
                return None
            return self._publish()

    @property
    def _key(self) -> str:
        return os.path.abspath(self.target)

    def _publish(self) -> PublishResult:
        started = time.perf_counter()
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        now = self.timer()
        report = self._refresh(self.clock(), now)
        refreshed = time.perf_counter()
        size = self._copy_into_place()
        copied = time.perf_counter()
        with self.warehouse.connect() as con:
            con.execute(
                """
                INSERT INTO analytics_snapshot_state
                    (target, fingerprint, published_at, bytes, duration_ms)
                VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (target) DO UPDATE SET fingerprint = excluded.fingerprint,
                    published_at = excluded.published_at, bytes = excluded.bytes,
                    duration_ms = excluded.duration_ms
                """,
                [self._key, report.fingerprint, now, size, round((copied - started) * 1000)],
            )
        lag = None
        if report.oldest_change_at is not None:
            lag = max(0.0, (self.timer() - report.oldest_change_at).total_seconds())
        return PublishResult(
            path=str(self.target),
            published_at=now,
            bytes=size,
            rows=report.rows,
            duration_seconds=copied - started,
            refresh_seconds=refreshed - started,
            copy_seconds=copied - refreshed,
            lag_seconds=lag,
            rebuilt=report.rebuilt,
            healed=report.healed,
            changed_account_days=report.changed_account_days,
        )

    def _refresh(self, now: datetime, published_at: datetime) -> staging.RefreshReport:
        try:
            return self._refresh_staging(now, published_at)
        except _StagingFailed as failed:
            if not _is_unreadable_file(failed.__cause__):
                raise PublishError(
                    f"could not refresh the staging file {self.staging}:"
                    f" {_reason(failed.__cause__)}; the previous snapshot is unchanged"
                ) from failed.__cause__
        # A staging file DuckDB cannot read is only a cache of the pipeline: start again.
        try:
            return self._refresh_staging(now, published_at)
        except _StagingFailed as failed:
            raise PublishError(
                f"could not rebuild the staging file {self.staging}:"
                f" {_reason(failed.__cause__)}; the previous snapshot is unchanged"
            ) from failed.__cause__

    def _refresh_staging(self, now: datetime, published_at: datetime) -> staging.RefreshReport:
        try:
            if self.staging.exists() and _storage_tag(self.staging) != self._wanted_storage():
                self._remove_staging()
        except duckdb.Error as exc:
            # Unreadable from its first page: the retry starts from a new file.
            self._remove_staging()
            raise _StagingFailed from exc
        if dialect.is_postgres(self.warehouse):
            return self._refresh_staging_from_postgres(now, published_at)
        with self.warehouse.connect() as con:
            status = status_table(planned_accounts(con), now)
            try:
                with self._staging_attached(con):
                    report = staging.refresh(con, status, published_at)
            except (duckdb.Error, OSError) as exc:
                failure = exc
            else:
                return report
        # Only a cache of the pipeline: after a failure part way (a full disk leaves a
        # .wal, maybe empty), nothing it holds is trusted; the next refresh rebuilds it whole.
        self._remove_staging()
        raise _StagingFailed from failure

    def _refresh_staging_from_postgres(
        self, now: datetime, published_at: datetime
    ) -> staging.RefreshReport:
        """As `_refresh_staging`, the warehouse read over ADBC: the staging file is the
        only database this DuckDB connection opens."""
        with self.warehouse.connect() as con:
            status = status_table(planned_accounts(con), now)
        try:
            with duckdb.connect() as con, pg_reader.open_reader(
                self.warehouse.url_with_password
            ) as source, self._staging_attached(con):
                report = staging_pg.refresh(con, source, status, published_at)
        except pg_reader.SourceFailed as exc:
            # The staging file's transaction rolled back: it is whole, and kept.
            raise PublishError(f"{exc}; the previous snapshot is unchanged") from None
        except (duckdb.Error, OSError) as exc:
            failure = exc
        else:
            return report
        self._remove_staging()
        raise _StagingFailed from failure

    @contextlib.contextmanager
    def _staging_attached(self, con: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """The staging file attached to `con` as `staging.STAGE` for the body; checkpointed
        when the body ends well, detached however it ends."""
        con.execute(
            f"ATTACH ? AS {staging.STAGE} (STORAGE_VERSION '{self.storage}')",
            [str(self.staging)],
        )
        try:
            # A cache of analyst data only, but nobody else's business to read.
            os.chmod(self.staging, 0o600)
            yield
            con.execute(f"CHECKPOINT {staging.STAGE}")
        finally:
            con.execute(f"DETACH {staging.STAGE}")

    def _copy_into_place(self) -> int:
        if _wal(self.staging).exists():
            raise PublishError(f"the staging file {self.staging} was not checkpointed")
        temporary = self.target.with_name(f".{self.target.name}.{os.getpid()}.tmp")
        try:
            # Created private, so no one reads it before it has its final mode; copyfile
            # keeps that mode and copies in the kernel (sendfile).
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            shutil.copyfile(self.staging, temporary)
            _drop_bookkeeping(temporary)
            # Nobody writes the snapshot: without write bits, DuckDB cannot open it read-write,
            # so no analyst leaves a write-ahead log or a lock that keeps others out.
            os.chmod(temporary, self.mode & ~0o222)
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, self.target)
            # A session that wrote into the previous snapshot left its write-ahead log beside
            # it; DuckDB would refuse to open the new file with that log there. Its writes
            # belong to the old copy and are lost with it (the docs say so). A session still
            # open on an old copy may write a new log later: `state` sees it, and the sensor
            # publishes again at its next tick.
            with contextlib.suppress(FileNotFoundError):
                _wal(self.target).unlink()
        except (OSError, duckdb.Error) as exc:
            for path in (temporary, _wal(temporary)):
                with contextlib.suppress(OSError):
                    path.unlink()
            raise PublishError(
                f"could not publish the analytics snapshot {self.target}: {_reason(exc)};"
                " the previous snapshot is unchanged"
            ) from exc
        _fsync_directory(self.target.parent)
        return self.target.stat().st_size

    def _wanted_storage(self) -> str:
        """How DuckDB names the storage of a file made in `self.storage` (`v1.0.0+`): known
        only by making one, since several releases share a storage format."""
        probe = self.target.with_name(f".{self.target.name}.{os.getpid()}.probe.tmp")
        try:
            return _storage_tag(probe, create_in=self.storage)
        finally:
            for path in (probe, _wal(probe)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def _remove_leftovers(self) -> None:
        """Temporary files of publishes that died (we hold the lock: none is running)."""
        for pattern in (f".{self.target.name}.*.tmp", f".{self.target.name}.*.tmp.wal"):
            for leftover in self.target.parent.glob(pattern):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _remove_staging(self) -> None:
        for path in (self.staging, _wal(self.staging)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[bool]:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(descriptor)


class _StagingFailed(Exception):
    """The staging file's refresh failed (its cause says how); the file is gone."""


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "the disk is full"
    if isinstance(exc, duckdb.Error) and "No space left on device" in str(exc):
        return f"the disk is full ({exc})"
    return str(exc)


def _drop_bookkeeping(copy: Path) -> None:
    """The staging file's bookkeeping, out of the copy analysts get: the schema would show in
    their `information_schema`. Dropping it frees its few blocks, and the copy stays one file
    (the checkpoint folds the drop in and removes the log)."""
    with duckdb.connect(str(copy)) as con:
        con.execute(f"DROP SCHEMA IF EXISTS {staging.BOOKKEEPING} CASCADE")
        con.execute("CHECKPOINT")
    if _wal(copy).exists():
        raise PublishError(f"the copy {copy} was not checkpointed")


def _storage_tag(path: Path, create_in: str | None = None) -> str:
    """The storage DuckDB reports for the file at `path` (opened read-only), or for a new
    file made there in storage version `create_in`."""
    option = "READ_ONLY" if create_in is None else f"STORAGE_VERSION '{create_in}'"
    with duckdb.connect() as con:
        con.execute(f"ATTACH ? AS probed ({option})", [str(path)])
        return con.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() WHERE database_name = 'probed'"
        ).fetchone()[0]


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _is_unreadable_file(exc: BaseException | None) -> bool:
    text = str(exc)
    return isinstance(exc, duckdb.SerializationException | duckdb.IOException) and (
        "not a valid DuckDB database file" in text
        or "Corrupt" in text
        or "corrupt" in text
        or "checksum" in text
    )


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

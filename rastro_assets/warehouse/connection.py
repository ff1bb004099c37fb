"""Short-lived DuckDB connections that wait politely for another process's lock.

A process holding a read-write connection locks the file against every other
process, readers included. So every caller opens briefly, closes in `finally`,
never holds the file across a network call, and retries the open with a
bounded, jittered back-off when someone else holds it.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import duckdb

from rastro_assets.process_settings import default_analytics_path
from rastro_assets.warehouse import dialect, schema

FIRST_RETRY_SECONDS = 0.05
MAX_RETRY_SECONDS = 2.0
DEFAULT_LOCK_WAIT_SECONDS = 60.0

# Connections with a transaction opened by `transaction`: nested calls join it
# without asking DuckDB.
_OWNED: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()

# Connections of one process share the file (no DuckDB lock between them):
# migrations of the same file within this process take turns here.
_MIGRATION_LOCKS: dict[str, threading.Lock] = {}
_MIGRATION_LOCKS_GUARD = threading.Lock()

PIPELINE_FILE_MODE = 0o600
"""The pipeline's file holds sealed tokens: only its owner reads it."""
PIPELINE_DIR_MODE = 0o700
"""A directory made for the pipeline's file: only its owner lists or changes it."""

PIPELINE_STORAGE_VERSION = "v1.5.0"
"""The storage a new pipeline file is written in: the newest the DuckDB shell the README
installs (`.venv/bin/duckdb`, duckdb-cli 1.5) reads, so the operators' documented queries
run in it. DuckDB 2 would otherwise write its own, which no 1.x release opens. A file keeps
the storage it was created with: one an earlier release created in DuckDB 2's stays so."""

Connection = duckdb.DuckDBPyConnection
"""What the rest of the product holds when it asks the warehouse: a connection it passes on."""
WarehouseError = dialect.Error
"""Any error a warehouse statement raises, on either engine, for callers that say it in their
own words."""

_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.+?) \(PID (?P<pid>\d+)\)")


class WarehouseLocked(Exception):
    """Another process kept the warehouse file locked for longer than we wait."""

    def __init__(
        self,
        path: str,
        *,
        holder: str | None,
        pid: int | None,
        waited_seconds: float,
        snapshot_path: str,
    ) -> None:
        self.path = path
        self.holder = holder
        self.pid = pid
        self.waited_seconds = waited_seconds
        who = f"{holder} (PID {pid})" if pid is not None else (holder or "another connection")
        super().__init__(
            f"the warehouse {path} is locked by another process, {who}, and stayed locked"
            f" for {waited_seconds:.1f} s. It is the pipeline's own file: query the analytics"
            f" snapshot instead ({snapshot_path}, or `rastro sql`), which stays open"
            " as long as you like; close any session on the pipeline's file, then retry"
        )


class WarehouseUnreadable(duckdb.IOException):
    """RASTRO_DUCKDB_PATH names something DuckDB cannot open as a database: a directory, a
    file of another kind, a truncated one. Bad input, so a `duckdb.Error` all the same."""

    def __init__(self, path: str, reason: BaseException) -> None:
        self.path = os.path.abspath(path)
        detail = " ".join(str(reason).split())
        super().__init__(
            f"the warehouse {self.path} (RASTRO_DUCKDB_PATH) cannot be opened as the pipeline's"
            f" DuckDB file: {detail}"
        )


class Warehouse:
    """The DuckDB file: where it is, and how to open it without fighting over it."""

    engine = dialect.DUCKDB

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        snapshot_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = str(path)
        # Named in the lock error, where analysts should look instead: the settings' snapshot
        # (`Settings.snapshot_path`), or the default beside the file.
        self.snapshot_path = str(snapshot_path or default_analytics_path(self.path))
        self.lock_wait_seconds = lock_wait_seconds
        self._sleep = sleep
        self._migrated = False
        self._keeper: duckdb.DuckDBPyConnection | None = None
        self._keeper_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Warehouse({self.path!r})"

    @property
    def location(self) -> str:
        """Where it is, as messages name it: the file's absolute path."""
        return os.path.abspath(self.path)

    def exists(self) -> bool:
        """Whether there is a warehouse to look at. Opening a missing file would create it:
        a command that only looks asks this first."""
        return os.path.exists(self.path)

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for the body of the `with`, closed when it ends.

        The first read-write connection of this object brings the schema up
        to date. A read-only connection never writes; on a file that does not
        exist yet or is behind the code, the schema is first migrated through
        a brief read-write connection, so readers always see every table.
        """
        if self._keeper is not None:
            con = self._cursor()
        else:
            con = self._open_current(read_only) if read_only else self._open(read_only)
        try:
            if not read_only and not self._migrated:
                self._migrate_with(con)
            yield con
        finally:
            _close(con)

    @contextmanager
    def held(self) -> Iterator[Warehouse]:
        """Keep the file open read-write while many short connections come and go.

        A wave syncs hundreds of accounts from a few threads. Opening the file
        for each write costs a checkpoint on every close, and threads opening
        and closing the same database at once race inside DuckDB. While held,
        `connect()` hands out cursors of one kept connection instead. Hold it
        only as long as the work: other processes wait while it is held.
        """
        keeper = self._open(read_only=False)
        try:
            if not self._migrated:
                self._migrate_with(keeper)
            self._keeper = keeper
            yield self
        finally:
            self._keeper = None
            _close(keeper)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._keeper_lock:
            con = self._keeper.cursor()
        con.execute("SET TimeZone = 'UTC'")
        return con

    def migrate(self) -> int:
        """Create or migrate the schema; idempotent. The version reached."""
        con = self._open(read_only=False)
        try:
            return self._migrate_with(con)
        finally:
            _close(con)

    def _open_current(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        if self._migrated:
            return self._open(read_only)
        if os.path.exists(self.path):
            con = self._open(read_only)
            try:
                if schema.current_version(con) >= schema.LATEST_VERSION:
                    self._migrated = True
                    return con
            except BaseException:
                _close(con)
                raise
            _close(con)
        self.migrate()
        return self._open(read_only)

    def _migrate_with(self, con: duckdb.DuckDBPyConnection) -> int:
        with _migration_lock(self.path):
            version = schema.migrate(con)
            self._migrated = True
            return version

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        """A connection to the file; a read-write one keeps the umask private until closed.

        Close it with `_close`, which gives the umask back after the last one.
        """
        waited = 0.0
        delay = FIRST_RETRY_SECONDS
        while True:
            try:
                con = self._connect(read_only)
            except duckdb.ConnectionException as exc:
                if "different configuration" not in str(exc):
                    raise
                if read_only:
                    # This process already holds the file read-write: share that.
                    read_only = False
                    continue
                # A read-only connection of this process is open; it is brief.
                holder, pid = "a read-only connection of this same process", os.getpid()
            except duckdb.IOException as exc:
                match = _LOCK_HOLDER.search(str(exc))
                if match is None:
                    raise WarehouseUnreadable(self.path, exc) from exc
                holder, pid = match["exe"], int(match["pid"])
            else:
                try:
                    if not read_only:
                        _keep_private(self.path)
                    con.execute("SET TimeZone = 'UTC'")
                except BaseException:
                    _close(con)
                    raise
                return con
            remaining = self.lock_wait_seconds - waited
            if remaining <= 0:
                raise WarehouseLocked(
                    self.path,
                    holder=holder,
                    pid=pid,
                    waited_seconds=waited,
                    snapshot_path=self.snapshot_path,
                )
            pause = min(delay * random.uniform(0.75, 1.25), MAX_RETRY_SECONDS, remaining)
            self._sleep(pause)
            waited += pause
            delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _connect(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        if read_only:
            return duckdb.connect(self.path, read_only=True)
        _private_umask.acquire()
        try:
            try:
                Path(self.path).parent.mkdir(mode=PIPELINE_DIR_MODE, parents=True, exist_ok=True)
            except OSError as exc:
                raise WarehouseUnreadable(self.path, exc) from exc
            if not os.path.lexists(self.path):
                _create(self.path)
            con = duckdb.connect(self.path, read_only=False)
        except BaseException:
            _private_umask.release()
            raise
        _PRIVATE.add(con)
        return con


def _create(path: str) -> None:
    """Create the file in `PIPELINE_STORAGE_VERSION`, with a connection of its own.

    The storage a file is created in is kept by every later connection, whatever its
    settings; and within one process DuckDB refuses a second connection to a file whose
    settings differ from the open one's, so the others open it with none.
    """
    duckdb.connect(
        path, config={"storage_compatibility_version": PIPELINE_STORAGE_VERSION}
    ).close()


class _PrivateUmask:
    """Keeps the process umask denying group and others while a read-write connection is open.

    DuckDB creates the pipeline's file, its `.wal` and its spill directory
    with the process umask, the `.wal` lazily at a connection's first write
    and again after every checkpoint, long after the open. A chmod after the
    fact leaves a window (a wave holds its connection for the whole run), and
    DuckDB removes a `.wal` made in advance. So, counted across threads, the
    first read-write connection adds 077 to the umask and the last one to
    close gives back the umask it found. Files other code creates meanwhile
    are private too; code that needs another mode (the snapshot) sets it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 0

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = os.umask(0o077)
                os.umask(self._saved | 0o077)
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                os.umask(self._saved)


_private_umask = _PrivateUmask()
# Read-write connections opened under `_private_umask`: each gives it back once.
_PRIVATE: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


def _close(con: duckdb.DuckDBPyConnection) -> None:
    """Close `con`; after a read-write connection, give back the private umask.

    Given back only after `close()`, which may write a last checkpoint.
    """
    try:
        con.close()
    finally:
        if con in _PRIVATE:
            _PRIVATE.discard(con)
            _private_umask.release()


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN, then COMMIT when the body ends, ROLLBACK when it raises.

    Inside a transaction already open on `con`, this joins it: the outer owner
    commits or rolls back, so functions that each guard themselves compose
    into one atomic unit.
    """
    if con in _OWNED or in_transaction(con):
        yield con
        return
    con.execute("BEGIN TRANSACTION")
    _OWNED.add(con)
    try:
        yield con
    except BaseException:
        # A failed COMMIT inside the body has already ended the transaction.
        with suppress(*dialect.TransactionEnded):
            con.execute("ROLLBACK")
        raise
    else:
        con.execute("COMMIT")
    finally:
        _OWNED.discard(con)


def in_transaction(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether an explicit transaction is open on `con`.

    DuckDB has no direct question for this, and a failed BEGIN would abort
    the open transaction; but in autocommit mode every statement gets a new
    transaction id, while inside a transaction the id stays put. PostgreSQL says it.
    """
    if dialect.is_postgres(con):
        return con.in_transaction()
    first = con.execute("SELECT txid_current()").fetchall()
    second = con.execute("SELECT txid_current()").fetchall()
    return first == second


def register_arrow(con: duckdb.DuckDBPyConnection, name: str, table: object) -> None:
    """`con.register`, even when the caller left a result half-read.

    DuckDB 2 refuses `register` while an `execute()` result is unfinished;
    `complete()` runs it to its end (older DuckDB has neither the rule nor
    the method).
    """
    complete = getattr(con, "complete", None)
    if complete is not None:
        complete()
    con.register(name, table)


def _keep_private(path: str) -> None:
    """Tighten the file and its `.wal` where an older release or a looser hand left them.

    New files are private from their creation (`_PrivateUmask`); this is for
    files made before it. A directory that already existed keeps the mode its
    owner gave it.
    """
    for candidate in (path, path + ".wal"):
        with suppress(FileNotFoundError):
            if os.stat(candidate).st_mode & 0o777 != PIPELINE_FILE_MODE:
                os.chmod(candidate, PIPELINE_FILE_MODE)


def _migration_lock(path: str) -> threading.Lock:
    key = os.path.realpath(path)
    with _MIGRATION_LOCKS_GUARD:
        return _MIGRATION_LOCKS.setdefault(key, threading.Lock())

"""The warehouse on a PostgreSQL server: connections from a small pool, one statement text.

Set `RASTRO_WAREHOUSE_URL=postgresql://...` and every process (run workers, the daemon,
the CLI, the webserver) shares the warehouse over the network instead of one DuckDB file on
one host. A connection here answers what the rest of `warehouse/` asks of a DuckDB one:
`execute` with `?` or `$name` parameters, `fetchone`, `fetchall`, Arrow tables registered
by name, `BEGIN`/`COMMIT`/`ROLLBACK` as statements. So a statement differs by engine only
where its SQL must (`dialect.pick`).

Nothing here keeps session state a transaction-mode pooler (PgBouncer) would lose: no
server-side prepared statements, temporary tables only for the transaction that made them
or dropped before the connection goes back, the time zone pinned at connect as a startup
option and never relied on by a statement.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import SplitResult, unquote, unquote_plus, urlsplit, urlunsplit

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv
from psycopg import pq, sql

from rastro_assets.warehouse import schema

POOL_IDLE_CONNECTIONS = 4
"""Idle connections a process keeps for the next caller; more may be open at a busy moment."""
CHECK_IDLE_AFTER_SECONDS = 30.0
"""A pooled connection idle longer than this is asked `SELECT 1` before it is lent: the
server may have restarted or failed over, or a pooler closed it, meanwhile."""
CONNECT_TIMEOUT_SECONDS = 10

ENGINE = "postgres"


class WarehouseUnreachable(psycopg.OperationalError):
    """The server named by RASTRO_WAREHOUSE_URL refused us or could not be reached."""


def redacted(url: str) -> str:
    """`url` with its password replaced, fit for any log, message or run record.

    libpq takes a password after the user (`user:secret@host`) or as a query parameter
    (`?password=secret`): both are hidden.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return "postgresql://(unparseable URL)"
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    if query:
        query = "&".join(
            f"{pair.partition('=')[0]}=***" if _is_password(pair) else pair
            for pair in query.split("&")
        )
    return urlunsplit(SplitResult(parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_password(pair: str) -> bool:
    return unquote_plus(pair.partition("=")[0]).strip().lower() == "password"


def _passwords(url: str) -> list[str]:
    """Every spelling of the URL's password that an error could quote."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password] if parts.password else []
    found += [pair.partition("=")[2] for pair in parts.query.split("&") if _is_password(pair)]
    spelled = {text for raw in found if raw for text in (raw, unquote(raw), unquote_plus(raw))}
    return sorted(spelled, key=len, reverse=True)


def is_postgres_url(value: str | None) -> bool:
    return bool(value) and value.split(":", 1)[0] in {"postgresql", "postgres"}


class PostgresWarehouse:
    """A PostgreSQL database: where it is, and a pool of connections to it."""

    engine = ENGINE

    def __init__(
        self,
        url: str,
        *,
        snapshot_path: str | None = None,
        idle_connections: int = POOL_IDLE_CONNECTIONS,
        check_idle_after_seconds: float = CHECK_IDLE_AFTER_SECONDS,
        **_duckdb_only: Any,
    ) -> None:
        if not is_postgres_url(url):
            raise ValueError(f"not a postgresql:// URL: {redacted(url)}")
        self._url = url
        self.path = redacted(url)
        """What messages name: the URL without its password."""
        self.snapshot_path = snapshot_path
        self._idle: list[tuple[psycopg.Connection, float]] = []
        """Each idle connection, with the `time.monotonic()` it came back at."""
        self._idle_limit = idle_connections
        self._check_idle_after = check_idle_after_seconds
        self._lock = threading.Lock()
        self._migrated = False

    def __repr__(self) -> str:
        return f"PostgresWarehouse({self.path!r})"

    @property
    def location(self) -> str:
        """Where it is, as messages name it: the URL without its password."""
        return self.path

    def exists(self) -> bool:
        """Always: the server holds the warehouse, and the first connection migrates it."""
        return True

    @property
    def url_with_password(self) -> str:
        """The URL as set, password included: for another driver to connect with (the
        snapshot's publisher reads over ADBC), never for a message."""
        return self._url

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[PostgresConnection]:
        """A pooled connection for the body of the `with`, given back when it ends.

        The first connection of this object brings the schema up to date, readers too: a
        reader then always sees every table.
        """
        del read_only  # the server keeps readers and writers apart itself
        con = PostgresConnection(self._checkout())
        try:
            if not self._migrated:
                schema.migrate(con)
                self._migrated = True
            yield con
        finally:
            self._checkin(con)

    @contextmanager
    def held(self) -> Iterator[PostgresWarehouse]:
        """Nothing to hold: the server takes many connections at once."""
        yield self

    def migrate(self) -> int:
        with self.connect() as con:
            return schema.current_version(con)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for raw, _ in idle:
            with suppress(Exception):
                raw.close()

    def _checkout(self) -> psycopg.Connection:
        while True:
            with self._lock:
                if not self._idle:
                    break
                raw, returned_at = self._idle.pop()
            if _usable(raw, time.monotonic() - returned_at > self._check_idle_after):
                return raw
            with suppress(Exception):
                raw.close()
        return self._open()

    def _checkin(self, con: PostgresConnection) -> None:
        raw = con.detach()
        healthy = not raw.closed and raw.info.transaction_status == pq.TransactionStatus.IDLE
        with self._lock:
            if healthy and len(self._idle) < self._idle_limit:
                self._idle.append((raw, time.monotonic()))
                return
        with suppress(Exception):
            raw.close()

    def _open(self) -> psycopg.Connection:
        try:
            return psycopg.connect(
                self._url,
                autocommit=True,
                # Never prepared server-side: a transaction-mode pooler hands the next
                # statement to another server connection, which has not seen it.
                prepare_threshold=None,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                options=_with_utc(urlsplit(self._url).query),
                application_name="rastro_assets",
            )
        except psycopg.OperationalError as exc:
            raise WarehouseUnreachable(
                f"the warehouse {self.path} (RASTRO_WAREHOUSE_URL) cannot be reached:"
                f" {_scrubbed(str(exc), self._url)}"
            ) from None


def _usable(raw: psycopg.Connection, ask_the_server: bool) -> bool:
    if raw.closed or raw.info.transaction_status != pq.TransactionStatus.IDLE:
        return False
    if not ask_the_server:
        return True
    try:
        raw.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _with_utc(query: str) -> str:
    """The URL's own `options`, then the UTC time zone, which every timestamp is read in."""
    own = ""
    for pair in query.split("&"):
        name, _, value = pair.partition("=")
        if name == "options":
            own = unquote_plus(value)
    return f"{own} -c TimeZone=UTC".strip()


def _scrubbed(text: str, url: str) -> str:
    """`text` on one line, without the URL's password however it is spelled."""
    text = " ".join(text.split())
    for password in _passwords(url):
        text = text.replace(password, "***")
    return text


class PostgresConnection:
    """One pooled connection, spoken to as the DuckDB connection the warehouse expects."""

    engine = ENGINE

    def __init__(self, raw: psycopg.Connection) -> None:
        self._raw = raw
        self._cursor = raw.cursor()
        self._changed: int | None = None

    @property
    def raw(self) -> psycopg.Connection:
        return self._raw

    def detach(self) -> psycopg.Connection:
        """Give the connection back clean: no open transaction, no temporary table, no
        setting, lock or prepared statement a caller left on the session.

        `DISCARD ALL` puts every setting back to what the connection started with, so the
        startup options (UTC, the URL's own) stay. A connection that cannot be cleaned is
        closed, never lent again.
        """
        raw = self._raw
        with suppress(Exception):
            self._cursor.close()
        try:
            if raw.info.transaction_status != pq.TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
            raw.execute("DISCARD ALL")
        except Exception:
            with suppress(Exception):
                raw.close()
        return raw

    def execute(
        self, statement: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> PostgresConnection:
        self._changed = None
        if parameters is None or (not parameters and not isinstance(parameters, Mapping)):
            self._cursor.execute(statement.replace("%", "%%") if "%" in statement else statement)
        else:
            named = isinstance(parameters, Mapping)
            self._cursor.execute(_pyformat(statement, named), _adapted(parameters))
        if self._cursor.description is None and _changes_rows(self._cursor.statusmessage):
            self._changed = self._cursor.rowcount
        return self

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> PostgresConnection:
        self._cursor.executemany(_pyformat(statement, False), [_adapted(r) for r in rows])
        return self

    def fetchall(self) -> list[tuple]:
        if self._cursor.description is None:
            changed = self.fetchone()
            return [changed] if changed is not None else []
        return self._cursor.fetchall()

    def fetchone(self) -> tuple | None:
        """The next row; after an INSERT, UPDATE or DELETE without RETURNING, once, the
        count of rows it changed, as DuckDB answers."""
        if self._cursor.description is None:
            changed, self._changed = self._changed, None
            return (changed,) if changed is not None else None
        return self._cursor.fetchone()

    @property
    def description(self):
        return self._cursor.description

    def in_transaction(self) -> bool:
        return self._raw.info.transaction_status != pq.TransactionStatus.IDLE

    def complete(self) -> None:
        """Nothing is left half-read here: results come whole."""

    def register(self, name: str, table: pa.Table) -> None:
        """A temporary table named `name` holding `table`'s rows, loaded by `COPY`.

        Made for the open transaction only when there is one; otherwise dropped by
        `unregister` or before the connection goes back to the pool.
        """
        self.unregister(name)
        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(field.name), sql.SQL(_pg_type(field.type)))
            for field in table.schema
        )
        on_commit = sql.SQL(" ON COMMIT DROP") if self.in_transaction() else sql.SQL("")
        self._raw.execute(
            sql.SQL("CREATE TEMPORARY TABLE {} ({}){}").format(
                sql.Identifier(name), columns, on_commit
            )
        )
        if table.num_rows:
            copy_into(self._raw, name, table)
            # A new table has no statistics: the planner would guess it small and join it
            # row by row (a join of 60,000 rows took seconds instead of milliseconds).
            self._raw.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)))

    def unregister(self, name: str) -> None:
        self._raw.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))

    def cursor(self) -> PostgresConnection:
        return self

    def close(self) -> None:
        """Closed by the pool that lent it, when the `with` ends."""


def _changes_rows(status: str | None) -> bool:
    return bool(status) and status.split(" ", 1)[0] in {"INSERT", "UPDATE", "DELETE", "MERGE"}


def copy_into(raw: psycopg.Connection, table_name: str, table: pa.Table) -> None:
    """`COPY` an Arrow table's rows into `table_name`, columns matched by name.

    Columns of types whose CSV text PostgreSQL reads back exactly go as CSV that Arrow writes
    in one pass; any other table row by row.
    """
    names = table.schema.names
    columns = sql.SQL(", ").join(map(sql.Identifier, names))
    if all(_csv_exact(field.type) for field in table.schema):
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            sql.Identifier(table_name), columns
        )
        # Arrow quotes every string and writes a null as nothing: PostgreSQL's CSV reads
        # the unquoted empty field as NULL and "" as the empty string.
        # Arrow 26 writes a run of zero bytes for an empty chunk, so those are left out.
        batches = [batch for batch in table.to_batches() if batch.num_rows]
        buffer = pa.BufferOutputStream()
        pa_csv.write_csv(
            pa.Table.from_batches(batches, schema=table.schema),
            buffer,
            pa_csv.WriteOptions(include_header=False),
        )
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            copy.write(memoryview(buffer.getvalue()))
        return
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table_name), columns)
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        for batch in table.to_batches(max_chunksize=10_000):
            values = [column.to_pylist() for column in batch.columns]
            for row in zip(*values, strict=True):
                copy.write_row(row)


def _csv_exact(arrow: pa.DataType) -> bool:
    """Whether Arrow's CSV text of `arrow` reads back into its PostgreSQL column unchanged."""
    return (
        pa.types.is_string(arrow)
        or pa.types.is_large_string(arrow)
        or pa.types.is_decimal(arrow)
        or pa.types.is_integer(arrow)
        or pa.types.is_boolean(arrow)
        or pa.types.is_date(arrow)
        or (pa.types.is_timestamp(arrow) and arrow.unit != "ns")
    )


def _pg_type(arrow: pa.DataType) -> str:
    if pa.types.is_string(arrow) or pa.types.is_large_string(arrow):
        return "text"
    if pa.types.is_decimal(arrow):
        return f"numeric({arrow.precision},{arrow.scale})"
    if pa.types.is_int64(arrow) or pa.types.is_uint32(arrow):
        return "bigint"
    if pa.types.is_integer(arrow):
        return "integer"
    if pa.types.is_boolean(arrow):
        return "boolean"
    if pa.types.is_floating(arrow):
        return "double precision"
    if pa.types.is_date(arrow):
        return "date"
    if pa.types.is_timestamp(arrow):
        return "timestamptz" if arrow.tz else "timestamp"
    if pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        return "bytea"
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return _pg_type(arrow.value_type) + "[]"
    if pa.types.is_null(arrow):
        return "text"
    raise TypeError(f"no PostgreSQL column type for Arrow's {arrow}")


_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|%|\?|\$([A-Za-z_]\w*)|::")


@functools.lru_cache(maxsize=1024)
def _pyformat(statement: str, named: bool) -> str:
    """DuckDB's `?` and `$name` parameters as psycopg's `%s` and `%(name)s`; `%` doubled."""

    def swap(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "%":
            return "%%"
        if token == "?":
            return "%s"
        if match.group(1) is not None:
            return f"%({match.group(1)})s" if named else token
        if token[0] in "'\"":
            return token.replace("%", "%%")
        return token

    return _PLACEHOLDER.sub(swap, statement)


def _adapted(parameters: Sequence[Any] | Mapping[str, Any]) -> Any:
    if isinstance(parameters, Mapping):
        return {key: _adapt(value) for key, value in parameters.items()}
    return [_adapt(value) for value in parameters]


def _adapt(value: Any) -> Any:
    # DuckDB reads a tuple as a list; psycopg would send a composite record.
    if isinstance(value, tuple):
        return list(value)
    return value

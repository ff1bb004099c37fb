"""The registry (warehouse layer): Meta connections (sealed tokens) and the linked accounts the
syncs read; the error every registry change the current state refuses raises. Sites live in
`site_store`, the links between sites and accounts in `link_store`. Every sealed token at
once, read and stored back, is what a key rotation reseals.

Every function takes an open connection. Each mutating one runs in its own
transaction, or joins the caller's when one is already open on `con`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import duckdb

from rastro_assets.outcomes import RESTATED_INVALID, ConnectionStatus
from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import in_transaction, transaction

# Named here too (`registry.validate_identifier`, ...): callers check input through the registry.
from rastro_assets.warehouse.names import MAX_IDENTIFIER_CHARS as MAX_IDENTIFIER_CHARS
from rastro_assets.warehouse.names import MAX_NAME_CHARS as MAX_NAME_CHARS
from rastro_assets.warehouse.names import normalize_currency as normalize_currency
from rastro_assets.warehouse.names import validate_identifier as validate_identifier
from rastro_assets.warehouse.names import validate_site_name as validate_site_name
from rastro_assets.warehouse.names import validate_timezone as validate_timezone
from rastro_assets.warehouse.shard_store import SHARD, SHARD_JOIN

MARK_CONFLICT_ATTEMPTS = 5
REGISTRY_LOCK_KEY = 0x7261_7374_7267
"""The advisory lock PostgreSQL registry changes take turns on ("rastrg")."""
MARK_CONFLICT_PAUSE_SECONDS = 0.01


class RegistryError(Exception):
    """A registry change that the current state refuses (unknown site, taken account...)."""


@dataclass(frozen=True)
class Connection:
    connection_id: str
    status: ConnectionStatus
    sealed_token: bytes | None = field(repr=False)
    sealed_at: datetime | None
    invalid_since: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class LinkedAccount:
    ad_account_id: str
    connection_id: str
    timezone: str
    currency: str
    name: str | None
    created_at: datetime | None
    sync_requested_at: datetime | None
    sites: tuple[str, ...]
    connection_status: str | None
    connection_sealed_at: datetime | None
    shard: int = 0


def save_connection(
    con: duckdb.DuckDBPyConnection, connection_id: str, sealed_token: bytes, now: datetime
) -> None:
    """Store a (new) sealed token; the connection becomes active again.

    `sealed_at` is the token's version: accounts paused by a dead token resume
    because the planner reads the status, and a run still holding the old
    token can no longer mark this one invalid (see `mark_connection_invalid`).
    """
    with transaction(con):
        con.execute(
            """
            INSERT INTO meta_connections
                (connection_id, status, invalid_since, last_error, sealed_token, sealed_at,
                 created_at, updated_at)
            VALUES (?, ?, NULL, NULL, ?, ?, ?, ?)
            ON CONFLICT (connection_id) DO UPDATE SET
                status = excluded.status, invalid_since = NULL, last_error = NULL,
                sealed_token = excluded.sealed_token, sealed_at = excluded.sealed_at,
                updated_at = excluded.updated_at
            """,
            [connection_id, ConnectionStatus.ACTIVE, sealed_token, now, now, now],
        )


_CONNECTION_QUERY = """
    SELECT connection_id, status, sealed_token, sealed_at, invalid_since, last_error
    FROM meta_connections
"""


def get_connection(con: duckdb.DuckDBPyConnection, connection_id: str) -> Connection | None:
    row = con.execute(f"{_CONNECTION_QUERY} WHERE connection_id = ?", [connection_id]).fetchone()
    return _connection(row) if row else None


def _connection(row: tuple) -> Connection:
    return Connection(
        connection_id=row[0],
        status=ConnectionStatus(row[1]),
        sealed_token=bytes(row[2]) if row[2] is not None else None,
        sealed_at=row[3],
        invalid_since=row[4],
        last_error=row[5],
    )


def get_connections(
    con: duckdb.DuckDBPyConnection, connection_ids: Iterable[str]
) -> dict[str, Connection]:
    """The connections among `connection_ids` that exist, by id."""
    wanted = sorted(set(connection_ids))
    if not wanted:
        return {}
    rows = con.execute(
        f"{_CONNECTION_QUERY} WHERE connection_id = ANY(?::VARCHAR[])", [wanted]
    ).fetchall()
    return {row[0]: _connection(row) for row in rows}


def mark_connection_invalid(
    con: duckdb.DuckDBPyConnection,
    connection_id: str,
    message: str,
    now: datetime,
    *,
    token_sealed_at: datetime | None,
) -> bool:
    """Mark the connection's token dead, if it is still the token the caller used.

    A run that started with an older token must not condemn one connected
    since: only a stored `sealed_at` equal to `token_sealed_at` is marked. The
    first `invalid_since` is kept, and so is the stored error when `message`
    only restates it: a run refused before asking Meta, because the token was
    already marked, says "the connection's token is invalid: <stored error>",
    and writing that back would nest the error one level deeper each run.

    Syncs of several accounts of one connection run at once (a wave) and may
    all find the token dead together: their updates of this one row conflict
    in DuckDB, so a conflict is retried (only when this call owns its
    transaction). True when the row was marked.
    """
    if token_sealed_at is None:
        return False
    attempts = 1 if in_transaction(con) else MARK_CONFLICT_ATTEMPTS
    invalid = ConnectionStatus.INVALID
    for attempt in range(1, attempts + 1):
        try:
            with transaction(con):
                row = con.execute(
                    """
                    UPDATE meta_connections SET
                        status = ?, invalid_since = coalesce(invalid_since, ?),
                        last_error = CASE
                            WHEN status = ? AND last_error IS NOT NULL
                                 AND (strpos(?, last_error) > 0 OR strpos(?, ?) > 0)
                            THEN last_error ELSE ? END,
                        updated_at = ?
                    WHERE connection_id = ? AND sealed_at = ?
                    RETURNING connection_id
                    """,
                    [invalid, now, invalid, message, message, RESTATED_INVALID, message, now,
                     connection_id, token_sealed_at],
                ).fetchone()
            return row is not None
        except dialect.Conflict as exc:
            if not _is_write_conflict(exc) or attempt == attempts:
                raise
            time.sleep(MARK_CONFLICT_PAUSE_SECONDS * attempt)
    raise AssertionError("unreachable")


def take_registry_turn(con: duckdb.DuckDBPyConnection) -> None:
    """Wait until no other transaction changes links or sites, then hold that turn until
    this transaction ends (call it inside one).

    Linking decides from what it reads (whether any site links the account, through which
    connection, how many links the connection holds) and then writes. DuckDB refuses the
    second of two such transactions at its commit; PostgreSQL, reading committed rows only,
    would let both write, and a later link would overwrite the account's connection. So on
    PostgreSQL these changes run one at a time; they are rare, and a sync takes no turn.
    """
    if dialect.is_postgres(con):
        con.execute("SELECT pg_advisory_xact_lock(?)", [REGISTRY_LOCK_KEY])


def _is_write_conflict(exc: BaseException) -> bool:
    # DuckDB raises one TransactionException for conflicts and for misuse alike; only a
    # conflict is worth another try. PostgreSQL's errors in `Conflict` are all conflicts.
    return not isinstance(exc, duckdb.TransactionException) or "conflict" in str(exc).lower()


_LINKED_ACCOUNTS = f"""
    SELECT a.ad_account_id, a.connection_id, a.timezone, a.currency, a.name, a.created_at,
           a.sync_requested_at, array_agg(l.site_id ORDER BY l.site_id) AS sites,
           c.status, c.sealed_at, {SHARD} AS shard
    FROM meta_ad_accounts a
    JOIN site_ad_accounts l USING (ad_account_id)
    LEFT JOIN meta_connections c USING (connection_id)
    {SHARD_JOIN}
    WHERE CAST(? AS VARCHAR) IS NULL OR a.ad_account_id = ?
    GROUP BY a.ad_account_id, a.connection_id, a.timezone, a.currency, a.name, a.created_at,
             a.sync_requested_at, c.status, c.sealed_at, s.shard
    ORDER BY a.ad_account_id
"""


def linked_accounts(con: duckdb.DuckDBPyConnection) -> list[LinkedAccount]:
    """Every account at least one site links, sorted by id."""
    rows = con.execute(_LINKED_ACCOUNTS, [None, None]).fetchall()
    return [_linked_account(row) for row in rows]


def get_account(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> LinkedAccount | None:
    """The account if at least one site links it."""
    row = con.execute(_LINKED_ACCOUNTS, [ad_account_id, ad_account_id]).fetchone()
    return _linked_account(row) if row else None


def request_sync(con: duckdb.DuckDBPyConnection, ad_account_id: str, now: datetime) -> None:
    """Ask the planner to sync the account at its next look."""
    with transaction(con):
        if not sites_linking(con, ad_account_id):
            raise RegistryError(f"{ad_account_id} is not linked to any site")
        con.execute(
            "UPDATE meta_ad_accounts SET sync_requested_at = ? WHERE ad_account_id = ?",
            [now, ad_account_id],
        )


def sites_linking(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> list[str]:
    """The sites that link the account, sorted by id."""
    rows = con.execute(
        "SELECT site_id FROM site_ad_accounts WHERE ad_account_id = ? ORDER BY site_id",
        [ad_account_id],
    ).fetchall()
    return [row[0] for row in rows]


def _linked_account(row: tuple) -> LinkedAccount:
    return LinkedAccount(
        ad_account_id=row[0],
        connection_id=row[1],
        timezone=row[2],
        currency=row[3],
        name=row[4],
        created_at=row[5],
        sync_requested_at=row[6],
        sites=tuple(row[7]),
        connection_status=row[8],
        connection_sealed_at=row[9],
        shard=int(row[10]),
    )


def sealed_tokens(con: duckdb.DuckDBPyConnection) -> list[tuple[str, bytes]]:
    """(connection_id, sealed token) of every connection that holds a token, by id."""
    rows = con.execute(
        "SELECT connection_id, sealed_token FROM meta_connections"
        " WHERE sealed_token IS NOT NULL ORDER BY connection_id"
    ).fetchall()
    return [(connection_id, bytes(sealed)) for connection_id, sealed in rows]


def store_resealed_tokens(
    con: duckdb.DuckDBPyConnection, resealed: Sequence[tuple[str, bytes]], now: datetime
) -> None:
    """Replace each connection's sealed token by the one given (in the caller's transaction).

    `sealed_at` stays: it is the token's version, not the ciphertext's, and the token is
    the same, so runs holding it still count as current.
    """
    for connection_id, sealed in resealed:
        con.execute(
            "UPDATE meta_connections SET sealed_token = ?, updated_at = ?"
            " WHERE connection_id = ?",
            [sealed, now, connection_id],
        )

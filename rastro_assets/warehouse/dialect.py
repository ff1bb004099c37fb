"""What differs between the warehouse's two engines, asked of a connection.

A statement is written once where DuckDB and PostgreSQL agree; where they do not, the
caller picks its text here. The errors the writers tell apart (a write conflict, a broken
constraint, a missing table) are named once for both engines.
"""

from __future__ import annotations

import duckdb
import psycopg
from psycopg import errors as pg_errors

DUCKDB = "duckdb"
POSTGRES = "postgres"

Error = (duckdb.Error, psycopg.Error)
"""Any error a warehouse statement raises, on either engine."""
Conflict = (
    duckdb.TransactionException,
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    pg_errors.LockNotAvailable,
)
"""Another transaction wrote the same rows first: retry, or give the account up."""
ConstraintViolated = (duckdb.ConstraintException, psycopg.IntegrityError)
MissingTable = (duckdb.CatalogException, pg_errors.UndefinedTable)
InvalidInput = (duckdb.InvalidInputException, psycopg.DataError)
TransactionEnded = (duckdb.TransactionException, pg_errors.NoActiveSqlTransaction)
"""ROLLBACK after a failed COMMIT: the transaction is already over."""
TransactionAborted = (duckdb.TransactionException, pg_errors.InFailedSqlTransaction)
"""A statement after a failed one in the same transaction: only its ROLLBACK is left."""


def engine_of(con: object) -> str:
    return getattr(con, "engine", DUCKDB)


def is_postgres(con: object) -> bool:
    return engine_of(con) == POSTGRES


def pick(con: object, *, duckdb: str, postgres: str) -> str:
    """The statement text for `con`'s engine."""
    return postgres if is_postgres(con) else duckdb

"""Errors (warehouse layer): the writers' refusals, and the checks every writer shares.

A refused write wrote nothing. `AccountNotLinked` is any writer's: the unlink
purge may have run meanwhile, and a late write would leave orphans nobody
ever deletes. `AccountTakenOver` is a spend write of a run that no longer
holds its account. `SpendInputError` is the spend read's own fault.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa


class AccountNotLinked(Exception):
    """No site links the account (any more): nothing was written."""


class SpendInputError(ValueError):
    """The read itself is inconsistent or not representable: nothing was written."""


class AccountTakenOver(Exception):
    """A sync of the account started after this write's run: this run's write is refused.

    One writer per account, as the lease promises: a run whose lease ran
    out and was taken again, or a hand-launched run beside a wave, must never
    interleave its rows with the run that holds the account now.
    """


WriteRefusal = SpendInputError | AccountNotLinked | AccountTakenOver
"""Why a spend write of one account was refused (and wrote nothing)."""


def not_linked(ad_account_id: str) -> AccountNotLinked:
    return AccountNotLinked(
        f"{ad_account_id} is not linked to any site (any more): nothing written"
    )


def require_link(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> None:
    """Raise `AccountNotLinked` unless a site links the account."""
    linked = con.execute(
        "SELECT 1 FROM site_ad_accounts WHERE ad_account_id = ? LIMIT 1", [ad_account_id]
    ).fetchone()
    if linked is None:
        raise not_linked(ad_account_id)


def read_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` narrowed to `schema`'s columns, which it must have with their types.

    Raises:
        SpendInputError: a column is missing or has another type.
    """
    columns = []
    for name, type_ in zip(schema.names, schema.types, strict=True):
        if name not in table.column_names:
            raise SpendInputError(f"the read has no {name!r} column")
        column = table[name]
        if column.type != type_:
            raise SpendInputError(f"the read's {name!r} column is {column.type}, not {type_}")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)

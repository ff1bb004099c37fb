"""Every connection's sealed token at once, for re-sealing them all under a new key."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rastro_assets.warehouse.connection import Connection


def sealed_tokens(con: Connection) -> list[tuple[str, bytes]]:
    """(connection_id, sealed token) of every connection that holds a token, by id."""
    rows = con.execute(
        "SELECT connection_id, sealed_token FROM meta_connections"
        " WHERE sealed_token IS NOT NULL ORDER BY connection_id"
    ).fetchall()
    return [(connection_id, bytes(sealed)) for connection_id, sealed in rows]


def store_resealed_tokens(
    con: Connection, resealed: Sequence[tuple[str, bytes]], now: datetime
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

"""Every sealed token read at once and stored back re-sealed, as `rastro rotate-key` does."""

from __future__ import annotations

from datetime import timedelta

from rastro_assets.warehouse import registry
from rastro_assets.warehouse.registry import sealed_tokens, store_resealed_tokens
from rastro_assets_tests.conftest import NOW


def test_sealed_tokens_are_read_by_connection_and_stored_back(con):
    registry.save_connection(con, "c2", b"two", NOW)
    registry.save_connection(con, "c1", b"one", NOW)
    assert sealed_tokens(con) == [("c1", b"one"), ("c2", b"two")]

    later = NOW + timedelta(hours=1)
    store_resealed_tokens(con, [("c2", b"TWO")], later)

    assert sealed_tokens(con) == [("c1", b"one"), ("c2", b"TWO")]
    resealed = registry.get_connection(con, "c2")
    assert resealed.sealed_at == NOW  # the token's version: the same token
    updated = con.execute(
        "SELECT connection_id, updated_at FROM meta_connections ORDER BY connection_id"
    ).fetchall()
    assert updated == [("c1", NOW), ("c2", later)]

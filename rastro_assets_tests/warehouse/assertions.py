"""Invariants checked after every write, shared by the warehouse tests."""

from __future__ import annotations

import duckdb

_EXPECTED = """
    SELECT l.site_id, a.ad_account_id, a.day, sum(a.spend), sum(a.impressions),
           sum(a.clicks), sum(a.conversations), count(*)
    FROM ad_spend_daily a
    JOIN site_ad_accounts l USING (ad_account_id)
    GROUP BY l.site_id, a.ad_account_id, a.day
"""
_STORED = """
    SELECT site_id, ad_account_id, day, spend, impressions, clicks, conversations, ad_rows
    FROM site_spend_daily
"""


def assert_site_spend_exact(con: duckdb.DuckDBPyConnection) -> None:
    """`site_spend_daily` is exactly the sums of `ad_spend_daily` over every site's links.

    Whole tables, every account: a missing row, an extra row (a site-day
    without ad rows, a site no longer linked) or a sum off by 0.0001 fails.
    """
    expected = {row[:3]: row[3:] for row in con.execute(_EXPECTED).fetchall()}
    stored = {row[:3]: row[3:] for row in con.execute(_STORED).fetchall()}
    missing = sorted(expected.keys() - stored.keys())
    extra = sorted(stored.keys() - expected.keys())
    wrong = sorted(key for key in expected.keys() & stored.keys() if expected[key] != stored[key])
    assert not missing, f"site-days without a site_spend_daily row: {missing}"
    assert not extra, f"site_spend_daily rows with no ad rows behind them: {extra}"
    assert not wrong, "site_spend_daily differs from the sums: " + ", ".join(
        f"{key}: stored {stored[key]}, expected {expected[key]}" for key in wrong
    )


def spend_rows(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """`ad_spend_daily` without `synced_at`, in key order."""
    return con.execute(
        """
        SELECT ad_account_id, ad_id, day, spend, impressions, clicks, conversations
        FROM ad_spend_daily ORDER BY ad_account_id, ad_id, day
        """
    ).fetchall()


def synced_at(con: duckdb.DuckDBPyConnection) -> dict[tuple, object]:
    """`synced_at` of every ad-day, by (ad_account_id, ad_id, day)."""
    rows = con.execute("SELECT ad_account_id, ad_id, day, synced_at FROM ad_spend_daily")
    return {row[:3]: row[3] for row in rows.fetchall()}


def site_rows(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """`site_spend_daily`, in key order."""
    return con.execute(
        "SELECT * FROM site_spend_daily ORDER BY site_id, ad_account_id, day"
    ).fetchall()

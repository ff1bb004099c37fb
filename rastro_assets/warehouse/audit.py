"""Invariants an operator (or an asset check) can verify at any time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

import duckdb

_EXPECTED = """
    SELECT l.site_id, a.ad_account_id, a.day,
           SUM(a.spend) AS spend, SUM(a.impressions) AS impressions,
           SUM(a.clicks) AS clicks, SUM(a.conversations) AS conversations
    FROM ad_spend_daily a
    JOIN site_ad_accounts l USING (ad_account_id)
    WHERE a.ad_account_id = $account AND a.day = ANY($days::DATE[])
    GROUP BY l.site_id, a.ad_account_id, a.day
"""
_STORED = """
    SELECT site_id, ad_account_id, day, spend, impressions, clicks, conversations
    FROM site_spend_daily
    WHERE ad_account_id = $account AND day = ANY($days::DATE[])
"""


def site_spend_mismatches(
    con: duckdb.DuckDBPyConnection, ad_account_id: str, days: Sequence[date]
) -> list[tuple]:
    """Site-days whose stored aggregate differs from the sums of the ad rows.

    Each mismatch is (site_id, ad_account_id, day, expected row or None,
    stored row or None). Empty means `site_spend_daily` is exact.
    """
    params = {"account": ad_account_id, "days": list(days)}
    expected = {row[:3]: row[3:] for row in con.execute(_EXPECTED, params).fetchall()}
    stored = {row[:3]: row[3:] for row in con.execute(_STORED, params).fetchall()}
    return [
        (*key, expected.get(key), stored.get(key))
        for key in sorted(expected.keys() | stored.keys())
        if expected.get(key) != stored.get(key)
    ]

"""Compare the warehouse with the fake Graph's truth, row for row."""

from __future__ import annotations

from datetime import date

from rastro_assets.timekeeping import days_between


def stored_rows(con, ad_account_id: str, since: date, until: date) -> set[tuple]:
    return set(
        con.execute(
            """
            SELECT ad_id, day, spend, impressions, clicks, conversations FROM ad_spend_daily
            WHERE ad_account_id = ? AND day BETWEEN ? AND ?
            """,
            [ad_account_id, since, until],
        ).fetchall()
    )


def truth_rows(world, ad_account_id: str, since: date, until: date) -> set[tuple]:
    return {
        (row.ad_id, row.day, row.spend, row.impressions, row.clicks, row.conversations)
        for day in days_between(since, until)
        for row in world.truth(ad_account_id, day)
    }


def assert_equals_truth(con, world, ad_account_id: str, since: date, until: date) -> None:
    stored = stored_rows(con, ad_account_id, since, until)
    truth = truth_rows(world, ad_account_id, since, until)
    assert stored == truth, {
        "missing": sorted(truth - stored)[:5],
        "extra": sorted(stored - truth)[:5],
    }

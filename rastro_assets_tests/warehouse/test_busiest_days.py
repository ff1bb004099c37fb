"""An account's busiest day of ad rows, counted from a first day on, for the accounts named."""

from __future__ import annotations

from datetime import date

from rastro_assets.warehouse.figures import most_ad_rows_in_a_day
from rastro_assets_tests.conftest import NOW


def test_the_busiest_day_counts_only_the_days_and_accounts_asked(con):
    rows = [
        ("act_1", "a1", "2026-11-01"), ("act_1", "a2", "2026-11-01"), ("act_1", "a3", "2026-11-01"),
        ("act_1", "a1", "2026-11-20"), ("act_1", "a2", "2026-11-20"),
        ("act_2", "b1", "2026-11-20"),
        ("act_3", "c1", "2026-11-20"), ("act_3", "c2", "2026-11-20"),
    ]
    for account, ad, day in rows:
        con.execute(
            "INSERT INTO ad_spend_daily (ad_account_id, ad_id, day, spend, impressions, clicks,"
            " conversations, synced_at) VALUES (?, ?, ?::DATE, 1, 1, 0, 0, ?)",
            [account, ad, day, NOW],
        )
    assert most_ad_rows_in_a_day(con, ["act_1", "act_2", "act_9"], date(2026, 11, 1)) == {
        "act_1": 3, "act_2": 1,
    }
    assert most_ad_rows_in_a_day(con, ["act_1"], date(2026, 11, 2)) == {"act_1": 2}
    assert most_ad_rows_in_a_day(con, [], date(2026, 11, 1)) == {}

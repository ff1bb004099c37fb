"""A spend table's own figures, over every account or one shard's; an account's busiest day of
ad rows, counted from a first day on, for the accounts named."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from rastro_assets.warehouse import link_store, shard_store
from rastro_assets.warehouse.figures import most_ad_rows_in_a_day, spend_table_figures
from rastro_assets_tests.conftest import NOW


def test_figures_cover_the_table_or_one_shards_accounts(con, linked_account):
    link_store.link_account(con, "s1", "act_2", "c1", "Asia/Tokyo", "JPY", NOW)
    shard_store.set_account_shard(con, "act_2", 1)
    con.execute(
        "INSERT INTO ad_spend_daily (ad_account_id, ad_id, day, spend, impressions, clicks,"
        " conversations, synced_at) VALUES"
        " ('act_1', 'a1', DATE '2026-11-29', 1.5, 1, 0, 0, $now),"
        " ('act_1', 'a2', DATE '2026-11-30', 2.25, 1, 0, 0, $now),"
        " ('act_2', 'b1', DATE '2026-11-30', 300, 1, 0, 0, $now)",
        {"now": NOW},
    )
    every = spend_table_figures(con, "ad_spend_daily")
    assert (every.rows, every.accounts, every.days) == (3, 2, 2)
    assert every.spend_by_currency == {"BRL": Decimal("3.75"), "JPY": Decimal("300")}
    assert (every.first_day, every.last_day) == (date(2026, 11, 29), date(2026, 11, 30))
    shard_0 = spend_table_figures(con, "ad_spend_daily", shard=0)
    assert (shard_0.rows, shard_0.accounts, shard_0.spend_by_currency) == (
        2, 1, {"BRL": Decimal("3.75")}
    )
    assert spend_table_figures(con, "site_spend_daily").rows == 0


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

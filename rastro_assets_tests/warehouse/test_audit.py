"""The operator's audit: each site-day's stored sums against the sums of its ad rows."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from rastro_assets.warehouse import link_store, site_store
from rastro_assets.warehouse.audit import site_spend_mismatches
from rastro_assets_tests.conftest import NOW

DAY = date(2026, 11, 29)
OTHER_DAY = date(2026, 11, 28)


def test_a_site_day_off_by_a_cent_or_missing_is_named_and_exact_ones_are_not(con, linked_account):
    site_store.add_site(con, "s2", "Site two", NOW)
    link_store.link_account(con, "s2", linked_account, "c1", "America/Sao_Paulo", "BRL", NOW)
    for ad, spend, clicks in (("ad_1", "10.0100", 3), ("ad_2", "0.9900", 1)):
        con.execute(
            "INSERT INTO ad_spend_daily VALUES (?, ?, ?, ?, 100, ?, 0, ?)",
            [linked_account, ad, DAY, Decimal(spend), clicks, NOW],
        )
    con.execute(
        "INSERT INTO site_spend_daily VALUES"
        " ('s1', ?, ?, 11.0000, 200, 4, 0, 2), ('s2', ?, ?, 11.0100, 200, 4, 0, 2)",
        [linked_account, DAY, linked_account, DAY],
    )
    assert site_spend_mismatches(con, linked_account, [OTHER_DAY]) == []
    [(site, account, day, expected, stored)] = site_spend_mismatches(
        con, linked_account, [DAY, OTHER_DAY]
    )
    assert (site, account, day) == ("s2", linked_account, DAY)
    assert expected == (Decimal("11.0000"), 200, 4, 0)
    assert stored == (Decimal("11.0100"), 200, 4, 0)

    con.execute("DELETE FROM site_spend_daily WHERE site_id = 's2'")
    [(site, _, _, expected, stored)] = site_spend_mismatches(con, linked_account, [DAY])
    assert (site, stored) == ("s2", None)

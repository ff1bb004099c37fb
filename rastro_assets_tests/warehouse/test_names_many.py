"""The names writer given many accounts' spend reads at once: one merge, an answer per read."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from rastro_assets.meta.models import InsightRow, insight_table
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.catalog import CatalogWriteResult, upsert_spend_names
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.errors import AccountNotLinked

AT = datetime(2026, 12, 1, tzinfo=UTC)
DAY = date(2026, 11, 30)


def read(*ads: tuple, day: date = DAY) -> pa.Table:
    """A spend read naming each ad: (ad_id, ad_name[, adset_name[, campaign_name]])."""
    rows = []
    for ad_id, *names in ads:
        ad_name, adset, campaign = [*names, None, None, None][:3]
        rows.append(InsightRow(ad_id, day, Decimal("1"), 1, 0, 0, ad_name, None, adset, None,
                               campaign))
    return insight_table(rows)


def catalog(con) -> list[tuple]:
    return con.execute(
        "SELECT ad_id, ad_account_id, ad_name, adset_name, campaign_name, updated_at"
        " FROM ad_catalog ORDER BY ad_id"
    ).fetchall()


@pytest.fixture
def accounts(con):
    """act_1 and act_2 linked to s1; act_3 linked to nothing; ad 9 is act_8's."""
    site_store.add_site(con, "s1", None, AT)
    registry.save_connection(con, "c1", b"\0" * 40, AT)
    for account in ("act_1", "act_2"):
        link_store.link_account(con, "s1", account, "c1", "UTC", "USD", AT)
    con.execute("INSERT INTO ad_catalog (ad_id, ad_account_id, ad_name) VALUES ('9', 'act_8', 'x')")


def test_each_read_gets_its_answer_and_a_refused_one_blocks_no_other(con, accounts):
    answers = upsert_spend_names(con, [
        ("act_1", read(("1", "one"), ("2", "two"), ("9", "taken"))),
        ("act_3", read(("3", "unlinked"))),
        ("act_2", read(("4", "four", "set", "camp"))),
        ("act_2x", read()),  # nothing read: nothing to answer but an empty result
    ], AT)
    assert answers[0] == CatalogWriteResult(ads=3, added=2, skipped=1)
    assert isinstance(answers[1], AccountNotLinked) and "act_3" in str(answers[1])
    assert answers[2] == CatalogWriteResult(ads=1, added=1)
    assert answers[3] == CatalogWriteResult()
    assert [row[:5] for row in catalog(con)] == [
        ("1", "act_1", "one", None, None),
        ("2", "act_1", "two", None, None),
        ("4", "act_2", "four", "set", "camp"),
        ("9", "act_8", "x", None, None),
    ]


def test_only_new_and_renamed_ads_are_written(con, accounts):
    upsert_spend_names(con, [("act_1", read(("1", "one"), ("2", "two")))], AT)
    later = AT + timedelta(hours=1)
    assert upsert_spend_names(con, [("act_1", read(("1", "one"), ("2", None)))], later) == [
        CatalogWriteResult(ads=2)
    ]
    assert {row[5] for row in catalog(con)} == {AT, None}  # nothing written: ad 9 has no stamp
    [answer] = upsert_spend_names(con, [("act_1", read(("1", "uno"), ("2", "two")))], later)
    assert answer == CatalogWriteResult(ads=2, renamed=1)
    stamps = {row[0]: row[5] for row in catalog(con)}
    assert (stamps["1"], stamps["2"]) == (later, AT)


def test_an_ad_nobody_owns_is_taken_by_the_read(con, accounts):
    con.execute("INSERT INTO ad_catalog (ad_id, ad_name) VALUES ('5', 'five')")
    [answer] = upsert_spend_names(con, [("act_2", read(("5", "five")))], AT)
    assert answer == CatalogWriteResult(ads=1)
    assert catalog(con)[0][:3] == ("5", "act_2", "five")


def test_one_ad_in_two_reads_is_written_read_by_read(con, accounts):
    answers = upsert_spend_names(con, [
        ("act_1", read(("1", "first"))),
        ("act_2", read(("1", "second"), ("2", "two"))),
    ], AT)
    assert answers == [
        CatalogWriteResult(ads=1, added=1),
        CatalogWriteResult(ads=2, added=1, skipped=1),
    ]
    assert [row[:3] for row in catalog(con)][:2] == [("1", "act_1", "first"), ("2", "act_2", "two")]


def test_each_ad_takes_its_latest_name_per_read(con, accounts):
    rows = pa.concat_tables([
        read(("1", "old", "set"), day=DAY - timedelta(days=1)),
        read(("1", "new"), day=DAY),
    ])
    upsert_spend_names(con, [("act_1", rows), ("act_2", read(("2", "two")))], AT)
    assert catalog(con)[0][:4] == ("1", "act_1", "new", "set")


def test_the_writer_joins_an_outer_transaction(con, accounts):
    with pytest.raises(RuntimeError), transaction(con):
        upsert_spend_names(con, [("act_1", read(("1", "one"))), ("act_2", read(("2", "t")))], AT)
        raise RuntimeError("the sync failed afterwards")
    assert [row[0] for row in catalog(con)] == ["9"]

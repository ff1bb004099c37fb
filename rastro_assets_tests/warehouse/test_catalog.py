"""The catalog and thumbnail writers and queries, on a real DuckDB file."""

from __future__ import annotations

import hashlib
from datetime import date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from rastro_assets.meta.models import Ad, InsightRow, insight_table
from rastro_assets.warehouse import link_store, site_store
from rastro_assets.warehouse.catalog import (
    CatalogWriteResult,
    catalog_size,
    missing_ad_names,
    upsert_catalog,
    upsert_names_from_spend,
)
from rastro_assets.warehouse.errors import AccountNotLinked, SpendInputError
from rastro_assets.warehouse.thumbnails import (
    FetchedThumbnail,
    drop_orphaned_thumbnails,
    latest_thumbnails,
    store_thumbnails,
    wanted_thumbnails,
)

DAY = date(2026, 11, 30)
PNG = b"\x89PNG\r\n\x1a\n" + b"pixels"


def ad(ad_id: str, **fields) -> Ad:
    values = {
        "name": f"ad {ad_id}",
        "adset_id": "as1",
        "adset_name": "set one",
        "campaign_id": "cp1",
        "campaign_name": "campaign one",
        "effective_status": "ACTIVE",
        "creative_type": "image",
        "creative_id": f"{ad_id}01",
        "thumbnail_url": f"https://cdn.test/{ad_id}.png?sig=s3cr3t&exp=1",
    }
    values.update(fields)
    return Ad(ad_id=ad_id, **values)


def row(ad_id: str, day: date = DAY, **names) -> InsightRow:
    return InsightRow(ad_id=ad_id, day=day, spend=Decimal("1.00"), impressions=10, clicks=1,
                      conversations=0, **names)


def read(*rows: InsightRow) -> pa.Table:
    """A spend read of `rows`, as the names writer takes it."""
    return insight_table(list(rows))


def catalog(con, ad_id: str) -> dict:
    cursor = con.execute("SELECT * FROM ad_catalog WHERE ad_id = ?", [ad_id])
    values = cursor.fetchone()
    if values is None:
        return {}
    return dict(zip([column[0] for column in cursor.description], values, strict=True))


@pytest.fixture
def two_accounts(con, now, linked_account):
    """act_1 (from `linked_account`) and act_2, both linked to site s1."""
    link_store.link_account(con, "s1", "act_2", "c1", "UTC", "USD", now)
    return "act_1", "act_2"


# -- the catalog -----------------------------------------------------------------------


def test_upsert_inserts_every_field_and_counts(con, now, linked_account):
    result = upsert_catalog(con, "act_1", [ad("1"), ad("2", effective_status="DELETED")], now,
                            refile=True)
    assert (result.ads, result.added, result.renamed, result.status_changed) == (2, 2, 0, 0)
    stored = catalog(con, "2")
    assert stored["ad_account_id"] == "act_1"
    assert (stored["ad_name"], stored["adset_name"], stored["campaign_name"]) == (
        "ad 2", "set one", "campaign one")
    assert (stored["ad_status"], stored["creative_type"], stored["creative_id"]) == (
        "DELETED", "image", "201")
    assert stored["updated_at"] == now
    assert catalog_size(con, "act_1") == 2


def test_a_field_meta_leaves_out_keeps_its_value(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1")], now, refile=True)
    later = now + timedelta(days=1)
    sparse = Ad(ad_id="1", name=None, adset_id=None, adset_name=None, campaign_id=None,
                campaign_name="renamed campaign", effective_status="PAUSED")
    result = upsert_catalog(con, "act_1", [sparse], later, refile=True)
    assert (result.added, result.renamed, result.status_changed) == (0, 0, 1)
    stored = catalog(con, "1")
    assert (stored["ad_name"], stored["adset_id"], stored["adset_name"]) == (
        "ad 1", "as1", "set one")
    assert (stored["campaign_name"], stored["ad_status"]) == ("renamed campaign", "PAUSED")
    assert (stored["creative_id"], stored["creative_type"]) == ("101", "image")
    assert stored["thumbnail_url"].startswith("https://cdn.test/1.png")
    assert stored["updated_at"] == later


def test_renames_and_status_changes_are_counted(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1"), ad("2"), ad("3")], now, refile=True)
    result = upsert_catalog(
        con, "act_1",
        [ad("1", name="new name"), ad("2", effective_status="ARCHIVED"), ad("3"), ad("4")],
        now, refile=True,
    )
    assert (result.ads, result.added, result.renamed, result.status_changed) == (4, 1, 1, 1)


def test_a_new_creative_brings_its_own_url_or_none(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1"), ad("2")], now, refile=True)
    upsert_catalog(
        con, "act_1",
        [ad("1", creative_id="102", thumbnail_url=None),  # new creative, no picture
         ad("2", thumbnail_url=None)],  # same creative, URL left out: kept
        now, refile=True,
    )
    assert catalog(con, "1")["thumbnail_url"] is None
    assert catalog(con, "2")["thumbnail_url"].startswith("https://cdn.test/2.png")


def test_only_the_accounts_own_listing_refiles_an_ad(con, now, two_accounts):
    upsert_catalog(con, "act_2", [ad("1", name="from act_2")], now, refile=True)
    skipped = upsert_catalog(con, "act_1", [ad("1", name="by id")], now, refile=False)
    assert (skipped.skipped, skipped.added) == (1, 0)
    assert catalog(con, "1")["ad_account_id"] == "act_2"
    assert catalog(con, "1")["ad_name"] == "from act_2"
    upsert_catalog(con, "act_1", [ad("1", name="listed")], now, refile=True)
    assert (catalog(con, "1")["ad_account_id"], catalog(con, "1")["ad_name"]) == (
        "act_1", "listed")


def test_a_batch_repeating_an_ad_keeps_the_last(con, now, linked_account):
    result = upsert_catalog(con, "act_1", [ad("1", name="first"), ad("1", name="second")], now,
                            refile=True)
    assert result.ads == 1
    assert catalog(con, "1")["ad_name"] == "second"


def test_nothing_is_written_for_an_unlinked_account(con, now, linked_account):
    with pytest.raises(AccountNotLinked):
        upsert_catalog(con, "act_9", [ad("1")], now, refile=True)
    with pytest.raises(AccountNotLinked):
        upsert_names_from_spend(con, "act_9", read(row("1", ad_name="x")), now)
    assert con.execute("SELECT count(*) FROM ad_catalog").fetchone() == (0,)


# -- names from spend ---------------------------------------------------------------------


def test_names_from_spend_take_each_latest_name(con, now, linked_account):
    rows = [
        row("1", DAY, ad_name="new", adset_id="as1", adset_name=None, campaign_id="cp1",
            campaign_name="camp"),
        row("1", DAY - timedelta(days=1), ad_name="old", adset_name="set"),
        row("2", DAY, ad_name=None),
    ]
    result = upsert_names_from_spend(con, "act_1", read(*rows), now)
    assert (result.ads, result.added) == (2, 2)
    one = catalog(con, "1")
    assert (one["ad_name"], one["adset_id"], one["adset_name"], one["campaign_name"]) == (
        "new", "as1", "set", "camp")
    assert one["ad_account_id"] == "act_1"
    assert (one["ad_status"], one["creative_type"]) == (None, None)
    assert catalog(con, "2")["ad_name"] is None


def test_names_from_spend_keep_what_the_catalog_knows(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1")], now, refile=True)
    upsert_names_from_spend(con, "act_1", read(row("1", ad_name="renamed")), now)
    stored = catalog(con, "1")
    assert (stored["ad_name"], stored["adset_name"], stored["ad_status"]) == (
        "renamed", "set one", "ACTIVE")
    assert stored["thumbnail_url"] is not None


def test_names_from_spend_never_refile_an_ad(con, now, two_accounts):
    upsert_catalog(con, "act_2", [ad("1")], now, refile=True)
    result = upsert_names_from_spend(con, "act_1", read(row("1", ad_name="elsewhere")), now)
    assert result.skipped == 1
    assert (catalog(con, "1")["ad_account_id"], catalog(con, "1")["ad_name"]) == ("act_2", "ad 1")


def test_names_from_spend_take_a_table_with_the_name_columns(con, now, linked_account):
    rows = [row("1", DAY, ad_name="new", campaign_name="camp"),
            row("1", DAY - timedelta(days=1), ad_name="old", adset_name="set"),
            row("2", DAY, ad_name=None)]
    assert upsert_names_from_spend(con, "act_1", read(), now) == CatalogWriteResult()
    assert upsert_names_from_spend(con, "act_9", read(), now) == CatalogWriteResult()
    with pytest.raises(SpendInputError, match="the read has no 'campaign_name' column"):
        upsert_names_from_spend(
            con, "act_1", insight_table(rows).drop_columns(["campaign_name"]), now
        )


# -- ads with leads and no name --------------------------------------------------------------


def leads(con, site: str, ad_id: str, day: date, count: int = 1) -> None:
    con.execute("INSERT INTO lead_daily_rollups VALUES (?, ?, ?, ?)", [site, ad_id, day, count])


def test_missing_names_are_recent_unnamed_and_ours(con, now, two_accounts):
    site_store.add_site(con, "s9", None, now)
    since = DAY - timedelta(days=6)
    leads(con, "s1", "10", DAY, 3)  # never seen: asked
    leads(con, "s1", "11", since)  # filed under act_1 without a name: asked
    leads(con, "s1", "12", DAY)  # named already
    leads(con, "s1", "13", DAY)  # act_2's ad
    leads(con, "s1", "14", since - timedelta(days=1))  # too old
    leads(con, "s9", "15", DAY)  # a site not linking act_1
    leads(con, "s1", "16", DAY, 0)  # no leads
    upsert_names_from_spend(con, "act_1", read(row("11", campaign_name="c")), now)
    upsert_catalog(con, "act_1", [ad("12")], now, refile=True)
    upsert_names_from_spend(con, "act_2", read(row("13", campaign_name="c")), now)
    assert missing_ad_names(con, "act_1", since, limit=50) == ["10", "11"]
    assert missing_ad_names(con, "act_2", since, limit=50) == ["10", "13"]


def test_missing_names_are_capped_most_leads_first(con, now, linked_account):
    for n in range(60):
        leads(con, "s1", str(1000 + n), DAY, n + 1)
    found = missing_ad_names(con, "act_1", DAY, limit=50)
    assert len(found) == 50
    assert found[0] == "1059" and "1000" not in found


# -- thumbnails --------------------------------------------------------------------------


def fetched(ad_id: str, creative_id: str, image: bytes = PNG) -> FetchedThumbnail:
    return FetchedThumbnail(ad_id, creative_id, "image/png", image)


def test_thumbnails_wanted_missing_then_stale(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1"), ad("2"), ad("3", thumbnail_url=None)], now,
                   refile=True)
    assert [w.ad_id for w in wanted_thumbnails(con, "act_1", limit=10)] == ["1", "2"]
    assert [w.ad_id for w in wanted_thumbnails(con, "act_1", limit=10, only=["2"])] == ["2"]
    assert len(wanted_thumbnails(con, "act_1", limit=1)) == 1
    assert store_thumbnails(con, "act_1", [fetched("1", "101"), fetched("2", "201")], now) == 2
    assert wanted_thumbnails(con, "act_1", limit=10) == []
    upsert_catalog(con, "act_1", [ad("2", creative_id="202")], now, refile=True)
    [stale] = wanted_thumbnails(con, "act_1", limit=10)
    assert (stale.ad_id, stale.creative_id) == ("2", "202")
    assert "sig=" not in repr(stale)


def test_stored_bytes_are_exact_with_their_sha256(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1")], now, refile=True)
    image = PNG + bytes(range(256))
    store_thumbnails(con, "act_1", [fetched("1", "101", image)], now)
    assert con.execute(
        "SELECT content_type, image, sha256, creative_id, fetched_at FROM ad_thumbnails"
    ).fetchone() == ("image/png", image, hashlib.sha256(image).hexdigest(), "101", now)
    later = now + timedelta(hours=1)
    store_thumbnails(con, "act_1", [fetched("1", "102", PNG)], later)
    assert con.execute("SELECT image, creative_id, fetched_at FROM ad_thumbnails").fetchall() == [
        (PNG, "102", later)
    ]


def test_no_picture_for_an_ad_outside_the_accounts_catalog(con, now, two_accounts):
    upsert_catalog(con, "act_2", [ad("2")], now, refile=True)
    assert store_thumbnails(con, "act_1", [fetched("2", "201"), fetched("9", "901")], now) == 0
    assert con.execute("SELECT count(*) FROM ad_thumbnails").fetchone() == (0,)


def test_a_replaced_creative_without_picture_drops_the_old_one(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1"), ad("2")], now, refile=True)
    store_thumbnails(con, "act_1", [fetched("1", "101"), fetched("2", "201")], now)
    upsert_catalog(con, "act_1", [ad("1", creative_id="102", thumbnail_url=None)], now,
                   refile=True)
    assert drop_orphaned_thumbnails(con, "act_1") == 1
    assert con.execute("SELECT ad_id FROM ad_thumbnails").fetchall() == [("2",)]


def test_latest_thumbnails_for_a_preview(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad(str(n)) for n in range(1, 7)], now, refile=True)
    store_thumbnails(con, "act_1", [fetched(str(n), f"{n}01") for n in range(1, 4)], now)
    store_thumbnails(con, "act_1", [fetched("4", "401", PNG * 1000)], now + timedelta(hours=1))
    store_thumbnails(con, "act_1", [fetched("5", "501")], now + timedelta(hours=2))
    found = latest_thumbnails(con, "act_1", limit=3, content_types=["image/png"], max_bytes=1000)
    assert [f.ad_id for f in found] == ["5", "1", "2"]
    assert found[0].image == PNG and found[0].ad_name == "ad 5"


def test_unlinking_purges_the_catalog_and_its_thumbnails(con, now, two_accounts):
    upsert_catalog(con, "act_1", [ad("1")], now, refile=True)
    upsert_catalog(con, "act_2", [ad("2")], now, refile=True)
    store_thumbnails(con, "act_1", [fetched("1", "101")], now)
    store_thumbnails(con, "act_2", [fetched("2", "201")], now)
    link_store.unlink_account(con, "s1", "act_1")
    assert con.execute("SELECT ad_id FROM ad_catalog").fetchall() == [("2",)]
    assert con.execute("SELECT ad_id FROM ad_thumbnails").fetchall() == [("2",)]


def test_analyst_queries_read_the_contract_columns(con, now, linked_account):
    upsert_catalog(con, "act_1", [ad("1")], now, refile=True)
    store_thumbnails(con, "act_1", [fetched("1", "101")], now)
    assert con.execute(
        """
        SELECT c.ad_name, c.campaign_name, c.ad_status, c.creative_type, t.content_type,
               t.sha256, octet_length(t.image) > 0, t.fetched_at IS NOT NULL
        FROM ad_catalog c JOIN ad_thumbnails t USING (ad_id)
        """
    ).fetchall() == [("ad 1", "campaign one", "ACTIVE", "image", "image/png",
                      hashlib.sha256(PNG).hexdigest(), True, True)]


def test_now_must_be_aware(con, linked_account):
    with pytest.raises(ValueError, match="aware"):
        upsert_catalog(con, "act_1", [ad("1")], datetime(2026, 1, 1), refile=True)


def test_upsert_catalog_documents_itself():
    assert upsert_catalog.__doc__.startswith("Merge a batch of Meta's ads")

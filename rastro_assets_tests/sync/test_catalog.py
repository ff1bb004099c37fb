"""The catalog and thumbnail syncs against the fake Graph, and inside the spend sync."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import date, timedelta

import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.models import Ad, CallStats, Thumbnail
from rastro_assets.sync import catalog as catalog_sync
from rastro_assets.sync.catalog import CatalogSyncer
from rastro_assets.sync.types import CatalogRefused, SyncRequest
from rastro_assets.warehouse import link_store
from rastro_assets_tests.conftest import NOW, TOKEN

TODAY = date(2026, 11, 30)  # local today of both fake accounts at NOW
BASE_URL = "https://graph.facebook.com/v25.0"

# What these check happens on Meta's side of the sync or before it writes; the statements
# they pass through run on both engines in the tests around them, so once is enough.
META_SIDE = pytest.mark.engines("duckdb")


@pytest.fixture
def client_factory(linked_world):
    from rastro_fake_graph.app import FakeGraphTransport

    def client(token: str) -> MetaClient:
        return MetaClient(token, base_url=BASE_URL, transport=FakeGraphTransport(linked_world),
                          sleep=lambda seconds: None, page_size=4)

    return client


@pytest.fixture
def catalog(warehouse, client_factory, fake_clock, secrets_key) -> CatalogSyncer:
    return CatalogSyncer(warehouse, client_factory, clock=fake_clock)


def rows(warehouse, sql: str, params=()) -> list[tuple]:
    with warehouse.connect() as con:
        return con.execute(sql, list(params)).fetchall()


def catalog_rows(warehouse, account: str) -> dict[str, tuple]:
    found = rows(
        warehouse,
        "SELECT ad_id, ad_name, adset_id, adset_name, campaign_id, campaign_name, ad_status,"
        " creative_type, creative_id FROM ad_catalog WHERE ad_account_id = ?",
        [account],
    )
    return {row[0]: row[1:] for row in found}


def thumbnails(warehouse) -> dict[str, tuple]:
    found = rows(warehouse, "SELECT ad_id, content_type, image, sha256, creative_id FROM "
                            "ad_thumbnails")
    return {row[0]: (row[1], bytes(row[2]), row[3], row[4]) for row in found}


def with_picture(world, account: str) -> list[str]:
    return sorted(ad_id for ad_id, ad in world.accounts[account].ads.items()
                  if world.has_thumbnail(ad))


KIND = {"video": "video", "image": "image", "photo": "image", "carousel": "carousel",
        "other": "other"}


# -- the full catalog ---------------------------------------------------------------------


def test_the_full_catalog_holds_every_ad_and_status(catalog, warehouse, linked_world):
    outcome = catalog.sync_catalog("act_101", full=True, run_id="r1")
    assert outcome.ok, outcome.error
    fake = linked_world.accounts["act_101"].ads
    assert (outcome.ads_read, outcome.added, outcome.total_ads) == (len(fake), len(fake), len(fake))
    stored = catalog_rows(warehouse, "act_101")
    assert stored == {
        ad.ad_id: (ad.name, ad.adset_id, ad.adset_name, ad.campaign_id, ad.campaign_name,
                   ad.effective_status, KIND[ad.creative_kind], ad.creative_id)
        for ad in fake.values()
    }
    assert {"DELETED", "PAUSED", "ACTIVE"} <= {row[5] for row in stored.values()}
    assert rows(warehouse, "SELECT count(*) FROM meta_sync_runs") == [(0,)]


def test_renames_and_status_changes_show_in_the_next_read(catalog, warehouse, linked_world):
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    first, second = sorted(linked_world.accounts["act_101"].ads)[:2]
    linked_world.rename_ad(first, "Black Friday")
    linked_world.set_ad(second, effective_status="DELETED")
    added = linked_world.add_ad("act_101", name="Brand new", effective_status="PAUSED")
    outcome = catalog.sync_catalog("act_101", full=True, run_id="r2")
    assert (outcome.added, outcome.renamed, outcome.status_changed) == (1, 1, 1)
    stored = catalog_rows(warehouse, "act_101")
    assert stored[first][0] == "Black Friday"
    assert stored[second][5] == "DELETED"
    assert (stored[added.ad_id][0], stored[added.ad_id][5]) == ("Brand new", "PAUSED")


class StubClient:
    """A client whose answers a test writes by hand (Meta leaving fields out, say)."""

    def __init__(self, ads=(), by_id=None, images=None, delay=0.0) -> None:
        self._ads = list(ads)
        self._by_id = by_id or {}
        self._images = images or {}
        self._delay = delay
        self.stats = CallStats()
        self.asked: list[list[str]] = []
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()

    def ads(self, ad_account_id):
        yield from self._ads

    def ads_by_id(self, ad_ids, *, ad_account_id=None):
        self.asked.append(list(ad_ids))
        failing = [i for i in ad_ids if self._by_id.get(i) == "forbidden"]
        if failing:
            raise MetaError(ErrorKind.PERMISSION, "(#200) no permission", code=200)
        return [self._by_id[i] for i in ad_ids if i in self._by_id]

    def thumbnail(self, url, *, max_bytes=5_000_000):
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            time.sleep(self._delay)
            answer = self._images.get(url.split("?")[0])
            if isinstance(answer, Exception):
                raise answer
            return answer or Thumbnail("image/png", b"\x89PNG\r\n\x1a\n" + url.encode())
        finally:
            with self._lock:
                self.in_flight -= 1

    def close(self):
        pass


def stub_syncer(warehouse, fake_clock, stub) -> CatalogSyncer:
    return CatalogSyncer(warehouse, lambda token: stub, clock=fake_clock)


def test_a_field_missing_in_a_later_read_keeps_its_value(
    catalog, warehouse, linked_world, fake_clock
):
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    ad_id = sorted(linked_world.accounts["act_101"].ads)[0]
    before = catalog_rows(warehouse, "act_101")[ad_id]
    sparse = Ad(ad_id=ad_id, ad_account_id="act_101", name=None, adset_id=None,
                adset_name=None, campaign_id=None, campaign_name=None,
                effective_status="PAUSED", creative_type=None, creative_id=None)
    fake_clock.advance(hours=1)
    outcome = stub_syncer(warehouse, fake_clock, StubClient([sparse])).sync_catalog(
        "act_101", full=True, run_id="r2")
    assert outcome.ok and outcome.status_changed == 1
    after = catalog_rows(warehouse, "act_101")[ad_id]
    assert after == (*before[:5], "PAUSED", *before[6:])
    assert rows(warehouse, "SELECT updated_at FROM ad_catalog WHERE ad_id = ?", [ad_id]) == [
        (fake_clock(),)
    ]


def test_a_failed_read_keeps_the_pages_written_and_reports(catalog, warehouse, linked_world):
    linked_world.fail("ads", "permission", account="act_101")
    outcome = catalog.sync_catalog("act_101", full=True, run_id="r1")
    assert outcome.outcome == "permission"
    assert outcome.error.startswith("META_PERMISSION: ")


def test_a_dead_token_marks_the_connection_invalid(catalog, warehouse, linked_world):
    linked_world.fail("ads", "token_463")
    outcome = catalog.sync_catalog("act_202", full=True, run_id="r1")
    assert outcome.error.startswith("META_TOKEN_INVALID: ")
    assert rows(warehouse, "SELECT status FROM meta_connections") == [("invalid",)]
    again = catalog.sync_catalog("act_202", full=True, run_id="r2")
    assert again.outcome == "token"
    assert catalog.sync_thumbnails("act_202", run_id="r2").outcome == "token"


def test_an_unlinked_account_is_refused(catalog):
    with pytest.raises(CatalogRefused):
        catalog.sync_catalog("act_999", full=True, run_id="r1")
    with pytest.raises(CatalogRefused):
        catalog.sync_thumbnails("act_999", run_id="r1")


@META_SIDE
def test_a_missing_secrets_key_is_reported(catalog, monkeypatch):
    monkeypatch.delenv("RASTRO_SECRETS_KEY")
    outcome = catalog.sync_catalog("act_101", full=True, run_id="r1")
    assert outcome.error.startswith("SECRETS_KEY_MISSING: ")


# -- ads with leads but no name -------------------------------------------------------------


def add_leads(warehouse, site: str, ad_ids, day: date = TODAY) -> None:
    with warehouse.connect() as con:
        con.executemany("INSERT INTO lead_daily_rollups VALUES (?, ?, ?, 2)",
                        [[site, ad_id, day] for ad_id in ad_ids])


def test_unnamed_ads_with_leads_are_asked_for_fifty_a_run(catalog, warehouse, linked_world):
    new = [linked_world.add_ad("act_101").ad_id for _ in range(55)]
    add_leads(warehouse, "s1", new)
    first = catalog.sync_catalog("act_101", full=False, run_id="r1")
    assert first.ok and (first.asked_by_id, first.added) == (50, 50)
    assert linked_world.calls["ads_by_id"] == 1
    second = catalog.sync_catalog("act_101", full=False, run_id="r2")
    assert (second.asked_by_id, second.added) == (5, 5)
    stored = catalog_rows(warehouse, "act_101")
    assert all(stored[ad_id][0] == linked_world.ad(ad_id).name for ad_id in new)
    calls = linked_world.calls["ads_by_id"]
    third = catalog.sync_catalog("act_101", full=False, run_id="r3")
    assert third.asked_by_id == 0 and linked_world.calls["ads_by_id"] == calls


def test_an_ad_filed_under_another_account_is_not_asked_for(catalog, warehouse, linked_world):
    theirs = sorted(linked_world.accounts["act_202"].ads)[0]
    ours = sorted(linked_world.accounts["act_101"].ads)[0]
    old = sorted(linked_world.accounts["act_101"].ads)[1]
    with warehouse.connect() as con:  # act_202's spend read has seen it, without a name
        con.execute("INSERT INTO ad_catalog (ad_id, ad_account_id) VALUES (?, 'act_202')",
                    [theirs])
    add_leads(warehouse, "s1", [theirs, ours])
    add_leads(warehouse, "s1", [old], TODAY - timedelta(days=8))  # before the 8 local days
    outcome = catalog.sync_catalog("act_101", full=False, run_id="r1")
    assert outcome.asked_by_id == 1 and outcome.named_ids == [ours]
    assert set(catalog_rows(warehouse, "act_101")) == {ours}
    assert rows(warehouse, "SELECT ad_account_id, ad_name FROM ad_catalog WHERE ad_id = ?",
                [theirs]) == [("act_202", None)]


def test_an_answer_naming_another_account_is_not_filed_here(warehouse, linked_world, fake_clock,
                                                           secrets_key):
    add_leads(warehouse, "s1", ["501", "502"])
    stub = StubClient(by_id={"501": Ad("501", ad_account_id="act_202", name="theirs"),
                             "502": Ad("502", name="ours")})
    outcome = stub_syncer(warehouse, fake_clock, stub).sync_catalog(
        "act_101", full=False, run_id="r1")
    assert (outcome.skipped, outcome.named_ids) == (1, ["502"])
    assert rows(warehouse, "SELECT ad_id, ad_account_id FROM ad_catalog") == [("502", "act_101")]


def test_one_unreadable_ad_does_not_keep_the_others_unnamed(
    warehouse, linked_world, fake_clock, secrets_key
):
    add_leads(warehouse, "s1", ["601", "602", "603", "604"])
    stub = StubClient(by_id={"601": Ad("601", name="a"), "602": "forbidden",
                             "603": Ad("603", name="c"), "604": Ad("604", name="d")})
    outcome = stub_syncer(warehouse, fake_clock, stub).sync_catalog(
        "act_101", full=False, run_id="r1")
    assert outcome.ok and sorted(outcome.named_ids) == ["601", "603", "604"]


# -- thumbnails -------------------------------------------------------------------------------


def test_thumbnails_are_fetched_once_as_served(catalog, warehouse, linked_world):
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    outcome = catalog.sync_thumbnails("act_101", run_id="r1")
    expected = with_picture(linked_world, "act_101")
    assert (outcome.wanted, outcome.fetched, outcome.failed) == (len(expected), len(expected), 0)
    stored = thumbnails(warehouse)
    assert sorted(stored) == expected
    for ad_id, (content_type, image, sha256, creative_id) in stored.items():
        assert image == linked_world.thumbnail_bytes(ad_id)
        assert (content_type, sha256) == ("image/png", hashlib.sha256(image).hexdigest())
        assert creative_id == linked_world.ad(ad_id).creative_id
    assert 0 < len(outcome.preview) <= 4
    assert outcome.preview[0].image == stored[outcome.preview[0].ad_id][1]
    calls = linked_world.calls["thumbnail"]
    again = catalog.sync_thumbnails("act_101", run_id="r2")
    assert (again.wanted, again.fetched, again.failed) == (0, 0, 0)
    assert linked_world.calls["thumbnail"] == calls
    assert len(again.preview) == len(outcome.preview)  # the latest stored, for the UI


def test_a_new_creative_is_fetched_again(catalog, warehouse, linked_world):
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    catalog.sync_thumbnails("act_101", run_id="r1")
    ad_id = with_picture(linked_world, "act_101")[0]
    old = thumbnails(warehouse)[ad_id]
    linked_world.set_ad(ad_id, new_creative=True)
    catalog.sync_catalog("act_101", full=True, run_id="r2")
    outcome = catalog.sync_thumbnails("act_101", run_id="r2")
    assert (outcome.wanted, outcome.fetched) == (1, 1)
    new = thumbnails(warehouse)[ad_id]
    assert new[1] == linked_world.thumbnail_bytes(ad_id) != old[1]
    assert new[3] == linked_world.ad(ad_id).creative_id


def test_an_expired_url_leaves_the_row_and_is_retried(
    catalog, warehouse, linked_world, fake_clock
):
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    catalog.sync_thumbnails("act_101", run_id="r1")
    ad_id = with_picture(linked_world, "act_101")[0]
    old = thumbnails(warehouse)[ad_id]
    linked_world.set_ad(ad_id, new_creative=True)
    catalog.sync_catalog("act_101", full=True, run_id="r2")
    fake_clock.advance(days=5)  # past the signed URL's exp
    expired = catalog.sync_thumbnails("act_101", run_id="r2")
    assert (expired.wanted, expired.fetched, expired.failed) == (1, 0, 1)
    assert "URL signature expired" in expired.failures[0]
    assert "sig=" not in expired.failures[0]
    assert thumbnails(warehouse)[ad_id] == old
    catalog.sync_catalog("act_101", full=True, run_id="r3")  # a fresh URL
    retried = catalog.sync_thumbnails("act_101", run_id="r3")
    assert (retried.fetched, retried.failed) == (1, 0)
    assert thumbnails(warehouse)[ad_id][1] == linked_world.thumbnail_bytes(ad_id)


@META_SIDE
@pytest.mark.parametrize("error", ["html_page", "not_found", "timeout"])
def test_a_failed_download_stores_nothing_and_is_retried(
    catalog, warehouse, linked_world, error
):
    catalog.sync_catalog("act_202", full=True, run_id="r1")
    expected = with_picture(linked_world, "act_202")
    stored = expected[0]
    catalog.sync_thumbnails("act_202", run_id="r0")
    linked_world.set_ad(stored, new_creative=True)  # a stored picture, now stale
    catalog.sync_catalog("act_202", full=True, run_id="r1")
    with warehouse.connect() as con:
        con.execute("DELETE FROM ad_thumbnails WHERE ad_id <> ?", [stored])
    before = thumbnails(warehouse)
    linked_world.fail("thumbnail", error, times=None)
    first = catalog.sync_thumbnails("act_202", run_id="r1")
    assert first.ok
    assert (first.wanted, first.fetched, first.failed) == (len(expected), 0, len(expected))
    assert thumbnails(warehouse) == before
    linked_world.clear_failures()
    second = catalog.sync_thumbnails("act_202", run_id="r2")
    assert (second.wanted, second.fetched, second.failed) == (len(expected), len(expected), 0)
    assert {ad_id: row[1] for ad_id, row in thumbnails(warehouse).items()} == {
        ad_id: linked_world.thumbnail_bytes(ad_id) for ad_id in expected
    }


@META_SIDE
def test_one_failed_download_does_not_stop_the_others(catalog, warehouse, linked_world):
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    expected = with_picture(linked_world, "act_101")
    linked_world.fail("thumbnail", "html_page", times=1)
    first = catalog.sync_thumbnails("act_101", run_id="r1")
    assert (first.fetched, first.failed) == (len(expected) - 1, 1)
    assert "not an image" in first.failures[0]
    second = catalog.sync_thumbnails("act_101", run_id="r2")
    assert (second.wanted, second.fetched) == (1, 1)
    assert sorted(thumbnails(warehouse)) == expected


@META_SIDE
def test_a_body_that_is_not_the_image_it_claims_is_refused(warehouse, linked_world, fake_clock,
                                                          secrets_key):
    ads = [Ad(str(n), ad_account_id="act_101", creative_id=f"{n}01",
              thumbnail_url=f"https://cdn.test/{n}.png?sig=x") for n in (1, 2)]
    stub = StubClient(ads, images={"https://cdn.test/1.png": Thumbnail("image/png", b"<html>")})
    syncer = stub_syncer(warehouse, fake_clock, stub)
    syncer.sync_catalog("act_101", full=True, run_id="r1")
    outcome = syncer.sync_thumbnails("act_101", run_id="r1")
    assert (outcome.fetched, outcome.failed) == (1, 1)
    assert list(thumbnails(warehouse)) == ["2"]


@META_SIDE
def test_at_most_300_a_run_8_at_a_time(warehouse, linked_world, fake_clock, secrets_key,
                                       monkeypatch):
    monkeypatch.setattr(catalog_sync, "MAX_THUMBNAILS_PER_RUN", 20)
    ads = [Ad(str(n), ad_account_id="act_101", creative_id=f"{n}01",
              thumbnail_url=f"https://cdn.test/{n}.png?sig=x") for n in range(100, 125)]
    stub = StubClient(ads, delay=0.02)
    syncer = stub_syncer(warehouse, fake_clock, stub)
    syncer.sync_catalog("act_101", full=True, run_id="r1")
    first = syncer.sync_thumbnails("act_101", run_id="r1")
    assert (first.wanted, first.fetched) == (20, 20)
    assert 1 < stub.peak <= 8
    assert syncer.sync_thumbnails("act_101", run_id="r2").fetched == 5
    assert catalog_sync.THUMBNAIL_CONCURRENCY == 8


@META_SIDE
def test_no_signed_url_or_token_in_the_logs(catalog, linked_world, fake_clock, caplog):
    caplog.set_level(logging.DEBUG)
    catalog.sync_catalog("act_101", full=True, run_id="r1")
    fake_clock.advance(days=5)
    outcome = catalog.sync_thumbnails("act_101", run_id="r1")
    assert outcome.failed > 0
    # httpx's own INFO line names every URL it requests; keeping that logger
    # quiet is the client's business. Ours never name a signed URL.
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("rastro_assets"))
    assert "expired" in ours
    assert "sig=" not in ours and "exp=" not in ours
    assert TOKEN not in caplog.text


# -- inside the spend sync ---------------------------------------------------------------------


def test_a_spend_read_names_its_ads(syncer, warehouse, linked_world):
    outcome = syncer.sync(SyncRequest("act_101", TODAY - timedelta(days=2), TODAY))
    assert outcome.ok and outcome.catalog_error is None
    truth = {row.ad_id: row for day in (TODAY - timedelta(days=2), TODAY - timedelta(days=1),
                                        TODAY) for row in linked_world.truth("act_101", day)}
    stored = catalog_rows(warehouse, "act_101")
    assert set(stored) == set(truth)
    for ad_id, row in truth.items():
        assert stored[ad_id][:5] == (row.ad_name, row.adset_id, row.adset_name, row.campaign_id,
                                     row.campaign_name)
        assert stored[ad_id][5] is None  # the status comes with the catalog read
    assert linked_world.calls["ads"] == 0


def test_a_spend_name_never_refiles_an_ad(syncer, warehouse, linked_world):
    ad_id = linked_world.truth("act_101", TODAY)[0].ad_id
    with warehouse.connect() as con:
        link_store.link_account(con, "s1", "act_303", "c1", "UTC", "USD", NOW)
        con.execute("INSERT INTO ad_catalog (ad_id, ad_account_id, ad_name) VALUES "
                    "(?, 'act_303', 'kept')", [ad_id])
    syncer.sync(SyncRequest("act_101", TODAY, TODAY))
    assert rows(warehouse, "SELECT ad_account_id, ad_name FROM ad_catalog WHERE ad_id = ?",
                [ad_id]) == [("act_303", "kept")]


def test_a_daily_sync_reads_the_catalog_and_thumbnails(syncer, warehouse, linked_world):
    request = SyncRequest("act_202", TODAY - timedelta(days=6), TODAY, kind="daily",
                          catalog=True)
    outcome = syncer.sync(request)
    assert outcome.ok and outcome.catalog_error is None
    assert outcome.catalog.full and outcome.catalog.total_ads == len(
        linked_world.accounts["act_202"].ads)
    assert outcome.thumbnails.fetched == len(with_picture(linked_world, "act_202"))
    assert sorted(thumbnails(warehouse)) == with_picture(linked_world, "act_202")


def test_a_failing_thumbnail_download_never_fails_the_spend_sync(syncer, warehouse, linked_world):
    linked_world.fail("thumbnail", "html_page", times=None)
    request = SyncRequest("act_202", TODAY, TODAY, kind="daily", catalog=True, run_id="d1")
    outcome = syncer.sync(request)
    assert outcome.ok and outcome.error is None
    assert outcome.thumbnails.failed == len(with_picture(linked_world, "act_202"))
    assert outcome.thumbnails.fetched == 0
    assert thumbnails(warehouse) == {}
    assert rows(warehouse, "SELECT outcome, error FROM meta_sync_runs WHERE run_id = 'd1'") == [
        ("ok", None)
    ]


def test_a_failing_full_catalog_read_fails_its_run_and_keeps_the_spend(
    syncer, warehouse, linked_world
):
    linked_world.fail("ads", "permission")
    request = SyncRequest("act_202", TODAY, TODAY, kind="daily", catalog=True, run_id="d1")
    outcome = syncer.sync(request)
    assert outcome.outcome == "permission"
    assert outcome.error.startswith("META_PERMISSION: ") and outcome.error == outcome.catalog_error
    assert outcome.thumbnails is None
    assert rows(warehouse, "SELECT outcome, error FROM meta_sync_runs WHERE run_id = 'd1'") == [
        ("permission", outcome.error)
    ]
    spend = "SELECT count(*) FROM ad_spend_daily WHERE ad_account_id = 'act_202'"
    assert rows(warehouse, spend)[0][0] == len(linked_world.truth("act_202", TODAY))


def test_the_full_catalog_reads_usage_counts_toward_the_runs_back_off(
    syncer, warehouse, linked_world
):
    # The spend read spends the account's ads_insights hour; the catalog's first read brings
    # its ads_management hour to 76 %.
    limit = linked_world.limits.management_calls(linked_world.active_ads("act_202"))
    linked_world.use_up("act_202", "ads_management", limit * 76 // 100 - 1)
    request = SyncRequest("act_202", TODAY, TODAY, kind="daily", catalog=True, run_id="d1")
    outcome = syncer.sync(request)
    assert outcome.ok
    assert outcome.api_calls > outcome.catalog.api_calls > 0
    usage = rows(warehouse, "SELECT usage_pct FROM meta_sync_runs WHERE run_id = 'd1'")[0][0]
    assert usage == outcome.catalog.usage.pct > 75


@META_SIDE
def test_an_unexpected_catalog_crash_fails_the_full_read_without_leaking_a_url(
    syncer, monkeypatch
):
    def crash(*args, **kwargs):
        raise RuntimeError("boom at https://cdn.test/x.png?sig=secret")

    monkeypatch.setattr(CatalogSyncer, "sync_catalog", crash)
    outcome = syncer.sync(SyncRequest("act_202", TODAY, TODAY, catalog=True))
    assert outcome.outcome == "other"
    assert outcome.error.startswith("META_UNAVAILABLE: ") and "sig=" not in outcome.error


@META_SIDE
def test_failing_names_of_a_live_sync_never_fail_it(syncer, warehouse, linked_world):
    silent = linked_world.add_ad("act_101", name="No spend yet",
                                 delivers_from=TODAY + timedelta(days=30))
    add_leads(warehouse, "s1", [silent.ad_id])
    linked_world.fail("ads_by_id", "http5xx_html", times=None)
    outcome = syncer.sync(SyncRequest("act_101", TODAY, TODAY, kind="live", run_id="l1"))
    assert outcome.ok and outcome.catalog_error.startswith("META_UNAVAILABLE: ")
    assert rows(warehouse, "SELECT outcome FROM meta_sync_runs WHERE run_id = 'l1'") == [("ok",)]


def test_a_live_sync_names_unnamed_ads_with_leads(syncer, warehouse, linked_world):
    silent = linked_world.add_ad("act_101", name="No spend yet",
                                 delivers_from=TODAY + timedelta(days=30))
    add_leads(warehouse, "s1", [silent.ad_id])
    outcome = syncer.sync(SyncRequest("act_101", TODAY, TODAY, kind="live"))
    assert outcome.ok and outcome.catalog_error is None
    assert outcome.catalog.named_ids == [silent.ad_id]
    assert catalog_rows(warehouse, "act_101")[silent.ad_id][0] == "No spend yet"
    assert thumbnails(warehouse)[silent.ad_id][1] == linked_world.thumbnail_bytes(silent.ad_id)
    assert linked_world.calls["ads"] == 0  # no full read between daily re-syncs


# -- a fill's last block ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["backfill", "gap"])
def test_the_block_of_a_fill_that_reaches_today_reads_the_full_catalog(
    syncer, warehouse, linked_world, kind
):
    earlier = SyncRequest("act_101", TODAY - timedelta(days=40), TODAY - timedelta(days=11),
                          kind=kind, run_id="b1")
    last = SyncRequest("act_101", TODAY - timedelta(days=10), TODAY, kind=kind, run_id="b2")
    first = syncer.sync(earlier)
    assert first.ok and first.catalog is not None and not first.catalog.full
    assert linked_world.calls["ads"] == 0
    outcome = syncer.sync(last)
    assert outcome.ok and outcome.request.catalog and outcome.catalog.full
    assert linked_world.calls["ads"] == 1
    assert set(catalog_rows(warehouse, "act_101")) == set(linked_world.accounts["act_101"].ads)
    flags = rows(warehouse, "SELECT run_id, catalog FROM meta_sync_runs ORDER BY run_id")
    assert flags == [("b1", False), ("b2", True)]


def test_unnamed_ads_are_looked_for_over_8_local_days(catalog, warehouse, linked_world):
    edge = linked_world.add_ad("act_101").ad_id
    add_leads(warehouse, "s1", [edge], TODAY - timedelta(days=7))  # the reference's dayStart - 7
    outcome = catalog.sync_catalog("act_101", full=False, run_id="r1")
    assert outcome.named_ids == [edge]

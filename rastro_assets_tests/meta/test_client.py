"""The client's catalog reads: the ad catalog, ads by id, and the account node."""

from __future__ import annotations

import httpx

from rastro_assets_tests.meta.conftest import BASE_URL, BRL, JPY, TOKEN, ClientFactory
from rastro_fake_graph import FakeGraphTransport, FakeWorld

KIND_TO_TYPE = {"video": "video", "image": "image", "photo": "image", "carousel": "carousel",
                "other": "other"}


def test_ads_pages_through_every_status(world: FakeWorld, client_for: ClientFactory) -> None:
    client = client_for(page_size=3)
    ads = list(client.ads(BRL))
    fake = world.accounts[BRL].ads
    assert sorted(ad.ad_id for ad in ads) == sorted(fake)
    assert world.calls["ads"] >= 4
    assert {"DELETED", "ARCHIVED", "PAUSED", "ACTIVE"} <= {ad.effective_status for ad in ads}
    for ad in ads:
        truth = fake[ad.ad_id]
        assert ad.ad_account_id == BRL
        assert (ad.name, ad.adset_id, ad.adset_name, ad.campaign_id, ad.campaign_name) == (
            truth.name, truth.adset_id, truth.adset_name, truth.campaign_id, truth.campaign_name)
        assert ad.creative_type == KIND_TO_TYPE[truth.creative_kind]
        assert ad.creative_id == truth.creative_id
    assert {ad.creative_type for ad in ads} == {"video", "image", "carousel", "other"}


def test_catalog_without_status_filter_hides_deleted_and_archived(world: FakeWorld) -> None:
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        body = http.get(f"{BASE_URL}/{BRL}/ads", params={"fields": "id,effective_status",
                                                        "limit": 100},
                        headers={"Authorization": f"Bearer {TOKEN}"}).json()
    statuses = {ad["effective_status"] for ad in body["data"]}
    assert "DELETED" not in statuses and "ARCHIVED" not in statuses
    assert "PAUSED" in statuses


def test_catalog_changes_show(world: FakeWorld, client) -> None:
    ad_id = sorted(world.accounts[JPY].ads)[1]
    before = next(ad for ad in client.ads(JPY) if ad.ad_id == ad_id)
    world.set_ad(ad_id, name="新しい名前", effective_status="DELETED", creative_kind="video")
    after = next(ad for ad in client.ads(JPY) if ad.ad_id == ad_id)
    assert (after.name, after.effective_status, after.creative_type) == (
        "新しい名前", "DELETED", "video")
    assert after.creative_id != before.creative_id
    assert after.thumbnail_url != before.thumbnail_url
    assert client.thumbnail(after.thumbnail_url).data != client.thumbnail(
        before.thumbnail_url).data
    new = world.add_ad(JPY, name="追加", creative_kind="carousel")
    assert new.ad_id in {ad.ad_id for ad in client.ads(JPY)}


def test_ads_by_id_batches_of_fifty(world: FakeWorld, client_for: ClientFactory) -> None:
    world.add_account("act_3001", timezone="UTC", currency="EUR", n_ads=120, token=TOKEN)
    wanted = sorted(world.accounts["act_3001"].ads, reverse=True)
    ads = client_for().ads_by_id(wanted)
    assert [ad.ad_id for ad in ads] == wanted
    assert world.calls["ads_by_id"] == 3
    assert ads[0].name == world.ad(wanted[0]).name


def test_ads_by_id_survives_unknown_ids(world: FakeWorld, client) -> None:
    known = sorted(world.accounts[BRL].ads)
    wanted = [known[0], "999000111", *known[1:6], "999000222", known[6], "not-an-id", known[0]]
    ads = client.ads_by_id(wanted)
    assert [ad.ad_id for ad in ads] == known[:7]
    assert client.ads_by_id(["999000333"]) == []
    assert client.ads_by_id([]) == []


def test_fake_refuses_more_than_fifty_ids(world: FakeWorld) -> None:
    ids = ",".join(str(100 + n) for n in range(51))
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        response = http.get(f"{BASE_URL}/", params={"ids": ids, "fields": "id"},
                            headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "(#100) Too many IDs. Maximum: 50"


def test_account_node(world: FakeWorld, client) -> None:
    account = client.account("2002")
    assert (account.ad_account_id, account.name, account.currency, account.timezone,
            account.account_status) == (JPY, "東京ストア", "JPY", "Asia/Tokyo", 1)

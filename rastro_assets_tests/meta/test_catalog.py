"""The ad catalog, ads by id, the account node, and thumbnails."""

from __future__ import annotations

import httpx
import pytest

from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.fake import FakeGraphTransport, FakeWorld
from rastro_assets.meta.fake.images import PNG_SIGNATURE
from rastro_assets_tests.meta.conftest import BASE_URL, BRL, JPY, TOKEN, ClientFactory

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


def test_thumbnail_is_the_creatives_image(world: FakeWorld, client) -> None:
    ad = next(ad for ad in client.ads(BRL) if ad.thumbnail_url)
    thumbnail = client.thumbnail(ad.thumbnail_url)
    assert thumbnail.content_type == "image/png"
    assert thumbnail.data.startswith(PNG_SIGNATURE)
    assert thumbnail.data == world.thumbnail_bytes(ad.ad_id)


def test_image_url_serves_a_jpeg(world: FakeWorld, client) -> None:
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        body = http.get(f"{BASE_URL}/{BRL}/ads", params={"fields": "id,creative{image_url}"},
                        headers={"Authorization": f"Bearer {TOKEN}"}).json()
    url = next(ad["creative"]["image_url"] for ad in body["data"]
               if "image_url" in ad.get("creative", {}))
    image = client.thumbnail(url)
    assert image.content_type == "image/jpeg"
    assert image.data[:2] == b"\xff\xd8" and image.data[-2:] == b"\xff\xd9"


def test_expired_thumbnail_url(world: FakeWorld, client, clock) -> None:
    ad = next(ad for ad in client.ads(BRL) if ad.thumbnail_url)
    clock.advance(days=4)
    with pytest.raises(MetaError) as caught:
        client.thumbnail(ad.thumbnail_url)
    exc = caught.value
    assert (exc.kind, exc.http_status) == (ErrorKind.OTHER, 403)
    assert "URL signature expired" in str(exc)
    assert "sig=" not in str(exc) and "?" not in str(exc)


def test_tampered_thumbnail_url(world: FakeWorld, client) -> None:
    ad = next(ad for ad in client.ads(BRL) if ad.thumbnail_url)
    with pytest.raises(MetaError) as caught:
        client.thumbnail(ad.thumbnail_url.replace("sig=", "sig=0"))
    assert caught.value.http_status == 403


def test_thumbnail_that_is_not_an_image(world: FakeWorld, client) -> None:
    ad = next(ad for ad in client.ads(BRL) if ad.thumbnail_url)
    world.fail("thumbnail", "html_page")
    with pytest.raises(MetaError) as caught:
        client.thumbnail(ad.thumbnail_url)
    assert caught.value.kind is ErrorKind.OTHER
    assert "text/html, not an image" in str(caught.value)


def test_thumbnail_size_cap(world: FakeWorld, client) -> None:
    ad = next(ad for ad in client.ads(BRL) if ad.thumbnail_url)
    size = len(world.thumbnail_bytes(ad.ad_id))
    assert client.thumbnail(ad.thumbnail_url, max_bytes=size).data
    with pytest.raises(MetaError) as caught:
        client.thumbnail(ad.thumbnail_url, max_bytes=size - 1)
    assert caught.value.kind is ErrorKind.OTHER
    assert f"over the {size - 1}-byte cap" in str(caught.value)


def test_thumbnail_cap_without_content_length(client_for: ClientFactory) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        chunks = iter([b"x" * 60, b"x" * 60])
        return httpx.Response(200, headers={"Content-Type": "image/jpeg"},
                              stream=httpx.ByteStream(b"".join(chunks)))

    client = client_for(transport=httpx.MockTransport(answer))
    with pytest.raises(MetaError) as caught:
        client.thumbnail("https://cdn.test/a.jpg?sig=1", max_bytes=100)
    assert "over the 100-byte cap" in str(caught.value)


@pytest.mark.parametrize("error", ["http5xx_html", "dropped", "timeout"])
def test_thumbnail_transients_retry(world: FakeWorld, client_for: ClientFactory,
                                    error: str) -> None:
    client = client_for(max_retries=2)
    ad = next(ad for ad in client.ads(BRL) if ad.thumbnail_url)
    world.fail("thumbnail", error, times=2)
    assert client.thumbnail(ad.thumbnail_url).data == world.thumbnail_bytes(ad.ad_id)
    world.fail("thumbnail", error, times=None)
    with pytest.raises(MetaError) as caught:
        client.thumbnail(ad.thumbnail_url)
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert "sig=" not in str(caught.value)


def test_thumbnail_rejects_odd_urls(client) -> None:
    for url in ["ftp://cdn.test/a.png", "not a url", "https:///nohost"]:
        with pytest.raises(MetaError) as caught:
            client.thumbnail(url)
        assert caught.value.kind is ErrorKind.OTHER

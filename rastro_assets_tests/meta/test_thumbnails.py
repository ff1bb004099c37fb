"""Thumbnails from Meta's CDN: images, signed URLs, the size cap, retries, refusals."""

from __future__ import annotations

import httpx
import pytest

from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets_tests.meta.conftest import BASE_URL, BRL, TOKEN, ClientFactory
from rastro_fake_graph import FakeGraphTransport, FakeWorld
from rastro_fake_graph.images import PNG_SIGNATURE


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

"""Retries with back-off, and the token never leaking: not in a URL, message, repr or log."""

from __future__ import annotations

import logging
import traceback
from datetime import date

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MalformedResponse, MetaError
from rastro_assets_tests.meta.conftest import (
    BASE_URL,
    BRL,
    TOKEN,
    ClientFactory,
    RecordingTransport,
)
from rastro_fake_graph import FakeGraphTransport, FakeWorld


@pytest.mark.parametrize(
    ("error", "text", "status"),
    [
        ("http5xx_html", "Meta answered HTTP 502 with an HTML page instead of JSON", 502),
        ("http5xx_empty", "Meta answered HTTP 503 with an empty body", 503),
        ("html_page", "Meta answered HTTP 200 with an HTML page instead of JSON", 200),
        ("malformed_json", "Meta answered HTTP 200 with a body that is not valid JSON", 200),
        ("wrong_shape", "JSON that is not an object", 200),
    ],
)
def test_broken_bodies_are_malformed_and_retried(
    world: FakeWorld, client_for: ClientFactory, error: str, text: str, status: int
) -> None:
    world.fail("account", error, times=None)
    client = client_for(max_retries=2)
    with pytest.raises(MalformedResponse) as caught:
        client.account(BRL)
    assert text in str(caught.value)
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert caught.value.http_status == status
    assert world.calls["account"] == 3


@pytest.mark.parametrize(
    ("error", "text"),
    [("dropped", "RemoteProtocolError"), ("timeout", "did not answer"),
     ("transient", "unexpected error"), ("unknown_error", "unknown error")],
)
def test_transient_failures_retry_then_succeed(
    world: FakeWorld, client_for: ClientFactory, error: str, text: str
) -> None:
    world.fail("account", error, times=2)
    sleeps: list[float] = []
    client = client_for(sleep=sleeps.append)
    assert client.account(BRL).currency == "BRL"
    assert world.calls["account"] == 3
    assert len(sleeps) == 2
    world.fail("account", error, times=None)
    with pytest.raises(MetaError) as caught:
        client.account(BRL)
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert text in str(caught.value)


def test_backoff_is_exponential_with_jitter(world: FakeWorld, client_for: ClientFactory) -> None:
    world.fail("me", "transient", times=None)
    sleeps: list[float] = []
    client = client_for(sleep=sleeps.append, max_retries=5)
    with pytest.raises(MetaError):
        client.check_token()
    assert len(sleeps) == 5
    for attempt, delay in enumerate(sleeps):
        assert 0.5 * 2**attempt <= delay <= 2**attempt


def test_secret_token_never_leaks(
    world: FakeWorld, client_for: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    recorder = RecordingTransport(FakeGraphTransport(world))
    client = client_for(transport=recorder, max_retries=1)
    errors: list[BaseException] = []
    for point, error in [("account", "token_463"), ("account", "dropped"),
                         ("account", "timeout"), ("account", "http5xx_html"),
                         ("account", "malformed_json"), ("account", "throttled")]:
        world.fail(point, error, times=None)
        with pytest.raises(MetaError) as caught:
            client.account(BRL)
        errors.append(caught.value)
        world.clear_failures()
    world.row_cap = 2
    world.fail("async", "job_failed")
    list(client.insights(BRL, date(2026, 3, 1), date(2026, 3, 1)))
    ads = list(client.ads(BRL))
    client.thumbnail(next(ad.thumbnail_url for ad in ads if ad.thumbnail_url))

    texts = [repr(client), repr(vars(client)), caplog.text]
    for exc in errors:
        texts += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
        # httpx exceptions hold the request, Authorization header included.
        assert exc.__cause__ is None
        assert not isinstance(exc.__context__, httpx.HTTPError)
    for text in texts:
        assert TOKEN not in text
    for request in recorder.requests:
        assert TOKEN not in str(request.url)
        assert TOKEN not in request.content.decode()
        if request.url.host == "graph.facebook.com":
            assert request.headers["authorization"] == f"Bearer {TOKEN}"
        else:
            assert "authorization" not in request.headers


def test_meta_echoing_the_token_is_scrubbed(client_for: ClientFactory) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {
            "message": f"Malformed access token {TOKEN}", "type": "OAuthException",
            "code": 190, "fbtrace_id": "Axyz"}})

    client = client_for(transport=httpx.MockTransport(answer))
    with pytest.raises(MetaError) as caught:
        client.check_token()
    assert TOKEN not in str(caught.value) and "[token]" in str(caught.value)


def test_bad_tokens_are_refused_without_echo() -> None:
    for bad, secret in [("", None), ("  padded-secret  ", "padded-secret"),
                        ("two-secret\nlines", "two-secret")]:
        with pytest.raises(ValueError) as caught:
            MetaClient(bad, base_url=BASE_URL)
        assert secret is None or secret not in str(caught.value)


@pytest.mark.parametrize(
    ("failure", "graph_text", "cdn_text"),
    [(httpx.ReadTimeout("slow"), "did not answer GET me within 5s",
      "thumbnail https://cdn.example/t.png did not arrive within 5s"),
     (httpx.ConnectError("refused"), "the connection to Meta failed during GET me (ConnectError)",
      "fetching thumbnail https://cdn.example/t.png failed (ConnectError)")],
)
def test_httpx_failures_become_transient_meta_errors_without_their_chain(
    failure: httpx.HTTPError, graph_text: str, cdn_text: str
) -> None:
    """The Graph and the CDN share one translation: TRANSIENT, retried, no httpx chain."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise failure

    sleeps: list[float] = []
    client = MetaClient(TOKEN, base_url=BASE_URL, transport=httpx.MockTransport(answer),
                        timeout_seconds=5, max_retries=2, sleep=sleeps.append)
    for call, text in [(client.check_token, graph_text),
                       (lambda: client.thumbnail("https://cdn.example/t.png?sig=s3cret"),
                        cdn_text)]:
        sent.clear()
        with pytest.raises(MetaError) as caught:
            call()
        exc = caught.value
        assert exc.kind is ErrorKind.TRANSIENT and text in str(exc)
        assert exc.__cause__ is None and exc.__context__ is None
        assert len(sent) == 3  # the first try and two retries
        assert "s3cret" not in str(exc) and TOKEN not in str(exc)
    assert client.stats.api_calls == 3  # the CDN is not a Graph call

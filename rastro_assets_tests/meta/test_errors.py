"""Every error class, retries, and the token never leaking."""

from __future__ import annotations

import json
import logging
import traceback
from datetime import date

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MalformedResponse, MetaError, classify_error
from rastro_assets.meta.fake import FakeGraphTransport, FakeWorld
from rastro_assets_tests.meta.conftest import (
    BASE_URL,
    BRL,
    TOKEN,
    ClientFactory,
    RecordingTransport,
)

TOKEN_CASES = [("token", None), *[(f"token_{s}", s) for s in (458, 459, 460, 463, 464, 467, 492)]]


@pytest.mark.parametrize(("error", "subcode"), TOKEN_CASES)
def test_token_errors(world: FakeWorld, client, error: str, subcode: int | None) -> None:
    world.fail("account", error)
    with pytest.raises(MetaError) as caught:
        client.account(BRL)
    exc = caught.value
    assert (exc.kind, exc.code, exc.subcode, exc.http_status) == (
        ErrorKind.TOKEN, 190, subcode, 400)
    assert exc.fbtrace_id
    assert world.calls["account"] == 1, "token errors are not retried"


def test_killed_unknown_and_revived_tokens(world: FakeWorld, client_for: ClientFactory) -> None:
    client = client_for()
    client.check_token()
    world.kill_token(TOKEN, subcode=460)
    with pytest.raises(MetaError) as caught:
        client.check_token()
    assert (caught.value.kind, caught.value.subcode) == (ErrorKind.TOKEN, 460)
    world.revive_token(TOKEN)
    client.check_token()
    with pytest.raises(MetaError) as caught:
        client_for("EAAnobody-knows-this-one").check_token()
    assert (caught.value.kind, caught.value.code, caught.value.subcode) == (
        ErrorKind.TOKEN, 190, None)


@pytest.mark.parametrize("code", [4, 17, 32, 613, 80000, 80004])
def test_throttled_carries_regain_time(world: FakeWorld, client, code: int) -> None:
    world.fail("insights", f"throttled_{code}", regain_minutes=7)
    with pytest.raises(MetaError) as caught:
        list(client.insights(BRL, date(2026, 3, 1), date(2026, 3, 1)))
    exc = caught.value
    assert (exc.kind, exc.code) == (ErrorKind.THROTTLED, code)
    assert exc.regain_seconds == 7 * 60
    assert client.stats.usage.regain_seconds == 7 * 60
    assert client.stats.usage.pct >= 100
    assert world.calls["insights"] == 1


@pytest.mark.parametrize(("error", "code", "status"),
                         [("permission", 200, 403), ("permission_10", 10, 403)])
def test_permission_errors(world: FakeWorld, client, error: str, code: int, status: int) -> None:
    world.fail("ads", error)
    with pytest.raises(MetaError) as caught:
        list(client.ads(BRL))
    assert (caught.value.kind, caught.value.code, caught.value.http_status) == (
        ErrorKind.PERMISSION, code, status)


def test_account_the_token_cannot_read(world: FakeWorld, client) -> None:
    world.revoke(TOKEN, BRL)
    with pytest.raises(MetaError) as caught:
        client.account(BRL)
    assert (caught.value.kind, caught.value.code) == (ErrorKind.PERMISSION, 200)
    with pytest.raises(MetaError) as caught:
        client.account("act_999")
    assert (caught.value.kind, caught.value.code, caught.value.subcode) == (
        ErrorKind.OTHER, 100, 33)


def test_other_errors_are_raised_at_once(world: FakeWorld, client) -> None:
    world.fail("account", "other", times=5)
    with pytest.raises(MetaError) as caught:
        client.account(BRL)
    assert (caught.value.kind, caught.value.code) == (ErrorKind.OTHER, 100)
    assert world.calls["account"] == 1


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


def test_error_without_json_error_object(client_for: ClientFactory) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        status = 500 if request.url.path.endswith("/me") else 404
        return httpx.Response(status, json={"nothing": "here"})

    client = client_for(transport=httpx.MockTransport(answer), max_retries=1)
    with pytest.raises(MetaError) as caught:
        client.check_token()
    assert caught.value.kind is ErrorKind.TRANSIENT and caught.value.http_status == 500
    with pytest.raises(MetaError) as caught:
        client.account(BRL)
    assert caught.value.kind is ErrorKind.OTHER and caught.value.http_status == 404


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


def test_classification_table() -> None:
    def kind(body: dict, status: int = 400) -> ErrorKind:
        return classify_error(body, http_status=status, regain_seconds=60).kind

    assert kind({"code": 190, "error_subcode": 463}) is ErrorKind.TOKEN
    assert kind({"code": 80014}) is ErrorKind.THROTTLED
    assert kind({"code": 80015}) is ErrorKind.OTHER
    assert kind({"code": 4, "error_subcode": 1504022}) is ErrorKind.THROTTLED
    assert kind({"code": 10}) is ErrorKind.PERMISSION
    assert kind({"code": 299}) is ErrorKind.PERMISSION
    assert kind({"code": 1, "message": "Please reduce the amount of data you're asking for, "
                 "then retry your request"}, 500) is ErrorKind.TOO_MUCH_DATA
    assert kind({"code": 1, "error_subcode": 99, "message": "An unknown error occurred"},
                500) is ErrorKind.TRANSIENT
    assert kind({"code": 100, "error_subcode": 1504018}) is ErrorKind.TOO_MUCH_DATA
    assert kind({"code": 2, "error_subcode": 1504038, "is_transient": True}) is (
        ErrorKind.TOO_MUCH_DATA)
    assert kind({"code": 2, "is_transient": True}) is ErrorKind.TRANSIENT
    assert kind({"code": 3018, "is_transient": True}) is ErrorKind.TRANSIENT
    assert kind({"code": 100}) is ErrorKind.OTHER
    assert kind({"code": 803}) is ErrorKind.OTHER
    assert kind({"code": "17"}) is ErrorKind.THROTTLED
    throttled = classify_error({"code": 17}, http_status=400, regain_seconds=60)
    assert throttled.regain_seconds == 60
    assert classify_error({"code": 100}, http_status=400, regain_seconds=60).regain_seconds is None


def test_fake_error_bodies_have_metas_shape(world: FakeWorld) -> None:
    world.fail("me", "too_much_data_1504038")
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        response = http.get(f"{BASE_URL}/me", headers={"Authorization": f"Bearer {TOKEN}"})
    error = json.loads(response.content)["error"]
    assert {"message", "type", "code", "error_subcode", "fbtrace_id", "is_transient"} <= set(error)
    assert "X-App-Usage" in response.headers


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

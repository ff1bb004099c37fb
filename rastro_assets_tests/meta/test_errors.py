"""Every error class: how Meta's failures are classified and raised."""

from __future__ import annotations

import json
from datetime import date

import httpx
import pytest

from rastro_assets.meta.errors import ErrorKind, MetaError, classify_error, throttle_limit
from rastro_assets.meta.limits import RateLimit
from rastro_assets_tests.meta.conftest import (
    BASE_URL,
    BRL,
    TOKEN,
    ClientFactory,
)
from rastro_fake_graph import FakeGraphTransport, FakeWorld

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


@pytest.mark.parametrize(
    ("code", "limit"),
    [(17, RateLimit.AD_ACCOUNT_SCORE), (32, RateLimit.APP_PLATFORM), (613, RateLimit.ABUSE),
     (80000, RateLimit.ADS_INSIGHTS), (80004, RateLimit.ADS_MANAGEMENT)],
)
def test_throttled_carries_regain_time_and_its_limit(
    world: FakeWorld, client, code: int, limit: RateLimit
) -> None:
    world.fail("insights", f"throttled_{code}", regain_minutes=7)
    with pytest.raises(MetaError) as caught:
        list(client.insights(BRL, date(2026, 3, 1), date(2026, 3, 1)))
    exc = caught.value
    assert (exc.kind, exc.code, exc.limit) == (ErrorKind.THROTTLED, code, limit)
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


def test_the_app_throttle_is_waited_out_and_the_request_sent_again(
    world: FakeWorld, client_for: ClientFactory
) -> None:
    world.fail("insights", "throttled_4", regain_minutes=7)
    sleeps: list[float] = []
    chunks = list(client_for(sleep=sleeps.append).insights(BRL, date(2026, 3, 1),
                                                            date(2026, 3, 1)))
    assert [chunk.complete for chunk in chunks] == [True]
    assert world.calls["insights"] == 2
    [pause] = sleeps
    assert 60 < pause <= 72


@pytest.mark.parametrize(
    ("code", "subcode", "limit"),
    [
        (80000, 2446079, RateLimit.ADS_INSIGHTS),
        (80000, None, RateLimit.ADS_INSIGHTS),
        (80004, 2446079, RateLimit.ADS_MANAGEMENT),
        (80003, None, RateLimit.ADS_MANAGEMENT),
        (80014, None, RateLimit.ADS_MANAGEMENT),
        (17, 2446079, RateLimit.AD_ACCOUNT_SCORE),
        (613, 1487742, RateLimit.AD_ACCOUNT_SCORE),
        (613, None, RateLimit.ABUSE),
        (4, 1504039, RateLimit.ACCOUNT_INSIGHTS_LOAD),
        (4, 1504022, RateLimit.APP_INSIGHTS_LOAD),
        (4, None, RateLimit.APP_PLATFORM),
        (32, None, RateLimit.APP_PLATFORM),
    ],
)
def test_a_throttle_names_its_limit(code: int, subcode: int | None, limit: RateLimit) -> None:
    error = {"code": code, "message": "limit reached"}
    if subcode is not None:
        error["error_subcode"] = subcode
    throttle = classify_error(error, http_status=400, regain_seconds=None)
    assert (throttle.kind, throttle.limit) == (ErrorKind.THROTTLED, limit)
    assert throttle_limit(code, subcode) == limit


def test_only_a_throttle_names_a_limit() -> None:
    for code in (190, 200, 100, 1, 803):
        assert classify_error({"code": code}, http_status=400, regain_seconds=None).limit is None


def test_fake_error_bodies_have_metas_shape(world: FakeWorld) -> None:
    world.fail("me", "too_much_data_1504038")
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        response = http.get(f"{BASE_URL}/me", headers={"Authorization": f"Bearer {TOKEN}"})
    error = json.loads(response.content)["error"]
    assert {"message", "type", "code", "error_subcode", "fbtrace_id", "is_transient"} <= set(error)
    assert "X-App-Usage" in response.headers

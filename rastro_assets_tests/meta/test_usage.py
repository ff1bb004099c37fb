"""Rate-limit headers into `Usage`, alone and through the client."""

from __future__ import annotations

import json
from datetime import date

import pytest

from rastro_assets.meta.errors import MetaError
from rastro_assets.meta.limits import RateLimit
from rastro_assets.meta.models import Usage
from rastro_assets.meta.usage import app_readings, parse_usage
from rastro_assets_tests.meta.conftest import BRL, ClientFactory
from rastro_fake_graph import FakeWorld


def header(value: object) -> str:
    return json.dumps(value)


def test_business_use_case_header() -> None:
    usage = parse_usage({"X-Business-Use-Case-Usage": header({"1234": [
        {"type": "ads_insights", "call_count": 95, "total_cputime": 20, "total_time": 20,
         "estimated_time_to_regain_access": 3}]})})
    assert usage == Usage(pct=95, regain_seconds=180, account_pct=95,
                          limit=RateLimit.ADS_INSIGHTS)


def test_ad_account_header_reset_counts_only_when_full_or_throttled() -> None:
    light = {"X-Ad-Account-Usage": header(
        {"acc_id_util_pct": 9.67, "reset_time_duration": 100,
         "ads_api_access_tier": "standard_access"})}
    score = {"account_pct": 9.67, "limit": RateLimit.AD_ACCOUNT_SCORE, "reset_seconds": 100}
    assert parse_usage(light) == Usage(pct=9.67, regain_seconds=None, **score)
    assert parse_usage(light, throttled=True) == Usage(pct=9.67, regain_seconds=100, **score)
    full = {"X-Ad-Account-Usage": header({"acc_id_util_pct": 100, "reset_time_duration": 240})}
    assert parse_usage(full) == Usage(pct=100, regain_seconds=240, account_pct=100,
                                      limit=RateLimit.AD_ACCOUNT_SCORE, reset_seconds=240)


def test_app_header_is_the_apps_share_not_the_accounts() -> None:
    usage = parse_usage({"X-App-Usage": header(
        {"call_count": 28, "total_time": 25, "total_cputime": 31})})
    assert usage == Usage(pct=31, regain_seconds=None, app_pct=31)


def test_insights_throttle_header() -> None:
    usage = parse_usage({"X-FB-Ads-Insights-Throttle": header(
        {"app_id_util_pct": 12.5, "acc_id_util_pct": 41, "ads_api_access_tier": "standard"})})
    assert usage == Usage(pct=41, regain_seconds=None, account_pct=41, app_pct=12.5,
                          limit=RateLimit.ACCOUNT_INSIGHTS_LOAD)


def test_highest_over_all_headers_case_insensitive() -> None:
    usage = parse_usage({
        "x-app-usage": header({"call_count": 5}),
        "X-AD-ACCOUNT-USAGE": header({"acc_id_util_pct": "12.5"}),
        "x-business-use-case-usage": header({"1": [{"call_count": 3,
                                                   "estimated_time_to_regain_access": 0}],
                                             "2": [{"total_time": 77,
                                                    "estimated_time_to_regain_access": 2}]}),
    })
    assert usage == Usage(pct=77, regain_seconds=120, account_pct=77, app_pct=5,
                          limit=RateLimit.ADS_MANAGEMENT, reset_seconds=None)


def test_the_accounts_nearest_limit_is_named_and_the_apps_share_kept_apart() -> None:
    headers = {
        "X-Business-Use-Case-Usage": header({"77": [
            {"type": "ads_management", "call_count": 12, "total_cputime": 3, "total_time": 5},
            {"type": "ads_insights", "call_count": 30, "total_cputime": 64, "total_time": 41,
             "estimated_time_to_regain_access": 0}]}),
        "X-Ad-Account-Usage": header({"acc_id_util_pct": 22, "reset_time_duration": 80}),
        "X-FB-Ads-Insights-Throttle": header({"app_id_util_pct": 93, "acc_id_util_pct": 8}),
    }
    usage = parse_usage(headers)
    assert (usage.account_pct, usage.limit) == (64, RateLimit.ADS_INSIGHTS)
    assert (usage.app_pct, usage.pct) == (93, 93)
    assert (usage.reset_seconds, usage.regain_seconds) == (80, None)

    score = dict(headers, **{"X-Ad-Account-Usage": header({"acc_id_util_pct": 91.5})})
    assert (parse_usage(score).account_pct, parse_usage(score).limit) == (
        91.5, RateLimit.AD_ACCOUNT_SCORE)
    load = dict(headers, **{"X-FB-Ads-Insights-Throttle": header(
        {"app_id_util_pct": 10, "acc_id_util_pct": 97})})
    assert (parse_usage(load).account_pct, parse_usage(load).limit, parse_usage(load).app_pct) == (
        97, RateLimit.ACCOUNT_INSIGHTS_LOAD, 10)



def test_the_apps_readings_are_its_insights_load_and_its_platform_calls_apart() -> None:
    assert app_readings({}) == (None, None)
    assert app_readings({"X-FB-Ads-Insights-Throttle": header(
        {"app_id_util_pct": 81, "acc_id_util_pct": 4})}) == (81, None)
    assert app_readings({"X-App-Usage": header({"call_count": 9, "total_time": 12}),
                         "X-FB-Ads-Insights-Throttle": header({"acc_id_util_pct": 4})}) == (
        None, 12)
    assert app_readings({"X-App-Usage": "not json"}) == (None, None)


@pytest.mark.parametrize("garbage", ["not json", "[1, 2", "", "null", '"text"', "[]",
                                     '{"call_count": "lots"}', '{"call_count": NaN}',
                                     '{"acc_id_util_pct": -5}', '{"call_count": true}'])
def test_garbage_headers_are_ignored(garbage: str) -> None:
    headers = {name: garbage for name in ("X-App-Usage", "X-Ad-Account-Usage",
                                          "X-Business-Use-Case-Usage",
                                          "X-FB-Ads-Insights-Throttle")}
    assert parse_usage(headers) == Usage()


def test_client_tracks_rising_usage(world: FakeWorld, client_for: ClientFactory) -> None:
    client = client_for(page_size=5)
    client.account(BRL)
    first = client.stats.usage.pct
    assert first > 0
    list(client.insights(BRL, date(2026, 2, 1), date(2026, 3, 1)))
    assert client.stats.usage.pct > first
    assert client.stats.api_calls == world.calls["account"] + world.calls["insights"]


def test_usage_is_read_from_error_responses(world: FakeWorld, client_for: ClientFactory) -> None:
    # Half of the account's ads_management hour (100,000 + 40 x its 7 active ads), this
    # refused call included.
    world.use_up(BRL, "ads_management", 50_139)
    world.fail("account", "permission")
    client = client_for()
    with pytest.raises(MetaError):
        client.account(BRL)
    assert client.stats.api_calls == 1
    assert client.stats.usage.pct == 50.0

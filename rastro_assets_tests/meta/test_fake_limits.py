"""The fake Graph's rate limits, each pinned to the facts page's numbers ("Rate limits: what
each one counts, and what binds"): the business-use-case buckets, the ad account score, the
insights load per second, and the platform's `X-App-Usage`."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from rastro_assets_tests.meta.conftest import BASE_URL, TOKEN
from rastro_fake_graph import FakeWorld, MutableClock, handle, serve
from rastro_fake_graph.limits import LimitModel
from rastro_fake_graph.server import add_limit_options, limit_model
from rastro_fake_graph.world import FakeAccount

OTHER_TOKEN = "EAAother-token-for-the-same-app"
ACT = "act_3001"
OTHER_ACT = "act_3002"
DAY = date(2026, 3, 10)
INSIGHTS = {
    "level": "ad", "time_increment": "1", "fields": "ad_id,spend,impressions",
    "time_range": json.dumps({"since": DAY.isoformat(), "until": DAY.isoformat()}),
}


class Seconds:
    """The world's monotonic source, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    def header(self, name: str) -> Any:
        return json.loads(self.headers[name])

    @property
    def code(self) -> tuple[int, int | None]:
        error = self.body["error"]
        return error["code"], error.get("error_subcode")

    @property
    def bucket(self) -> dict[str, Any]:
        (entries,) = self.header("X-Business-Use-Case-Usage").values()
        return entries[0]


def call(world: FakeWorld, method: str, path: str, *, token: str = TOKEN, **params) -> Answer:
    """One request through the fake's request handling, as the in-process transport makes it."""
    url = f"{BASE_URL}/{path}"
    body = b""
    headers = {"Authorization": f"Bearer {token}"}
    if method == "POST":
        body = urlencode(params).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif params:
        url += "?" + urlencode(params)
    answer = handle(world, method, url, headers, body)
    return Answer(answer.status, dict(answer.headers), json.loads(answer.body))


@pytest.fixture
def seconds() -> Seconds:
    return Seconds()


@pytest.fixture
def limited(clock: MutableClock, seconds: Seconds) -> FakeWorld:
    """Two accounts without ads yet, one per token of the same app."""
    world = FakeWorld(clock, seed=11)
    world.monotonic = seconds
    world.add_account(ACT, timezone="UTC", currency="USD", n_ads=0, token=TOKEN)
    world.add_account(OTHER_ACT, timezone="UTC", currency="USD", n_ads=0, token=OTHER_TOKEN)
    return world


def with_ads(world: FakeWorld, act: str, active: int, paused: int = 0) -> FakeAccount:
    for _ in range(active):
        world.add_ad(act, delivers_from=date(2026, 1, 1))
    for _ in range(paused):
        world.add_ad(act, effective_status="PAUSED")
    return world.accounts[act]


# -- business-use-case buckets --------------------------------------------------------------


def test_standard_insights_bucket_is_190000_plus_400_per_active_ad(limited: FakeWorld) -> None:
    with_ads(limited, ACT, active=5, paused=3)
    limited.use_up(ACT, "ads_insights", 190_000 + 400 * 5 - 1)
    last = call(limited, "GET", f"{ACT}/insights", **INSIGHTS)
    assert last.status == 200
    assert last.bucket["type"] == "ads_insights" and last.bucket["call_count"] == 100
    assert last.bucket["ads_api_access_tier"] == "standard_access"

    over = call(limited, "GET", f"{ACT}/insights", **INSIGHTS)
    assert over.status == 400 and over.code == (80000, 2446079)
    assert over.bucket["estimated_time_to_regain_access"] == 60
    # One more active ad allows 400 more calls an hour.
    with_ads(limited, ACT, active=1)
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).status == 200
    # The other account's bucket is its own.
    assert call(limited, "GET", f"{OTHER_ACT}/insights", token=OTHER_TOKEN,
                **INSIGHTS).status == 200


def test_development_insights_bucket_counts_errors_and_frees_as_the_hour_rolls(
    limited: FakeWorld, seconds: Seconds
) -> None:
    limited.limits = LimitModel(tier="development")
    with_ads(limited, ACT, active=2)
    allowed = 600 + 400 * 2
    limited.use_up(ACT, "ads_insights", 700)
    seconds.advance(1800)
    limited.use_up(ACT, "ads_insights", allowed - 700 - 2)
    refused = call(limited, "GET", f"{ACT}/insights", level="ad", fields="ad_id,colour")
    assert refused.status == 400 and refused.code == (100, None)  # an error, and a call
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).status == 200

    over = call(limited, "GET", f"{ACT}/insights", **INSIGHTS)
    assert over.code == (80000, 2446079)
    assert over.bucket["ads_api_access_tier"] == "development_access"
    # The first 700 calls leave the window 30 minutes from now; that frees enough.
    assert over.bucket["estimated_time_to_regain_access"] == 30
    seconds.advance(30 * 60 - 1)
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).code == (80000, 2446079)
    seconds.advance(1)
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).status == 200
    # Development tier takes 0.001 of a call an hour for each user error.
    assert LimitModel(tier="development").insights_calls(2, user_errors=1000) == allowed - 1


@pytest.mark.parametrize(("tier", "base"), [("standard", 100_000), ("development", 300)])
def test_ads_management_bucket_counts_each_id(limited: FakeWorld, tier: str, base: int) -> None:
    limited.limits = LimitModel(tier=tier)
    account = with_ads(limited, ACT, active=1, paused=2)
    allowed = base + 40 * 1
    limited.use_up(ACT, "ads_management", allowed - 4)
    ids = ",".join(sorted(account.ads))
    assert call(limited, "GET", "", ids=ids, fields="id").status == 200
    last = call(limited, "GET", ACT, fields="id")
    # At 100 % the bucket is spent: the next call waits for the hour to roll.
    assert last.status == 200 and last.bucket == {
        "type": "ads_management", "call_count": 100, "total_cputime": 60, "total_time": 100,
        "estimated_time_to_regain_access": 60, "ads_api_access_tier": f"{tier}_access"}
    over = call(limited, "GET", f"{ACT}/ads", fields="id")
    assert over.status == 400 and over.code == (80004, 2446079)
    # Insights are another business use case: not refused by this one.
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).status == 200


# -- the ad account score --------------------------------------------------------------------


@pytest.mark.parametrize(("tier", "maximum", "block", "code"), [
    ("standard", 9_000, 60, (17, 2446079)),
    ("development", 60, 300, (613, 1487742)),
])
def test_score_a_read_costs_1_a_write_3_then_a_block(
    limited: FakeWorld, seconds: Seconds, tier: str, maximum: int, block: int,
    code: tuple[int, int],
) -> None:
    limited.limits = LimitModel(tier=tier)
    for _ in range(maximum - 3):
        assert call(limited, "GET", ACT, fields="id").status == 200
    usage = call(limited, "POST", f"{ACT}/insights", **INSIGHTS)  # an async report: a write
    assert usage.status == 200
    assert usage.header("X-Ad-Account-Usage") == {
        "acc_id_util_pct": 100.0, "reset_time_duration": 300,
        "ads_api_access_tier": f"{tier}_access"}

    refused = call(limited, "GET", ACT, fields="id")
    assert refused.status == 400 and refused.code == code
    assert refused.header("X-Ad-Account-Usage")["reset_time_duration"] == block
    seconds.advance(block - 1)
    still = call(limited, "GET", f"{ACT}/insights", **INSIGHTS)
    assert still.code == code
    assert still.header("X-Ad-Account-Usage")["acc_id_util_pct"] == 100.0
    # The other account keeps its own score.
    assert call(limited, "GET", OTHER_ACT, token=OTHER_TOKEN, fields="id").status == 200
    seconds.advance(1)
    after = call(limited, "GET", ACT, fields="id")
    assert after.status == 200
    assert after.header("X-Ad-Account-Usage")["acc_id_util_pct"] == round(100 / maximum, 2)


def test_score_decays_over_300_seconds(limited: FakeWorld, seconds: Seconds) -> None:
    limited.limits = LimitModel(tier="development")

    def score() -> dict[str, Any]:
        return call(limited, "GET", ACT, fields="id").header("X-Ad-Account-Usage")

    for _ in range(29):
        score()
    seconds.advance(100)
    assert score() == {"acc_id_util_pct": 50.0, "reset_time_duration": 300,
                       "ads_api_access_tier": "development_access"}
    seconds.advance(199)
    assert score()["acc_id_util_pct"] == round(100 * 31 / 60, 2)
    seconds.advance(1)  # the first 29 points, 300 s old, are gone
    assert score() == {"acc_id_util_pct": 5.0, "reset_time_duration": 300,
                       "ads_api_access_tier": "development_access"}


# -- the insights load per second ------------------------------------------------------------


def load_units(answer: Answer) -> float:
    """What an insights answer weighs: 1, and 1 for each 100 row-fields it returns."""
    return 1 + sum(len(row) for row in answer.body.get("data", [])) / 100


def test_app_load_is_shared_by_every_token_and_recovers_within_a_second(
    limited: FakeWorld, seconds: Seconds
) -> None:
    with_ads(limited, ACT, active=10)
    with_ads(limited, OTHER_ACT, active=10)
    capacity = 20.0
    limited.limits = LimitModel(app_insights_load=capacity)
    first = call(limited, "GET", f"{ACT}/insights", **INSIGHTS, limit="10")
    second = call(limited, "GET", f"{OTHER_ACT}/insights", token=OTHER_TOKEN, **INSIGHTS,
                  limit="10")
    spent = load_units(first) + load_units(second)
    assert load_units(first) > 1.1
    throttle = second.header("X-FB-Ads-Insights-Throttle")
    assert throttle == {"app_id_util_pct": round(100 * spent / capacity, 2),
                        "acc_id_util_pct": round(100 * load_units(second) / 20_000, 2),
                        "ads_api_access_tier": "standard_access"}
    tokens = [TOKEN, OTHER_TOKEN]
    answers = [second]
    while answers[-1].status == 200:
        token = tokens[len(answers) % 2]
        answers.append(call(limited, "GET", f"{ACT if token == TOKEN else OTHER_ACT}/insights",
                            token=token, **INSIGHTS, limit="10"))
    assert answers[-2].header("X-FB-Ads-Insights-Throttle")["app_id_util_pct"] >= 100
    assert answers[-1].code == (4, 1504022)
    # The account calls are no insights calls: the app's load does not refuse them.
    assert call(limited, "GET", ACT, fields="id").status == 200
    seconds.advance(1)
    again = call(limited, "GET", f"{ACT}/insights", **INSIGHTS, limit="10")
    assert again.status == 200
    assert again.header("X-FB-Ads-Insights-Throttle")["app_id_util_pct"] == round(
        100 * load_units(again) / capacity, 2)


def test_account_load_refuses_that_account_alone(limited: FakeWorld, seconds: Seconds) -> None:
    with_ads(limited, ACT, active=10)
    with_ads(limited, OTHER_ACT, active=10)
    limited.limits = LimitModel(account_insights_load=10.0)
    answers = [call(limited, "GET", f"{ACT}/insights", **INSIGHTS)]
    while answers[-1].status == 200:
        answers.append(call(limited, "GET", f"{ACT}/insights", **INSIGHTS))
    assert answers[-2].header("X-FB-Ads-Insights-Throttle")["acc_id_util_pct"] >= 100
    assert answers[-1].code == (4, 1504039)
    assert call(limited, "GET", f"{OTHER_ACT}/insights", token=OTHER_TOKEN,
                **INSIGHTS).status == 200
    seconds.advance(1)
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).status == 200


def test_app_load_over_real_sockets(limited: FakeWorld) -> None:
    with_ads(limited, ACT, active=10)
    limited.limits = LimitModel(app_insights_load=5.0)
    with serve(limited) as server, httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as http:
        answers = [http.get(f"/{ACT}/insights", params=INSIGHTS) for _ in range(6)]
    assert answers[0].status_code == 200
    assert json.loads(answers[0].headers["X-FB-Ads-Insights-Throttle"])["app_id_util_pct"] > 0
    refused = answers[-1].json()["error"]
    assert (refused["code"], refused["error_subcode"]) == (4, 1504022)


# -- the platform's app-wide calls -----------------------------------------------------------


def test_app_usage_only_on_platform_calls(limited: FakeWorld, seconds: Seconds) -> None:
    with_ads(limited, ACT, active=2)
    limited.limits = LimitModel(daily_active_users=1)
    me = call(limited, "GET", "me")
    assert me.header("X-App-Usage") == {"call_count": 0, "total_time": 0, "total_cputime": 0}
    assert "X-Ad-Account-Usage" not in me.headers
    listing = call(limited, "GET", "me/adaccounts", token=OTHER_TOKEN)
    assert listing.header("X-App-Usage")["call_count"] == 1  # 2 of 200, every token together
    for path in (ACT, f"{ACT}/ads", f"{ACT}/insights"):
        answer = call(limited, "GET", path, **(INSIGHTS if path.endswith("insights") else {}))
        assert answer.status == 200 and "X-App-Usage" not in answer.headers
        assert "X-Business-Use-Case-Usage" in answer.headers
    for _ in range(198):
        last = call(limited, "GET", "me")
    assert last.header("X-App-Usage")["call_count"] == 100
    over = call(limited, "GET", "me/adaccounts")
    assert over.status == 400 and over.code == (4, None)
    assert call(limited, "GET", f"{ACT}/insights", **INSIGHTS).status == 200
    seconds.advance(3600)
    assert call(limited, "GET", "me").status == 200


# -- staged throttles, switches, the model ---------------------------------------------------


def test_staged_throttle_reports_its_account_at_the_limit(limited: FakeWorld) -> None:
    limited.fail("insights", "throttled", regain_minutes=7)
    staged = call(limited, "GET", f"{ACT}/insights", **INSIGHTS)
    assert staged.code == (80000, 2446079)
    assert staged.bucket["call_count"] == 100
    assert staged.bucket["estimated_time_to_regain_access"] == 7
    assert staged.header("X-Ad-Account-Usage")["reset_time_duration"] == 7 * 60
    assert staged.header("X-FB-Ads-Insights-Throttle")["app_id_util_pct"] < 100
    for error, code, app_pct in (("throttled_4", (4, None), 100),
                                 ("throttled_4_1504022", (4, 1504022), 100),
                                 ("throttled_4_1504039", (4, 1504039), 0),
                                 ("throttled_613_1487742", (613, 1487742), 0)):
        limited.fail("insights", error)
        answer = call(limited, "GET", f"{ACT}/insights", **INSIGHTS)
        assert answer.code == code
        throttle = answer.header("X-FB-Ads-Insights-Throttle")
        assert (throttle["app_id_util_pct"] >= 100) == (app_pct == 100)
        assert throttle["acc_id_util_pct"] == 100


def test_a_limit_switched_off_refuses_nothing(limited: FakeWorld) -> None:
    limited.limits = LimitModel(tier="development", off=frozenset({"ad_account_score"}))
    answers = [call(limited, "GET", ACT, fields="id") for _ in range(61)]
    assert {a.status for a in answers} == {200}
    assert answers[-1].header("X-Ad-Account-Usage")["acc_id_util_pct"] > 100


def test_limit_model_from_the_command_line_and_its_summary() -> None:
    parser = argparse.ArgumentParser()
    add_limit_options(parser)
    model = limit_model(parser.parse_args(
        ["--tier", "development", "--app-insights-load", "250", "--daily-active-users", "3",
         "--limit-off", "ads_management"]))
    assert model == LimitModel(tier="development", app_insights_load=250.0,
                               daily_active_users=3, off=frozenset({"ads_management"}))
    assert model.describe() == (
        "development tier; ads_insights 600 + 400 x active ads an hour; ads_management 300 + 40"
        " x active ads an hour; score 60 per 300 s (block 300 s); insights load 250/s app,"
        " 20,000/s account; platform 600 calls an hour; off: ads_management")
    assert limit_model(parser.parse_args([])) == LimitModel()
    with pytest.raises(ValueError, match="unknown limits"):
        LimitModel(off=frozenset({"everything"}))
    with pytest.raises(ValueError, match="tier"):
        LimitModel(tier="gold")

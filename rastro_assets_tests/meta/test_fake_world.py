"""The fake Graph's own rules: determinism, delivery over time, shapes, jobs, usage."""

from __future__ import annotations

import json
import struct
import zlib
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import httpx
import pytest

from rastro_assets.timekeeping import zone
from rastro_assets_tests.meta.conftest import BASE_URL, BRL, INSTANT, JPY, TOKEN
from rastro_fake_graph import DEMO_TOKEN, FakeGraphTransport, FakeWorld, MutableClock
from rastro_fake_graph.app import parse_fields
from rastro_fake_graph.images import png
from rastro_fake_graph.world import DEMO_UNLINKED, SETTLE_DAYS

INSIGHTS_PARAMS = {
    "level": "ad", "time_increment": "1",
    "fields": "ad_id,spend,impressions,clicks,actions,date_start,date_stop",
}


def graph(world: FakeWorld, method: str, path: str, *, token: str = TOKEN,
          **params) -> httpx.Response:
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        headers = {"Authorization": f"Bearer {token}"}
        if method == "POST":
            return http.post(f"{BASE_URL}/{path}", data=params, headers=headers)
        return http.get(f"{BASE_URL}/{path}", params=params, headers=headers)


def time_range(since: date, until: date) -> str:
    return json.dumps({"since": since.isoformat(), "until": until.isoformat()})


def test_same_seed_and_clock_same_world() -> None:
    clock = MutableClock(INSTANT)
    a, b = FakeWorld.demo(clock), FakeWorld.demo(clock)
    day = date(2026, 2, 10)
    assert a.truth("act_1002", day) == b.truth("act_1002", day)
    assert a.thumbnail_bytes("1202110020003") == b.thumbnail_bytes("1202110020003")
    other = FakeWorld(clock, seed=1)
    other.add_account("act_1002", timezone="Asia/Tokyo", currency="JPY",
                      first_day=date(2026, 1, 1))
    assert other.truth("act_1002", day) != a.truth("act_1002", day)


def test_demo_world_shape() -> None:
    world = FakeWorld.demo(MutableClock(INSTANT))
    assert {(a.ad_account_id, a.timezone, a.currency) for a in world.accounts.values()} == {
        ("act_1001", "America/Sao_Paulo", "BRL"), ("act_1002", "Asia/Tokyo", "JPY"),
        ("act_1003", "America/Los_Angeles", "USD"), ("act_1004", "Europe/Berlin", "EUR"),
        ("act_1005", "Asia/Kolkata", "INR"), ("act_1006", "Australia/Sydney", "AUD"),
        ("act_1007", "Pacific/Auckland", "NZD"), ("act_1008", "Asia/Seoul", "KRW")}
    for account in world.accounts.values():
        assert len(account.ads) == 20
        assert world.can_read(DEMO_TOKEN, account.ad_account_id)
    assert [a.ad_account_id for a in world.reachable(DEMO_TOKEN)] == sorted(world.accounts)


def test_the_demo_worlds_unlinked_accounts_deliver_in_their_own_zone_and_currency() -> None:
    world = FakeWorld.demo(MutableClock(INSTANT))
    offsets = {
        act: zone(world.accounts[act].timezone).utcoffset(INSTANT.replace(tzinfo=None))
        for act in DEMO_UNLINKED
    }
    assert any(offset.seconds % 3600 for offset in offsets.values())  # a half-hour zone
    assert max(offsets.values()) > timedelta(hours=10)
    for act in DEMO_UNLINKED:
        day = world.today(act) - timedelta(days=10)
        rows = world.truth(act, day)
        assert rows and sum(row.spend for row in rows) > 0
    [won] = [act for act in DEMO_UNLINKED if world.accounts[act].currency == "KRW"]
    assert all(row.spend == row.spend.to_integral_value()
               for row in world.truth(won, world.today(won) - timedelta(days=10)))


def test_no_figures_for_future_days(world: FakeWorld) -> None:
    assert world.truth(BRL, world.today(BRL) + timedelta(days=1)) == []
    assert world.today(JPY) == date(2026, 3, 16)  # 03:00 in Tokyo
    assert world.today(BRL) == date(2026, 3, 15)


def test_today_grows_through_the_local_day(world: FakeWorld, clock: MutableClock) -> None:
    day = date(2026, 3, 15)
    clock.set(datetime(2026, 3, 15, 11, 0, tzinfo=UTC))  # 08:00 in Sao Paulo
    morning = {r.ad_id: r.spend for r in world.truth(BRL, day)}
    clock.set(datetime(2026, 3, 15, 23, 0, tzinfo=UTC))  # 20:00
    evening = {r.ad_id: r.spend for r in world.truth(BRL, day)}
    assert morning and set(morning) <= set(evening)
    assert all(evening[ad] >= spend for ad, spend in morning.items())
    assert sum(evening.values()) > sum(morning.values())


def test_figures_settle_for_28_days_then_hold(world: FakeWorld, clock: MutableClock) -> None:
    day = date(2026, 3, 1)
    seen = []
    for age in (2, 10, SETTLE_DAYS, SETTLE_DAYS + 1, SETTLE_DAYS + 5, 200):
        clock.set(datetime(2026, 3, 1, 18, 0, tzinfo=UTC) + timedelta(days=age))
        seen.append({(r.ad_id, r.spend) for r in world.truth(BRL, day)})
    assert seen[0] != seen[1] != seen[2]
    assert seen[3] == seen[4] == seen[5]


def test_some_ad_days_vanish_when_older(world: FakeWorld, clock: MutableClock) -> None:
    days = [date(2026, 2, 1) + timedelta(days=n) for n in range(40)]
    young = {}
    for day in days:
        clock.set(datetime(day.year, day.month, day.day, 20, tzinfo=UTC))
        young[day] = {r.ad_id for r in world.truth(BRL, day)}
    clock.set(datetime(2026, 6, 1, tzinfo=UTC))
    old = {day: {r.ad_id for r in world.truth(BRL, day)} for day in days}
    assert all(old[day] <= young[day] for day in days)
    assert any(old[day] < young[day] for day in days)


def test_set_ad_day_overrides_and_removes(world: FakeWorld) -> None:
    ad = sorted(world.accounts[BRL].ads)[0]
    day = date(2026, 2, 3)
    world.set_ad_day(BRL, ad, day, {"spend": "1.50", "impressions": 3, "clicks": 0})
    row = next(r for r in world.truth(BRL, day) if r.ad_id == ad)
    assert (row.spend, row.impressions, row.clicks, row.conversations) == (
        Decimal("1.50"), 3, 0, 0)
    world.set_ad_day(BRL, ad, day, None)
    assert ad not in {r.ad_id for r in world.truth(BRL, day)}


def test_insights_filter_decides_deleted_and_archived(world: FakeWorld) -> None:
    since, until = date(2026, 1, 1), date(2026, 1, 31)
    hidden = {ad.ad_id for ad in world.accounts[BRL].ads.values()
              if ad.effective_status in ("DELETED", "ARCHIVED")}
    plain = graph(world, "GET", f"{BRL}/insights", **INSIGHTS_PARAMS, limit=500,
                  time_range=time_range(since, until)).json()
    assert hidden.isdisjoint({row["ad_id"] for row in plain["data"]})
    filtered = graph(world, "GET", f"{BRL}/insights", **INSIGHTS_PARAMS, limit=500,
                     time_range=time_range(since, until),
                     filtering=json.dumps([{"field": "ad.effective_status", "operator": "IN",
                                            "value": ["DELETED", "ARCHIVED"]}])).json()
    assert {row["ad_id"] for row in filtered["data"]} == hidden


def test_insights_row_shape(world: FakeWorld) -> None:
    body = graph(world, "GET", f"{JPY}/insights", **INSIGHTS_PARAMS, limit=500,
                 time_range=time_range(date(2026, 3, 1), date(2026, 3, 10))).json()
    row = body["data"][0]
    assert set(row) <= {"ad_id", "spend", "impressions", "clicks", "actions", "date_start",
                        "date_stop"}
    assert all(isinstance(row[k], str) for k in ("spend", "impressions", "clicks"))
    assert row["date_start"] == row["date_stop"]
    assert "." not in row["spend"]
    assert any(a["action_type"] == "onsite_conversion.messaging_conversation_started_7d"
               for r in body["data"] for a in r.get("actions", []))


def test_paging_shape(world: FakeWorld) -> None:
    params = dict(INSIGHTS_PARAMS, time_range=time_range(date(2026, 3, 1), date(2026, 3, 3)))
    pages, after = [], None
    while True:
        extra = {"after": after} if after else {}
        body = graph(world, "GET", f"{BRL}/insights", **params, limit=4, **extra).json()
        pages.append(body)
        assert len(body["data"]) <= 4
        assert body["paging"]["cursors"]["after"]
        if "next" not in body["paging"]:
            break
        assert body["paging"]["next"].startswith(f"{BASE_URL}/{BRL}/insights?")
        after = body["paging"]["cursors"]["after"]
    assert any(len(p["data"]) < 4 for p in pages[:-1]), "some pages are short"
    empty = graph(world, "GET", f"{BRL}/insights", **INSIGHTS_PARAMS,
                  time_range=time_range(date(2027, 1, 1), date(2027, 1, 2))).json()
    assert empty == {"data": []}
    bad = graph(world, "GET", f"{BRL}/insights", **params, after="bm9wZQ")
    assert bad.status_code == 400


def test_row_cap_and_async_job_lifecycle(world: FakeWorld) -> None:
    world.row_cap = 2
    params = dict(INSIGHTS_PARAMS, time_range=time_range(date(2026, 3, 1), date(2026, 3, 1)))
    capped = graph(world, "GET", f"{BRL}/insights", **params)
    assert capped.status_code == 500
    assert capped.json()["error"]["code"] == 1
    assert "reduce the amount of data" in capped.json()["error"]["message"]

    run_id = graph(world, "POST", f"{BRL}/insights", **params).json()["report_run_id"]
    assert graph(world, "GET", f"{run_id}/insights").status_code == 400
    statuses = [graph(world, "GET", run_id).json()["async_status"] for _ in range(4)]
    assert statuses == ["Job Not Started", "Job Running", "Job Completed", "Job Completed"]
    rows = graph(world, "GET", f"{run_id}/insights", limit=500).json()["data"]
    assert len(rows) > 2
    assert graph(world, "GET", run_id, token="EAAstranger").status_code == 400


def test_rate_limit_headers_rise_with_use(world: FakeWorld) -> None:
    def account_pct(response: httpx.Response) -> float:
        return json.loads(response.headers["X-Ad-Account-Usage"])["acc_id_util_pct"]

    first = graph(world, "GET", BRL, fields="name")
    for _ in range(20):
        last = graph(world, "GET", BRL, fields="name")
    assert account_pct(last) > account_pct(first)
    insights = graph(world, "GET", f"{BRL}/insights", **INSIGHTS_PARAMS)
    for name in ("X-Ad-Account-Usage", "X-Business-Use-Case-Usage",
                 "X-FB-Ads-Insights-Throttle"):
        json.loads(insights.headers[name])
    error = graph(world, "GET", BRL, token="EAAnobody")
    assert error.status_code == 400 and "X-Ad-Account-Usage" in error.headers
    me = graph(world, "GET", "me")
    assert "X-FB-Ads-Insights-Throttle" not in me.headers
    json.loads(me.headers["X-App-Usage"])


def test_retention_limit(world: FakeWorld) -> None:
    response = graph(world, "GET", f"{BRL}/insights", **INSIGHTS_PARAMS,
                     time_range=time_range(date(2022, 1, 1), date(2022, 1, 2)))
    assert response.json()["error"]["code"] == 3018


def test_unknown_field_and_status_are_refused(world: FakeWorld) -> None:
    assert graph(world, "GET", f"{BRL}/ads", fields="id,colour").status_code == 400
    assert graph(world, "GET", f"{BRL}/ads", fields="id",
                 effective_status='["SLEEPING"]').status_code == 400


def test_field_syntax() -> None:
    fields = parse_fields("id,adset{name},creative.thumbnail_width(300).thumbnail_height(200)"
                          "{thumbnail_url,object_story_spec}")
    assert set(fields) == {"id", "adset", "creative"}
    assert fields["creative"].modifiers == {"thumbnail_width": "300", "thumbnail_height": "200"}
    assert set(fields["creative"].children or {}) == {"thumbnail_url", "object_story_spec"}


def test_sized_thumbnails(world: FakeWorld) -> None:
    body = graph(world, "GET", f"{BRL}/ads", limit=1,
                 fields="id,creative.thumbnail_width(300).thumbnail_height(200){thumbnail_url}"
                 ).json()
    url = body["data"][0]["creative"]["thumbnail_url"]
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        image = http.get(url).content
    assert int.from_bytes(image[16:20], "big") == 300
    assert int.from_bytes(image[20:24], "big") == 200


def test_fail_validates_its_arguments(world: FakeWorld) -> None:
    with pytest.raises(ValueError):
        world.fail("nowhere", "token")
    with pytest.raises(ValueError):
        world.fail("ads", "no-such-error")
    with pytest.raises(ValueError):
        world.fail("ads", "job_failed")


def test_png_is_valid() -> None:
    data = png(5, 3, (1, 2, 3), (200, 100, 50))
    offset = 8
    kinds = []
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind = data[offset + 4:offset + 8]
        payload = data[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length:offset + 12 + length])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF
        if kind == b"IDAT":
            assert len(zlib.decompress(payload)) == 3 * (1 + 5 * 3)
        kinds.append(kind)
        offset += 12 + length
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]

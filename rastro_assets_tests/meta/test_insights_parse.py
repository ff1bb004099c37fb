"""Meta's JSON rows into typed rows: exact money, strict counts, one day per row."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal

import pytest

from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.insights_parse import parse_insight_row

DAY = date(2026, 3, 1)
MESSAGING = "onsite_conversion.messaging_conversation_started_7d"


def row(**overrides):
    base = {"ad_id": "120", "spend": "14.35", "impressions": "185", "clicks": "9",
            "date_start": "2026-03-01", "date_stop": "2026-03-01", "ad_name": "Ação ☀️"}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def test_row_parses_exactly() -> None:
    parsed = parse_insight_row(row(actions=[
        {"action_type": "link_click", "value": "9"},
        {"action_type": MESSAGING, "value": "3"}]), DAY, DAY)
    assert parsed.spend == Decimal("14.35") and str(parsed.spend) == "14.35"
    assert (parsed.impressions, parsed.clicks, parsed.conversations) == (185, 9, 3)
    assert parsed.day == DAY and parsed.ad_name == "Ação ☀️"


@pytest.mark.parametrize("spend", ["1234", "0", "0.01", "99999999.99", 15])
def test_spend_strings(spend) -> None:
    assert parse_insight_row(row(spend=spend), DAY, DAY).spend == Decimal(str(spend))


def test_spend_from_a_json_number_stays_exact() -> None:
    body = json.loads('{"spend": 14.35}', parse_float=Decimal)
    assert parse_insight_row(row(spend=body["spend"]), DAY, DAY).spend == Decimal("14.35")


@pytest.mark.parametrize("spend", ["NaN", "inf", "-Infinity", "abc", "", "1,5", True, [], {}])
def test_bad_spend_is_malformed(spend) -> None:
    with pytest.raises(MalformedResponse):
        parse_insight_row(row(spend=spend), DAY, DAY)


@pytest.mark.parametrize(("value", "expected"), [("3", 3), ("3.0", 3), (4, 4), ("0", 0)])
def test_conversation_values(value, expected) -> None:
    parsed = parse_insight_row(row(actions=[{"action_type": MESSAGING, "value": value}]),
                               DAY, DAY)
    assert parsed.conversations == expected


@pytest.mark.parametrize("value", ["2.5", "x", None, "-1"])
def test_bad_conversation_values(value) -> None:
    with pytest.raises(MalformedResponse):
        parse_insight_row(row(actions=[{"action_type": MESSAGING, "value": value}]), DAY, DAY)


def test_absent_actions_and_counts_are_zero() -> None:
    parsed = parse_insight_row(row(impressions=None, clicks=None), DAY, DAY)
    assert (parsed.impressions, parsed.clicks, parsed.conversations) == (0, 0, 0)


@pytest.mark.parametrize("bad", [
    {"ad_id": None}, {"spend": None}, {"date_stop": "2026-03-02"},
    {"date_start": "2026-02-28", "date_stop": "2026-02-28"}, {"date_start": "yesterday"},
    {"impressions": "1.5"}, {"clicks": "-3"}, {"impressions": "1e400"},
    {"actions": "lots"},
])
def test_malformed_rows(bad) -> None:
    with pytest.raises(MalformedResponse):
        parse_insight_row(row(**bad), DAY, DAY)


def test_row_must_be_an_object() -> None:
    with pytest.raises(MalformedResponse):
        parse_insight_row(["120"], DAY, DAY)

"""The checked per-row reference: `parse_insight_table` reads a page `json.loads` decoded
row by row through `parse_insight_row`, and states the rules for the spellings the byte
reader (`test_insights_parse_bytes.py`) leaves to it."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rastro_assets.meta import insights_parse
from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.insights_parse import parse_insight_row, parse_insight_table
from rastro_assets.meta.models import INSIGHT_SCHEMA
from rastro_assets_tests.meta.insight_pages import (
    MESSAGING,
    PLAIN_PAGE,
    SINCE,
    UNTIL,
    assert_same_table,
    odd_rows,
    one_by_one,
    plain_rows,
    rows,
)


def reference(page):
    try:
        return parse_insight_table(page, SINCE, UNTIL)
    except MalformedResponse as exc:
        return f"MalformedResponse: {exc}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(plain_rows(), odd_rows(), rows()), max_size=5))
def test_a_page_is_its_rows_in_order_or_the_first_refusal(page) -> None:
    assert_same_table(reference(page), one_by_one(page))


@settings(max_examples=200, deadline=None)
@given(st.lists(plain_rows(), max_size=5))
def test_plain_rows_read_to_their_fields(page) -> None:
    """What a row as Meta sends it means, stated without the reference's code."""

    def count(raw: dict, key: str) -> int:
        return int(raw.get(key, "0"))

    expected = [
        {
            "ad_id": raw["ad_id"],
            "day": date.fromisoformat(raw["date_start"]),
            "spend": Decimal(raw["spend"]),
            "impressions": count(raw, "impressions"),
            "clicks": count(raw, "clicks"),
            "conversations": sum(int(action["value"]) for action in raw.get("actions", ())
                                 if action["action_type"] == MESSAGING),
            **{name: raw.get(name) or None for name in INSIGHT_SCHEMA.names[6:]},
        }
        for raw in page
    ]
    if any(row["conversations"] > 2**63 - 1 for row in expected):
        assert "64-bit" in reference(page)
        return
    assert reference(page).to_pylist() == expected


def test_a_plain_page_reads_to_these_values() -> None:
    table = parse_insight_table(PLAIN_PAGE, SINCE, UNTIL)
    assert table.schema.equals(INSIGHT_SCHEMA)
    assert table.to_pylist() == [
        {"ad_id": "120", "day": date(2026, 3, 2), "spend": Decimal("14.3000"),
         "impressions": 185, "clicks": 9, "conversations": 5, "ad_name": "Ação ☀️",
         "adset_id": None, "adset_name": None, "campaign_id": None, "campaign_name": None},
        {"ad_id": "121", "day": date(2026, 3, 3), "spend": Decimal("-0.5000"),
         "impressions": 0, "clicks": 0, "conversations": 0, "ad_name": None,
         "adset_id": None, "adset_name": None, "campaign_id": None, "campaign_name": None},
    ]
    assert parse_insight_table([], SINCE, UNTIL).equals(INSIGHT_SCHEMA.empty_table())


REFUSED = "refused"

# Spellings the byte reader leaves to the reference, and what the reference makes of
# each in the second row of `PLAIN_PAGE`: the field's value, or (REFUSED, the words).
RULES = [
    ("spend", "1.", Decimal("1")),
    ("spend", ".5", Decimal("0.5")),
    ("spend", "+1", Decimal("1")),
    ("spend", "1e3", Decimal("1000")),
    ("spend", " 1", Decimal("1")),
    ("spend", "1\n", Decimal("1")),
    ("spend", "١", Decimal("1")),
    ("spend", "0000000000000001.5", Decimal("1.5")),
    ("spend", 15, Decimal("15")),
    ("spend", Decimal("1.5"), Decimal("1.5")),
    ("spend", "1.23456", (REFUSED, "spend with more than 4 decimal places")),
    ("spend", "100000000000000", (REFUSED, "spend too large for DECIMAL(18,4)")),
    ("spend", "", (REFUSED, "non-numeric spend")),
    ("spend", "NaN", (REFUSED, "non-numeric spend")),
    ("spend", None, (REFUSED, "has no 'spend'")),
    ("impressions", "1\n", 1),
    ("impressions", " 1", 1),
    ("impressions", "1.0", 1),
    ("impressions", "1e3", 1000),
    ("impressions", "١٢", 12),
    ("impressions", 5, 5),
    ("impressions", None, 0),
    ("impressions", "", (REFUSED, "'impressions' that is not a whole count")),
    ("impressions", "-1", (REFUSED, "'impressions' that is not a whole count")),
    ("impressions", "²", (REFUSED, "'impressions' that is not a whole count")),
    ("impressions", "9223372036854775808", (REFUSED, "'impressions' too large for a 64-bit")),
    ("clicks", "9" * 25, (REFUSED, "'clicks' that is not a whole count")),
    ("actions", [{}], 0),
    ("actions", [{"value": "3"}], 0),
    ("actions", [{"action_type": "link_click", "value": 7}], 0),
    ("actions", [{"action_type": MESSAGING, "value": "2.0"}], 2),
    ("actions", [[]], (REFUSED, "an action that is not an object")),
    ("actions", [None], (REFUSED, "an action that is not an object")),
    ("actions", "lots", (REFUSED, "'actions' that is not a list")),
    ("actions", [{"action_type": MESSAGING}],
     (REFUSED, "messaging conversation count that is not a whole number: None")),
    ("actions", [{"action_type": MESSAGING, "value": "9223372036854775807"}] * 2,
     (REFUSED, "more messaging conversations than a 64-bit integer holds")),
    ("ad_name", "\ud83d", "\ufffd"),
    ("ad_name", 5, None),
    ("ad_name", "", None),
    ("ad_id", 122, "122"),
    ("ad_id", "", (REFUSED, "an insights row has no 'ad_id'")),
    ("ad_id", True, (REFUSED, "an insights row has no 'ad_id'")),
    ("ad_id", "\ud83d", (REFUSED, "an 'ad_id' that is not valid text")),
    ("date_start", "2026-03-04", (REFUSED, "dated 2026-03-04, outside the asked")),
    ("date_start", None, (REFUSED, "has no 'date_start'")),
    ("date_stop", "2026-03-02", (REFUSED, "time_increment=1 rows must cover one day")),
]
COLUMN = {"spend": "spend", "impressions": "impressions", "clicks": "clicks",
          "actions": "conversations", "ad_name": "ad_name", "ad_id": "ad_id"}


@pytest.mark.parametrize(("key", "value", "expected"), RULES)
def test_the_reference_rules(key, value, expected) -> None:
    row = {**PLAIN_PAGE[1], key: value}
    if key == "date_start":
        row["date_stop"] = value
    got = reference([PLAIN_PAGE[0], row])
    if isinstance(expected, tuple):
        assert got.startswith("MalformedResponse: "), got
        assert expected[1] in got
        assert "insights row for ad 121" in got or "an insights row" in got
        return
    assert got.to_pylist()[1][COLUMN[key]] == expected


def test_the_reference_reads_each_row_once_in_order(monkeypatch) -> None:
    read: list[object] = []

    def counted(raw, since, until):
        read.append(raw)
        return parse_insight_row(raw, since, until)

    monkeypatch.setattr(insights_parse, "parse_insight_row", counted)
    odd = {**PLAIN_PAGE[1], "ad_id": 122, "spend": " 2", "ad_name": "Promo\ud83d"}
    table = parse_insight_table([*PLAIN_PAGE, odd], SINCE, UNTIL)
    assert read == [*PLAIN_PAGE, odd]  # the whole page, in order, once
    last = table.to_pylist()[-1]
    assert (last["ad_id"], last["spend"], last["ad_name"]) == ("122", Decimal("2"), "Promo\ufffd")
    assert table.slice(0, 2).equals(parse_insight_table(PLAIN_PAGE, SINCE, UNTIL))


def test_a_page_is_refused_with_its_first_bad_row_named() -> None:
    page = [PLAIN_PAGE[0], {**PLAIN_PAGE[1], "spend": "1.23456"},
            {**PLAIN_PAGE[1], "ad_id": "122", "impressions": "-1"}]
    refusal = reference(page)
    assert refusal == one_by_one(page)
    assert "insights row for ad 121" in refusal and "more than 4 decimal places" in refusal


def test_the_reference_reads_any_iterable_of_rows() -> None:
    got = parse_insight_table(iter(PLAIN_PAGE), SINCE, UNTIL)
    assert got.equals(parse_insight_table(PLAIN_PAGE, SINCE, UNTIL))


def test_a_row_that_is_not_an_object_is_refused() -> None:
    assert reference([PLAIN_PAGE[0], ["x"]]) == (
        "MalformedResponse: an insights row is not an object"
    )

"""`parse_insight_table` (Arrow in bulk, else the checked per-row reference
`parse_insight_row`) answers exactly as `parse_insight_row` does, errors included."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from rastro_assets.meta import insights_parse
from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.insights_parse import parse_insight_row, parse_insight_table
from rastro_assets.meta.models import INSIGHT_SCHEMA, insight_table

SINCE, UNTIL = date(2026, 3, 1), date(2026, 3, 3)
MESSAGING = "onsite_conversion.messaging_conversation_started_7d"

counts = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.sampled_from(["0", "007", "1.0", "2.5", "-3", "", " 4 ", "1e3", "١٢", "²", "1_000",
                     "9" * 18, "9" * 19, "9" * 25]),
    st.integers(min_value=-5, max_value=10**20),
    st.sampled_from([None, True, 1.5, [], {}]),
)
spends = st.one_of(
    st.decimals(min_value=0, max_value=10**9, places=2, allow_nan=False).map(str),
    st.sampled_from(["14.35", "0", " 1.5", "NaN", "inf", "abc", "", "1,5", "1_000.5", "1e3"]),
    st.sampled_from([15, Decimal("14.35"), True, None, [], 1.5]),
)
days = st.sampled_from(["2026-03-01", "2026-03-02", "2026-03-03", "2026-02-28", "2026-03-04",
                        "20260302", "yesterday", None, 20260301])
texts = st.one_of(st.none(), st.text(max_size=6), st.integers(), st.just(""))
actions = st.one_of(
    st.none(),
    st.just("lots"),
    st.lists(
        st.one_of(
            st.fixed_dictionaries({
                "action_type": st.sampled_from([MESSAGING, "link_click"]),
                "value": counts,
            }),
            st.just("not an action"),
            st.just({"action_type": MESSAGING}),
        ),
        max_size=4,
    ),
)


@st.composite
def rows(draw):
    row = {
        "ad_id": draw(st.one_of(st.just("120"), st.just(""), st.integers(0, 9), st.none())),
        "date_start": draw(days),
        "spend": draw(spends),
        "impressions": draw(counts),
        "clicks": draw(counts),
        "actions": draw(actions),
        "ad_name": draw(texts),
        "adset_id": draw(texts),
        "adset_name": draw(texts),
        "campaign_id": draw(texts),
        "campaign_name": draw(texts),
    }
    row["date_stop"] = draw(st.one_of(st.just(row["date_start"]), days))
    for key in list(row):
        if draw(st.integers(0, 9)) == 0:
            del row[key]
    return row if draw(st.integers(0, 30)) else ["not", "a", "row"]


def one_by_one(page):
    try:
        return [parse_insight_row(raw, SINCE, UNTIL) for raw in page]
    except MalformedResponse as exc:
        return f"MalformedResponse: {exc}"


# Rows as Meta sends them, with values at the edges the columnar parser must
# read exactly as `parse_insight_row` does; `odd_rows` then spoils one field
# in a way it must leave to the per-row path.
plain_spends = st.one_of(
    st.decimals(min_value=-10**14 + 1, max_value=10**14 - 1, places=4).map(str),
    st.decimals(min_value=0, max_value=10**4, places=2).map(str),
    st.sampled_from(["0", "-0", "-0.00", "0.0000", "99999999999999.9999",
                     "-99999999999999.9999", "007.50"]),
)
plain_counts = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.sampled_from(["0", "007", "9223372036854775807", "0000000000000000000001"]),
)
odd_counts = st.sampled_from(["", "1\n", "١٢", "9223372036854775808", "9" * 19, "9" * 25, "-1",
                              "1.0", " 1", 5, None])
plain_texts = st.sampled_from(["Ad 1", "Promoção ☀️", "", None, "x"])
plain_actions = st.lists(
    st.fixed_dictionaries(
        {"action_type": st.sampled_from([MESSAGING, "link_click", "post_engagement"]),
         "value": plain_counts},
        optional={"1d_click": st.just("1")},
    ),
    max_size=4,
)
ODD = {
    "spend": st.sampled_from(["1.23456", "100000000000000", "1.", ".5", "+1", "1e3", " 1", "1\n",
                              "", "١", "0000000000000001.5", "NaN", 15, Decimal("1.5"), None]),
    "impressions": odd_counts,
    "clicks": odd_counts,
    "actions": st.one_of(
        st.sampled_from([{}, [], None, {"action_type": MESSAGING}, {"value": "3"},
                         {"action_type": "link_click", "value": 7},
                         {"action_type": "link_click", "value": "x"}]).map(lambda a: [a]),
        odd_counts.map(lambda v: [{"action_type": MESSAGING, "value": v}]),
        st.just("lots"),
    ),
    "ad_name": st.sampled_from(["\ud83d", 5, Decimal(1)]),
    "date_start": st.sampled_from(["2026-02-28", "2026-03-04", "20260301", None]),
    "date_stop": st.sampled_from(["2026-03-01", "20260302", None]),
    "ad_id": st.sampled_from(["", 5, None, "\ud83d", True]),
}


@st.composite
def plain_rows(draw):
    day = draw(st.sampled_from(["2026-03-01", "2026-03-02", "2026-03-03"]))
    row = {
        "ad_id": draw(st.sampled_from(["120", "121", "१२", "ad☀"])),
        "date_start": day,
        "date_stop": day,
        "spend": draw(plain_spends),
        "impressions": draw(plain_counts),
        "clicks": draw(plain_counts),
        "actions": draw(plain_actions),
        "account_currency": "BRL",
    }
    for name in ("ad_name", "adset_id", "adset_name", "campaign_id", "campaign_name"):
        row[name] = draw(plain_texts)
    for key in ("impressions", "clicks", "actions", "ad_name", "campaign_id"):
        if draw(st.integers(0, 5)) == 0:
            del row[key]
    return row


@st.composite
def odd_rows(draw):
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([["x"], [], None, "row"]))
    row = draw(plain_rows())
    key = draw(st.sampled_from(sorted(ODD)))
    row[key] = draw(ODD[key])
    return row


def columnar(page):
    try:
        return parse_insight_table(page, SINCE, UNTIL)
    except MalformedResponse as exc:
        return f"MalformedResponse: {exc}"


def assert_same_table(got, expected_rows) -> None:
    if isinstance(expected_rows, str):
        assert got == expected_rows
        return
    assert not isinstance(got, str), got
    assert got.schema.equals(INSIGHT_SCHEMA)
    assert got.equals(insight_table(expected_rows))
    assert got.to_pylist() == insight_table(expected_rows).to_pylist()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(plain_rows(), rows()), max_size=5))
def test_pages_parse_into_tables_as_rows_do(page) -> None:
    assert_same_table(columnar(page), one_by_one(page))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.one_of(plain_rows(), plain_rows(), odd_rows()), min_size=1, max_size=6))
def test_near_plain_pages_parse_into_tables_as_rows_do(page) -> None:
    assert_same_table(columnar(page), one_by_one(page))


PLAIN_PAGE = [
    {"ad_id": "120", "spend": "14.30", "impressions": "185", "clicks": "9",
     "date_start": "2026-03-02", "date_stop": "2026-03-02", "ad_name": "Ação ☀️",
     "adset_name": "", "account_currency": "BRL",
     "actions": [{"action_type": MESSAGING, "value": "3"},
                 {"action_type": "link_click", "value": "x"},
                 {"action_type": MESSAGING, "value": "2", "1d_click": "1"}]},
    {"ad_id": "121", "spend": "-0.5", "date_start": "2026-03-03", "date_stop": "2026-03-03"},
]


def test_a_plain_page_is_read_in_bulk(monkeypatch) -> None:
    def per_row(*args, **kwargs):
        raise AssertionError("a plain page took the per-row path")

    monkeypatch.setattr(insights_parse, "parse_insight_row", per_row)
    table = parse_insight_table(PLAIN_PAGE, SINCE, UNTIL)
    assert table.to_pylist() == [
        {"ad_id": "120", "day": date(2026, 3, 2), "spend": Decimal("14.3000"),
         "impressions": 185, "clicks": 9, "conversations": 5, "ad_name": "Ação ☀️",
         "adset_id": None, "adset_name": None, "campaign_id": None, "campaign_name": None},
        {"ad_id": "121", "day": date(2026, 3, 3), "spend": Decimal("-0.5000"),
         "impressions": 0, "clicks": 0, "conversations": 0, "ad_name": None,
         "adset_id": None, "adset_name": None, "campaign_id": None, "campaign_name": None},
    ]
    assert parse_insight_table([], SINCE, UNTIL).equals(INSIGHT_SCHEMA.empty_table())


def test_an_odd_page_is_read_row_by_row_with_the_same_refusal() -> None:
    page = [*PLAIN_PAGE, {**PLAIN_PAGE[1], "spend": "1.23456"}]
    assert columnar(page) == one_by_one(page)
    assert "more than 4 decimal places" in columnar(page)
    fine = [*PLAIN_PAGE, {**PLAIN_PAGE[1], "ad_id": 122, "spend": " 2"}]
    assert_same_table(columnar(fine), one_by_one(fine))


def test_a_page_arrow_refuses_is_read_by_the_reference_row_by_row(monkeypatch) -> None:
    read: list[object] = []

    def reference(raw, since, until):
        read.append(raw)
        return parse_insight_row(raw, since, until)

    monkeypatch.setattr(insights_parse, "parse_insight_row", reference)
    odd = {**PLAIN_PAGE[1], "ad_id": 122, "spend": " 2", "ad_name": "Promo\ud83d"}
    table = parse_insight_table([*PLAIN_PAGE, odd], SINCE, UNTIL)
    assert read == [*PLAIN_PAGE, odd]  # the whole page, in order, once
    last = table.to_pylist()[-1]
    assert (last["ad_id"], last["spend"], last["ad_name"]) == ("122", Decimal("2"), "Promo\ufffd")
    assert table.slice(0, 2).equals(parse_insight_table(PLAIN_PAGE, SINCE, UNTIL))


def test_the_reference_reads_any_iterable_of_rows() -> None:
    got = parse_insight_table(iter(PLAIN_PAGE), SINCE, UNTIL)
    assert got.equals(parse_insight_table(PLAIN_PAGE, SINCE, UNTIL))


def test_conversations_past_64_bits_are_refused_with_the_row_named() -> None:
    big = {"action_type": MESSAGING, "value": "9223372036854775807"}
    page = [{**PLAIN_PAGE[1], "actions": [big, big]}]
    refusal = columnar(page)
    assert refusal == one_by_one(page)
    assert "insights row for ad 121" in refusal and "64-bit" in refusal

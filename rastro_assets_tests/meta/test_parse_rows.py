"""The page parser's fast path answers exactly as `parse_insight_row` does, errors included."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.parse import parse_insight_row, parse_insight_rows

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


def fast(page):
    try:
        return parse_insight_rows(page, SINCE, UNTIL)
    except MalformedResponse as exc:
        return f"MalformedResponse: {exc}"


@settings(max_examples=400, deadline=None)
@given(st.lists(rows(), max_size=5))
def test_pages_parse_as_rows_do(page) -> None:
    expected = one_by_one(page)
    got = fast(page)
    assert got == expected
    if isinstance(got, list):
        for a, b in zip(got, expected, strict=True):
            assert (type(a.spend), str(a.spend)) == (type(b.spend), str(b.spend))


def test_a_plain_page_takes_the_fast_path_and_keeps_exact_values() -> None:
    page = [
        {"ad_id": "120", "spend": "14.30", "impressions": "185", "clicks": "9",
         "date_start": "2026-03-02", "date_stop": "2026-03-02", "ad_name": "Ação ☀️",
         "actions": [{"action_type": MESSAGING, "value": "3"},
                     {"action_type": "link_click", "value": "x"}]},
    ]
    [row] = parse_insight_rows(page, SINCE, UNTIL)
    assert str(row.spend) == "14.30" and row.conversations == 3 and row.ad_name == "Ação ☀️"
    assert row == parse_insight_row(page[0], SINCE, UNTIL)


@settings(max_examples=200, deadline=None)
@given(st.lists(rows(), max_size=4), st.lists(rows(), max_size=4))
def test_pages_of_one_read_share_what_they_learned(first, second) -> None:
    texts: dict[str, str] = {}
    try:
        got = parse_insight_rows(first, SINCE, UNTIL, texts)
        got += parse_insight_rows(second, SINCE, UNTIL, texts)
    except MalformedResponse as exc:
        got = f"MalformedResponse: {exc}"
    expected = one_by_one(first + second)
    if isinstance(expected, str) and isinstance(got, str):
        return  # both refuse (the first bad row may sit on either page)
    assert got == expected


def test_a_read_keeps_one_copy_of_each_name() -> None:
    import json

    body = json.dumps([{"ad_id": str(n), "spend": "1", "date_start": "2026-03-01",
                        "date_stop": "2026-03-01", "ad_name": "Promoção ☀️"} for n in range(3)])
    texts: dict[str, str] = {}
    rows_ = parse_insight_rows(json.loads(body), SINCE, UNTIL, texts)
    rows_ += parse_insight_rows(json.loads(body), SINCE, UNTIL, texts)
    assert len({id(row.ad_name) for row in rows_}) == 1

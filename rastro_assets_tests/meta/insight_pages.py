"""Insights pages for the parser tests: the asked range, a plain page, the reference's
answer to a page, and Hypothesis strategies for rows as Meta sends them, rows that are
nearly so, and rows of any shape."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from hypothesis import strategies as st

from rastro_assets.meta.errors import MalformedResponse
from rastro_assets.meta.insights_parse import parse_insight_row
from rastro_assets.meta.models import INSIGHT_SCHEMA, insight_table

SINCE, UNTIL = date(2026, 3, 1), date(2026, 3, 3)
MESSAGING = "onsite_conversion.messaging_conversation_started_7d"

# A page as Meta sends it, as `json.loads` decodes it (one action with an attribution window).
PLAIN_PAGE = [
    {"ad_id": "120", "spend": "14.30", "impressions": "185", "clicks": "9",
     "date_start": "2026-03-02", "date_stop": "2026-03-02", "ad_name": "Ação ☀️",
     "adset_name": "", "account_currency": "BRL",
     "actions": [{"action_type": MESSAGING, "value": "3"},
                 {"action_type": "link_click", "value": "x"},
                 {"action_type": MESSAGING, "value": "2", "1d_click": "1"}]},
    {"ad_id": "121", "spend": "-0.5", "date_start": "2026-03-03", "date_stop": "2026-03-03"},
]


def one_by_one(page) -> list | str:
    """The page's rows through `parse_insight_row`, in order, or the first refusal's text."""
    try:
        return [parse_insight_row(raw, SINCE, UNTIL) for raw in page]
    except MalformedResponse as exc:
        return f"MalformedResponse: {exc}"


def assert_same_table(got, expected_rows) -> None:
    """`got` (a table or a refusal's text) is the table of `expected_rows`, or that refusal."""
    if isinstance(expected_rows, str):
        assert got == expected_rows
        return
    assert not isinstance(got, str), got
    assert got.schema.equals(INSIGHT_SCHEMA)
    assert got.equals(insight_table(expected_rows))
    assert got.to_pylist() == insight_table(expected_rows).to_pylist()


# -- rows of any shape --------------------------------------------------------------

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
    """A row of any shape: odd types, missing keys, days outside the range, not a row."""
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


# -- rows as Meta sends them, and nearly so -------------------------------------------

# Rows as Meta sends them, with values at the edges the byte reader must read exactly
# as `parse_insight_row` does; `odd_rows` then spoils one field in a way it must leave
# to the reference.
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
    """A row as Meta sends it (some with an attribution window in an action)."""
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
    """A plain row with one field spoilt (`ODD`), or now and then no row at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([["x"], [], None, "row"]))
    row = draw(plain_rows())
    key = draw(st.sampled_from(sorted(ODD)))
    row[key] = draw(ODD[key])
    return row

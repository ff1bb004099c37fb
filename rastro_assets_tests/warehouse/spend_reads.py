"""Small spend reads for the writer's tests: rows by hand, and random ad-days for models."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from hypothesis import strategies as st

from rastro_assets.meta.models import InsightRow

D1, D2, D3 = date(2026, 11, 27), date(2026, 11, 28), date(2026, 11, 29)
ADS = ["a1", "a2", "a3", "a4"]
DAYS = [D1, D2, D3]


def row(ad: str, day: date, spend: str, impressions: int = 100, clicks: int = 3, convs: int = 1):
    return InsightRow(ad, day, Decimal(spend), impressions, clicks, convs)


spends = st.decimals(
    min_value=Decimal("0"), max_value=Decimal("99999999.9999"), places=4, allow_nan=False
)
ad_days = st.dictionaries(
    st.tuples(st.sampled_from(ADS), st.sampled_from(DAYS)),
    st.tuples(spends, st.integers(0, 10**9), st.integers(0, 10**6), st.integers(0, 1000)),
    max_size=12,
)

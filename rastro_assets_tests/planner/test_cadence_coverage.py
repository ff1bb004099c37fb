"""`first_unread_day` finds what the day sets of `covered_days` would."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rastro_assets.planner.coverage import covered_days, first_missing, first_unread_day
from rastro_assets.planner.state import SyncRun

BASE = date(2026, 3, 1)
AT = datetime(2026, 3, 1, tzinfo=UTC)


@st.composite
def runs(draw):
    start = draw(st.integers(-5, 40))
    length = draw(st.integers(-2, 30))
    since = BASE + timedelta(days=start)
    until = since + timedelta(days=length)
    incomplete = draw(st.lists(st.integers(0, max(length, 0)), max_size=3)) if draw(
        st.integers(0, 4)) == 0 else []
    return SyncRun(
        run_id=str(draw(st.integers())), kind="backfill",
        since=draw(st.sampled_from([since, since, None])), until=until, started_at=AT,
        finished_at=AT, outcome=draw(st.sampled_from(["ok", "ok", "ok", "other", None])),
        incomplete_days=tuple(since + timedelta(days=day) for day in incomplete),
    )


@settings(max_examples=500, deadline=None)
@given(st.lists(runs(), max_size=8), st.integers(-3, 30), st.integers(-2, 40))
def test_first_unread_day_matches_the_day_sets(history, start, length) -> None:
    since = BASE + timedelta(days=start)
    until = since + timedelta(days=length)
    expected = first_missing(covered_days(history, since, until), since, until)
    assert first_unread_day(history, since, until) == expected

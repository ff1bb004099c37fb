"""`first_unread_day` finds what the day sets of `covered_days` would; `unread_blocks` cuts
the rest into blocks, newest first."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rastro_assets.planner.coverage import (
    BACKFILL_BLOCK_DAYS,
    covered_days,
    first_missing,
    first_unread_day,
    unread_blocks,
)
from rastro_assets.planner.state import SyncRun
from rastro_assets.timekeeping import days_between

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


@settings(max_examples=500, deadline=None)
@given(st.lists(runs(), max_size=8), st.integers(-3, 30), st.integers(-2, 100))
def test_unread_blocks_are_every_unread_day_once_newest_first(history, start, length) -> None:
    since = BASE + timedelta(days=start)
    until = since + timedelta(days=length)
    covered = covered_days(history, since, until)
    blocks = unread_blocks(history, since, until)
    days = [day for first, last in blocks for day in days_between(first, last)]
    unread = [day for day in days_between(since, until) if day not in covered]
    assert sorted(days) == unread and len(set(days)) == len(days)
    for first, last in blocks:
        assert (last - first).days + 1 <= BACKFILL_BLOCK_DAYS
        assert last not in covered
    # Newest first: each block ends before the one read ahead of it begins.
    assert all(later[0] > earlier[1] for later, earlier in zip(blocks, blocks[1:], strict=False))


def test_a_new_accounts_ninety_days_are_three_blocks_from_today_back():
    today = date(2026, 11, 30)
    assert unread_blocks([], today - timedelta(days=89), today) == [
        (today - timedelta(days=29), today),
        (today - timedelta(days=59), today - timedelta(days=30)),
        (today - timedelta(days=89), today - timedelta(days=60)),
    ]

"""The cadence planner over pinned instants: every branch, zone and back-off."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from rastro_assets.outcomes import ERROR_CODES, MAX_ERROR_CHARS
from rastro_assets.planner import backoff, cadence
from rastro_assets.planner.cadence import (
    covered_days,
    daily_slot,
    plan,
    retry_delay,
    split_blocks,
    status,
)
from rastro_assets.planner.state import AccountState, SyncRun

DAY = timedelta(days=1)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
_run_ids = itertools.count()
_UNSET = object()


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def wall(tz: str, *parts: int) -> datetime:
    """A local wall-clock time in `tz`, as an instant in UTC."""
    return datetime(*parts, tzinfo=ZoneInfo(tz)).astimezone(UTC)


def d(text: str) -> date:
    return date.fromisoformat(text)


LINKED = utc(2026, 1, 1, 12)
LINK_DAY = d("2026-01-01")
SEALED = utc(2025, 12, 1)


def run(
    since: date | None,
    until: date | None,
    started: datetime,
    *,
    kind: str = "live",
    outcome: str | None = "ok",
    finished: object = _UNSET,
    took: timedelta = 2 * MIN,
    **extra: object,
) -> SyncRun:
    finished_at = started + took if finished is _UNSET else finished
    return SyncRun(
        run_id=f"run-{next(_run_ids)}",
        kind=kind,
        since=since,
        until=until,
        started_at=started,
        finished_at=finished_at,  # type: ignore[arg-type]
        outcome=outcome,
        **extra,  # type: ignore[arg-type]
    )


def failed(started: datetime, outcome: str = "other", error: str | None = None, **extra):
    error = error or f"{ERROR_CODES[outcome]}: boom"
    return run(None, None, started, kind="live", outcome=outcome, error=error, **extra)


def account(
    runs=(),
    *,
    tz: str = "UTC",
    linked: datetime = LINKED,
    connection_status: str = "active",
    connection_error: str | None = None,
    sealed: datetime | None = SEALED,
    requested: datetime | None = None,
    ad_account_id: str = "act_1",
    connection_id: str | None = None,
) -> AccountState:
    return AccountState(
        ad_account_id=ad_account_id,
        timezone=tz,
        linked_at=linked,
        connection_status=connection_status,
        connection_error=connection_error,
        token_sealed_at=sealed,
        sync_requested_at=requested,
        runs=tuple(runs),
        connection_id=connection_id,
    )


def backfill_done(started: datetime = LINKED + MIN, tz: str = "UTC") -> SyncRun:
    """The whole first backfill, read by one run (catalog included)."""
    day = started.astimezone(ZoneInfo(tz)).date()
    return run(day - 89 * DAY, day, started, kind="backfill", catalog=True)


# --- backfill ---------------------------------------------------------------


def test_new_account_backfills_90_days_up_to_the_link_date():
    now = LINKED + MIN
    owed = plan(account(), now)
    assert (owed.kind, owed.since, owed.until, owed.catalog) == (
        "backfill",
        d("2025-10-04"),
        LINK_DAY,
        True,
    )
    assert owed.since == LINK_DAY - 89 * DAY
    assert owed.is_due(now)
    report = status(account(), now)
    assert (report.state, report.backfill, report.last_sync_at) == ("backfilling", (0, 90), None)


def test_backfill_resumes_at_the_first_hole_and_owes_up_to_today():
    first = run(d("2025-10-04"), d("2025-11-02"), LINKED, kind="backfill")
    third = run(d("2025-12-03"), d("2026-01-01"), LINKED + 5 * MIN, kind="backfill")
    now = LINKED + DAY  # the window grows by a day while the backfill is owed
    owed = plan(account([first, third]), now)
    assert (owed.kind, owed.since, owed.until) == ("backfill", d("2025-11-03"), d("2026-01-02"))
    assert owed.is_due(now)
    assert status(account([first, third]), now).backfill == (60, 91)

    second = run(d("2025-11-03"), d("2025-12-02"), LINKED + 10 * MIN, kind="backfill")
    owed = plan(account([first, second]), now)
    assert owed.since == d("2025-12-03")
    assert status(account([first, second]), now).backfill == (60, 91)


def test_failed_and_other_kinds_count_only_when_ok():
    broken = run(d("2025-10-04"), d("2026-01-01"), LINKED, kind="backfill", outcome="other")
    manual = run(d("2025-10-04"), d("2025-10-10"), LINKED + MIN, kind="manual")
    owed = plan(account([broken, manual]), LINKED + HOUR)
    assert (owed.kind, owed.since) == ("backfill", d("2025-10-11"))


def test_a_truncated_day_is_retried_then_given_up():
    def block(minutes: int) -> SyncRun:
        return run(
            d("2025-10-04"),
            d("2026-01-01"),
            LINKED + minutes * MIN,
            kind="backfill",
            catalog=True,
            incomplete_days=(d("2025-11-11"),),
            error="META_TRUNCATED: one day may be short",
        )

    now = LINKED + HOUR
    owed = plan(account([block(0)]), now)
    assert (owed.kind, owed.since) == ("backfill", d("2025-11-11"))
    assert status(account([block(0)]), now).backfill == (89, 90)
    tries = [block(minutes) for minutes in range(cadence.TRUNCATED_DAY_TRIES)]
    assert plan(account(tries), now).kind == "live"
    report = status(account(tries), now)
    assert (report.state, report.last_error) == ("live", "META_TRUNCATED: one day may be short")


def test_covered_days_clips_and_skips_incomplete_days():
    runs = [
        run(d("2026-01-01"), d("2026-01-10"), LINKED, incomplete_days=(d("2026-01-05"),)),
        run(d("2026-01-08"), d("2026-01-20"), LINKED, outcome="other"),
    ]
    days = covered_days(runs, d("2026-01-03"), d("2026-01-12"))
    assert sorted(days) == [d(f"2026-01-{n:02}") for n in (3, 4, 6, 7, 8, 9, 10)]
    assert covered_days(runs, d("2026-02-01"), d("2026-01-01")) == set()


def test_split_blocks_are_30_days():
    blocks = split_blocks(d("2025-10-04"), d("2026-01-01"))
    assert blocks == [
        (d("2025-10-04"), d("2025-11-02")),
        (d("2025-11-03"), d("2025-12-02")),
        (d("2025-12-03"), d("2026-01-01")),
    ]
    assert split_blocks(d("2026-01-01"), d("2026-01-01")) == [(LINK_DAY, LINK_DAY)]


# --- live, daily, weekly ----------------------------------------------------


def test_backfill_done_then_live_45_minutes_after_the_last_live():
    history = [backfill_done(), run(d("2025-12-31"), d("2026-01-01"), utc(2026, 1, 1, 14))]
    now = utc(2026, 1, 1, 14, 30)
    owed = plan(account(history), now)
    assert (owed.kind, owed.since, owed.until, owed.catalog) == (
        "live",
        d("2025-12-31"),
        d("2026-01-01"),
        False,
    )
    assert owed.due_at == utc(2026, 1, 1, 14, 45)
    assert not owed.is_due(utc(2026, 1, 1, 14, 44))
    assert owed.is_due(utc(2026, 1, 1, 14, 45))
    report = status(account(history), now)
    assert (report.state, report.backfill, report.last_error) == ("live", None, None)
    assert report.last_sync_at == utc(2026, 1, 1, 14, 2)
    assert report.next_sync_at == owed.due_at


def test_the_backfill_that_ends_today_counts_as_live_daily_and_weekly():
    owed = plan(account([backfill_done()]), LINKED + 30 * MIN)
    assert (owed.kind, owed.due_at) == ("live", LINKED + MIN + 45 * MIN)


@pytest.mark.parametrize("kind", ["backfill", "gap"])
def test_a_fills_short_last_block_with_the_catalog_counts_as_daily_and_weekly(kind):
    # 91 days in blocks of 30: the last block is today alone, read after the 04:00 slot.
    today = d("2026-01-05")
    blocks = [
        run(today - 90 * DAY, today - 61 * DAY, utc(2026, 1, 5, 5), kind=kind),
        run(today - 60 * DAY, today - 31 * DAY, utc(2026, 1, 5, 5, 5), kind=kind),
        run(today - 30 * DAY, today - DAY, utc(2026, 1, 5, 5, 10), kind=kind),
        run(today, today, utc(2026, 1, 5, 5, 15), kind=kind, catalog=True),
    ]
    now = utc(2026, 1, 5, 5, 30)
    owed = plan(account(blocks, linked=utc(2026, 1, 5, 4, 50)), now)
    assert (owed.kind, owed.catalog) == ("live", False)
    assert owed.due_at == utc(2026, 1, 5, 5, 15) + 45 * MIN
    # The next day's daily is a 7-day read, not the 28-day weekly.
    tomorrow = plan(account(blocks, linked=utc(2026, 1, 5, 4, 50)), utc(2026, 1, 6, 4, 1))
    assert (tomorrow.kind, tomorrow.since) == ("daily", d("2026-01-06") - 6 * DAY)


def test_a_fills_last_block_without_the_catalog_leaves_the_daily_owed():
    today = d("2026-01-05")
    blocks = [
        run(today - 89 * DAY, today - DAY, utc(2026, 1, 5, 5), kind="backfill", catalog=True),
        run(today, today, utc(2026, 1, 5, 5, 15), kind="backfill"),
    ]
    owed = plan(account(blocks, linked=utc(2026, 1, 5, 4, 50)), utc(2026, 1, 5, 5, 30))
    assert (owed.kind, owed.catalog) == ("daily", True)


def test_daily_resync_from_04_00_once_a_local_day():
    base = [backfill_done(), run(d("2026-01-01"), d("2026-01-02"), utc(2026, 1, 2, 3, 20))]
    before = plan(account(base), utc(2026, 1, 2, 3, 59))
    # The live read would come at 04:05, but the daily slot comes first.
    assert (before.kind, before.due_at) == ("live", utc(2026, 1, 2, 4))
    assert not before.is_due(utc(2026, 1, 2, 3, 59))

    at_slot = plan(account(base), utc(2026, 1, 2, 4))
    assert (at_slot.kind, at_slot.since, at_slot.until, at_slot.catalog) == (
        "daily",
        d("2025-12-27"),
        d("2026-01-02"),
        True,
    )
    assert at_slot.due_at == utc(2026, 1, 2, 4)
    assert at_slot.is_due(utc(2026, 1, 2, 4))
    # Still owed (and late, so due at once) if nothing ran at 04:00.
    assert plan(account(base), utc(2026, 1, 2, 9)).kind == "daily"

    daily = run(d("2025-12-27"), d("2026-01-02"), utc(2026, 1, 2, 4), kind="daily", catalog=True)
    later = plan(account([*base, daily]), utc(2026, 1, 2, 10))
    assert (later.kind, later.due_at) == ("live", utc(2026, 1, 2, 4, 45))
    assert plan(account([*base, daily]), utc(2026, 1, 3, 3, 59)).kind == "live"
    assert plan(account([*base, daily]), utc(2026, 1, 3, 4)).kind == "daily"


def test_before_the_slot_a_due_live_read_is_due_now():
    base = [backfill_done(), run(d("2026-01-01"), d("2026-01-02"), utc(2026, 1, 2, 3))]
    owed = plan(account(base), utc(2026, 1, 2, 3, 59))
    assert (owed.kind, owed.due_at) == ("live", utc(2026, 1, 2, 3, 45))
    assert owed.is_due(utc(2026, 1, 2, 3, 59))


def test_a_daily_without_the_catalog_or_the_7_days_does_not_count():
    no_catalog = run(d("2025-12-27"), d("2026-01-02"), utc(2026, 1, 2, 4), kind="manual")
    short = run(d("2025-12-28"), d("2026-01-02"), utc(2026, 1, 2, 4, 5), catalog=True)
    owed = plan(account([backfill_done(), no_catalog, short]), utc(2026, 1, 2, 5))
    assert owed.kind == "daily"


def weekly_at(started: datetime) -> SyncRun:
    day = started.date()
    return run(day - 27 * DAY, day, started, kind="weekly", catalog=True)


def daily_at(started: datetime) -> SyncRun:
    day = started.date()
    return run(day - 6 * DAY, day, started, kind="daily", catalog=True)


def test_weekly_boundary_is_7_days_less_12_hours():
    weekly = weekly_at(utc(2026, 1, 10, 4, 5))
    dailies = [daily_at(utc(2026, 1, day, 4)) for day in range(11, 17)]
    history = [backfill_done(), weekly, *dailies]
    at_six_days = plan(account(history), utc(2026, 1, 16, 4))
    assert at_six_days.kind == "live"  # the 16th's daily already ran
    owed = plan(account(history[:-1]), utc(2026, 1, 16, 4))
    assert owed.kind == "daily"  # 5 days 23:55 since the weekly
    owed = plan(account(history), utc(2026, 1, 17, 4))
    assert (owed.kind, owed.since, owed.until, owed.catalog) == (
        "weekly",
        d("2025-12-21"),
        d("2026-01-17"),
        True,
    )


def test_weekly_boundary_exactly_six_and_a_half_days():
    # A backfill that ends at 16:00 marks the weekly: the next one is owed at
    # the slot 6.5 days later, not a minute earlier.
    on_time = backfill_done(utc(2026, 1, 1, 16))
    late = backfill_done(utc(2026, 1, 1, 16, 1))
    dailies = [daily_at(utc(2026, 1, day, 4)) for day in range(2, 8)]
    assert plan(account([on_time, *dailies]), utc(2026, 1, 8, 4)).kind == "weekly"
    assert plan(account([late, *dailies]), utc(2026, 1, 8, 4)).kind == "daily"
    assert plan(account([late, *dailies]), utc(2026, 1, 7, 4, 1)).kind == "live"


def test_a_weekly_also_counts_as_the_daily():
    weekly = weekly_at(utc(2026, 1, 8, 4))
    owed = plan(account([backfill_done(), weekly]), utc(2026, 1, 8, 12))
    assert (owed.kind, owed.due_at) == ("live", utc(2026, 1, 8, 4, 45))


# --- gap --------------------------------------------------------------------


def live_on(day: datetime) -> SyncRun:
    return run(day.date() - DAY, day.date(), day)


def synced_until(last: datetime) -> list[SyncRun]:
    """Backfilled on Jan 1, then a live read every day at 10:00 up to `last`."""
    days = (last - utc(2026, 1, 2, 10)).days
    return [backfill_done(), *(live_on(utc(2026, 1, 2, 10) + n * DAY) for n in range(days + 1))]


def test_gap_after_more_than_27_days_without_a_good_sync():
    history = synced_until(utc(2026, 2, 1, 10))
    owed = plan(account(history), utc(2026, 3, 1, 10, 1))  # 28 days later
    assert (owed.kind, owed.since, owed.until, owed.catalog) == (
        "gap",
        d("2026-01-31"),
        d("2026-03-01"),
        True,
    )
    assert owed.is_due(utc(2026, 3, 1, 10, 1))
    report = status(account(history), utc(2026, 3, 1, 10, 1))
    # The last live read already covered Jan 31 and Feb 1.
    assert (report.state, report.backfill) == ("backfilling", (0, 30))

    for quiet in (26 * DAY, 27 * DAY):
        owed = plan(account(history), utc(2026, 2, 1, 10) + quiet)
        assert owed.kind in ("live", "daily", "weekly"), quiet


def test_gap_partly_filled_resumes_then_ends():
    first_block = run(d("2026-01-31"), d("2026-02-20"), utc(2026, 3, 1, 10, 5), kind="gap")
    history = [*synced_until(utc(2026, 2, 1, 10)), first_block]
    now = utc(2026, 3, 1, 11)
    owed = plan(account(history), now)
    assert (owed.kind, owed.since, owed.until) == ("gap", d("2026-02-21"), d("2026-03-01"))
    assert status(account(history), now).backfill == (21, 30)

    rest = run(d("2026-02-21"), d("2026-03-01"), utc(2026, 3, 1, 10, 10), kind="gap", catalog=True)
    owed = plan(account([*history, rest]), now)
    assert (owed.kind, owed.due_at) == ("live", utc(2026, 3, 1, 10, 55))
    assert status(account([*history, rest]), now).backfill is None


def test_gap_is_clipped_to_90_days():
    history = synced_until(utc(2026, 1, 20, 10))
    owed = plan(account(history), utc(2026, 6, 1, 12))
    assert (owed.kind, owed.since, owed.until) == ("gap", d("2026-03-04"), d("2026-06-01"))
    assert owed.since == d("2026-06-01") - 89 * DAY
    assert status(account(history), utc(2026, 6, 1, 12)).backfill == (0, 90)


def test_a_backfill_that_succeeded_weeks_after_linking_leaves_no_hole():
    late = run(d("2025-10-04"), LINK_DAY, utc(2026, 2, 10, 9), kind="backfill", catalog=True)
    owed = plan(account([late]), utc(2026, 2, 10, 10))
    assert (owed.kind, owed.since, owed.until) == ("gap", d("2026-01-02"), d("2026-02-10"))


# --- back-off ---------------------------------------------------------------


def live_history() -> list[SyncRun]:
    return [backfill_done(), daily_at(utc(2026, 1, 2, 4)), live_on(utc(2026, 1, 2, 10))]


FAIL_AT = utc(2026, 1, 2, 10, 45)
FAIL_END = FAIL_AT + 2 * MIN


SEC = timedelta(seconds=1)


def held_within(due: datetime, ended: datetime, wait: timedelta) -> bool:
    """`due` is `wait` after `ended`, stretched by at most the jitter's share (whole seconds)."""
    return ended + wait <= due <= ended + wait * (1 + backoff.HOLD_JITTER) + SEC


@pytest.mark.parametrize(
    ("regain", "wait"),
    [(10 * MIN, 10 * MIN), (2 * HOUR, 2 * HOUR), (20 * SEC, MIN), (None, MIN)],
)
def test_a_throttle_on_its_own_limit_holds_it_until_its_regain_time_not_an_hour(regain, wait):
    throttled = failed(
        FAIL_AT, "throttled", regain_at=None if regain is None else FAIL_END + regain,
        rate_limit="ads_insights", account_usage_pct=100.0,
    )
    history = [*live_history(), throttled]
    now = FAIL_END + 10 * SEC
    owed = plan(account(history), now)
    assert owed.kind == "live" and held_within(owed.due_at, FAIL_END, wait)
    assert owed.reason.endswith(
        f"; RATE_LIMITED: held until {owed.due_at:%Y-%m-%d %H:%M} UTC by its"
        " ads_insights business use case (calls an hour); usage 100%"
    )
    report = status(account(history), now)
    assert (report.state, report.last_error) == ("error", "RATE_LIMITED: boom")
    assert report.to_json([])["rate_limit"] == owed.to_json()["rate_limit"] == {
        "limit": "ads_insights",
        "held_until": owed.due_at.isoformat(),
        "reason": owed.reason.split("; ", 1)[1],
    }
    # Once the hold is over, nothing says the account is held.
    assert status(account(history), owed.due_at).rate_limit is None


def test_throttles_in_a_row_without_a_wait_double_the_least_hold():
    history = live_history()
    for count, least in enumerate([MIN, 2 * MIN, 4 * MIN, 8 * MIN, 15 * MIN, 15 * MIN]):
        history.append(failed(FAIL_AT + count * HOUR, "throttled", rate_limit="ad_account_score"))
        ended = history[-1].finished_at
        assert held_within(plan(account(history), ended).due_at, ended, least), count


def test_abuse_prevention_holds_the_account_for_hours_whatever_meta_said():
    cut = failed(
        FAIL_AT, "throttled", error="RATE_LIMITED: (#613) Calls to this api have exceeded",
        regain_at=FAIL_END + 5 * MIN, rate_limit="abuse",
    )
    owed = plan(account([*live_history(), cut]), FAIL_END + MIN)
    assert backoff.ABUSE_HOLD >= 6 * HOUR
    assert held_within(owed.due_at, FAIL_END, backoff.ABUSE_HOLD)
    assert "by Meta's abuse prevention (613 without a subcode" in owed.reason
    assert status(account([*live_history(), cut]), FAIL_END + MIN).rate_limit.limit == "abuse"


@pytest.mark.parametrize(
    ("limit", "regain", "wait"),
    [
        ("app_insights_load", None, MIN),
        ("app_insights_load", 5 * MIN, 5 * MIN),
        ("app_insights_load", 2 * HOUR, 15 * MIN),
        ("app_platform", 3 * HOUR, 15 * MIN),
    ],
)
def test_an_app_wide_limit_holds_the_account_only_for_the_apps_pause(limit, regain, wait):
    throttled = failed(
        FAIL_AT, "throttled", regain_at=None if regain is None else FAIL_END + regain,
        rate_limit=limit,
    )
    owed = plan(account([*live_history(), throttled]), FAIL_END + 10 * SEC)
    assert held_within(owed.due_at, FAIL_END, wait)
    assert "the app's" in owed.reason


def test_the_jitter_is_bounded_repeatable_and_differs_between_accounts_of_one_run():
    waits = set()
    for index in range(200):
        throttled = failed(
            FAIL_AT, "throttled", regain_at=FAIL_END + 10 * MIN, rate_limit="ads_insights"
        )
        throttled = replace(throttled, run_id="one-wave")
        state = account([*live_history(), throttled], ad_account_id=f"act_{index}")
        due = plan(state, FAIL_END).due_at
        assert plan(state, FAIL_END + 5 * MIN).due_at == due
        assert held_within(due, FAIL_END, 10 * MIN)
        waits.add(due - FAIL_END)
    assert len(waits) > 60
    assert max(waits) - min(waits) > 90 * SEC


def test_permission_waits_6_hours():
    denied = failed(FAIL_AT, "permission")
    owed = plan(account([*live_history(), denied]), FAIL_END)
    assert owed.due_at == FAIL_END + 6 * HOUR
    assert status(account([*live_history(), denied]), FAIL_END).last_error == (
        "META_PERMISSION: boom"
    )


@pytest.mark.parametrize("outcome", ["other", "key"])
def test_failures_double_from_15_minutes_to_6_hours(outcome):
    expected = [15, 30, 60, 120, 240, 360, 360, 360]
    history = live_history()
    for count, minutes in enumerate(expected, start=1):
        history.append(failed(FAIL_AT + count * 7 * HOUR, outcome))
        end = history[-1].finished_at
        owed = plan(account(history), end)
        assert owed.due_at == end + minutes * MIN, count
        plural = "s" if count > 1 else ""
        assert f"after {count} failure{plural}: {ERROR_CODES[outcome]}" in owed.reason


def test_backoff_reason_reads_well():
    history = [*live_history(), failed(FAIL_AT, error="META_UNAVAILABLE: Meta said 500")]
    history.append(failed(FAIL_AT + HOUR, error="META_UNAVAILABLE: Meta said 503"))
    owed = plan(account(history), FAIL_AT + 2 * HOUR)
    assert owed.reason.endswith(
        "; backing off 30 min after 2 failures: META_UNAVAILABLE: Meta said 503"
    )


def test_retry_delay():
    assert [retry_delay(n) for n in (0, 1, 2, 3, 5, 6, 7, 10_000)] == [
        15 * MIN,
        15 * MIN,
        30 * MIN,
        HOUR,
        4 * HOUR,
        6 * HOUR,
        6 * HOUR,
        6 * HOUR,
    ]


def test_a_good_run_ends_the_failure_streak():
    history = [*live_history(), failed(FAIL_AT), failed(FAIL_AT + HOUR)]
    history.append(live_on(FAIL_AT + 2 * HOUR))
    history.append(failed(FAIL_AT + 3 * HOUR))
    owed = plan(account(history), FAIL_AT + 3 * HOUR + 5 * MIN)
    assert owed.due_at == FAIL_AT + 3 * HOUR + 2 * MIN + 15 * MIN


def test_backoff_holds_a_backfill_too():
    broken = failed(LINKED + MIN, error="META_UNAVAILABLE: down")
    owed = plan(account([broken]), LINKED + 5 * MIN)
    assert (owed.kind, owed.due_at) == ("backfill", LINKED + 3 * MIN + 15 * MIN)
    report = status(account([broken]), LINKED + 5 * MIN)
    assert (report.state, report.backfill) == ("error", (0, 90))


def block_read(**extra: object) -> SyncRun:
    """The first 30 days of the backfill, read well: the next block is owed at once."""
    return run(LINK_DAY - 89 * DAY, LINK_DAY - 60 * DAY, LINKED + MIN, kind="backfill", **extra)


@pytest.mark.parametrize(
    ("usage", "own"), [(90.0, 12.0), (99.0, 89.9), (80.0, None)]
)
def test_a_good_run_below_its_own_limit_holds_nothing_whatever_the_apps_share(usage, own):
    """The app's share (`usage_pct` mixes it in) slows the client, never holds one account;
    a row from before the account's own share was recorded holds only on a regain time."""
    busy = block_read(usage_pct=usage, account_usage_pct=own)
    now = LINKED + 4 * MIN
    owed = plan(account([busy]), now)
    assert (owed.kind, owed.due_at, owed.rate_limit) == ("backfill", now, None)
    assert "RATE_LIMITED" not in owed.reason
    report = status(account([busy]), now)
    assert (report.state, report.last_error, report.rate_limit) == ("backfilling", None, None)


@pytest.mark.parametrize(
    ("own", "regain", "wait"),
    [
        (95.0, None, MIN),
        (95.0, 3 * MIN, 3 * MIN),
        (90.0, 3 * HOUR, 3 * HOUR),
        (None, 5 * MIN, 5 * MIN),
    ],
)
def test_a_good_run_at_its_own_limit_holds_it_a_minute_at_least(own, regain, wait):
    ended = LINKED + 3 * MIN
    busy = block_read(
        usage_pct=own, account_usage_pct=own, rate_limit="ad_account_score",
        regain_at=None if regain is None else ended + regain,
    )
    owed = plan(account([busy]), ended + 10 * SEC)
    assert owed.kind == "backfill" and held_within(owed.due_at, ended, wait)
    assert owed.rate_limit.limit == "ad_account_score"
    assert "RATE_LIMITED: held until" in owed.reason and "its ad account score" in owed.reason
    report = status(account([busy]), ended + 10 * SEC)
    assert report.state == "backfilling"
    assert report.last_error == owed.rate_limit.reason
    # Once the wait is over, the note is gone.
    assert status(account([busy]), owed.due_at).last_error is None


# --- token, sync now, lease -------------------------------------------------


def test_dead_token_pauses_and_a_new_token_resumes_at_once():
    dead = failed(FAIL_AT, "token", error="META_TOKEN_INVALID: Error validating access token")
    paused = account(
        [*live_history(), dead],
        connection_status="invalid",
        connection_error="Error validating access token",
        requested=FAIL_AT + HOUR,
    )
    owed = plan(paused, FAIL_AT + 2 * HOUR)
    assert (owed.kind, owed.since, owed.until, owed.due_at, owed.catalog) == (
        "paused",
        None,
        None,
        None,
        False,
    )
    assert "token" in owed.reason and not owed.is_due(FAIL_AT + 2 * HOUR)
    report = status(paused, FAIL_AT + 2 * HOUR)
    assert (report.state, report.next_sync_at, report.last_error) == (
        "paused",
        None,
        "META_TOKEN_INVALID: Error validating access token",
    )

    resumed = account([*live_history(), dead], sealed=FAIL_AT + 3 * HOUR)
    owed = plan(resumed, FAIL_AT + 3 * HOUR + MIN)
    assert (owed.kind, owed.due_at) == ("live", FAIL_AT + 3 * HOUR + MIN)


@pytest.mark.parametrize(
    ("connection_error", "shown"),
    [
        ("META_TOKEN_INVALID: expired", "META_TOKEN_INVALID: expired"),
        ("expired", "META_TOKEN_INVALID: expired"),
        (None, "META_TOKEN_INVALID: the token is no longer valid"),
    ],
)
def test_paused_error_is_coded_once(connection_error, shown):
    state = account(connection_status="invalid", connection_error=connection_error)
    assert status(state, LINKED + HOUR).last_error == shown


def test_a_token_failure_without_a_new_token_backs_off():
    dead = failed(FAIL_AT, "token")
    owed = plan(account([*live_history(), dead]), FAIL_END)
    assert owed.due_at == FAIL_END + 15 * MIN


def test_a_new_token_resumes_a_paused_account_that_did_not_fail():
    # Another account's run found the token dead; this one never failed.
    history = live_history()
    owed = plan(account(history, sealed=utc(2026, 1, 2, 10, 20)), utc(2026, 1, 2, 10, 25))
    assert owed.due_at == utc(2026, 1, 2, 10, 25)


def meta_token_error(trace: str) -> str:
    """A sync's error when Meta refused its token, as the sync records it."""
    return (
        "META_TOKEN_INVALID: Error validating access token: Session has expired on Friday, "
        f"02-Jan-26 02:00:00 PST. (code 190/463, HTTP 400, fbtrace_id {trace})"
    )


def test_paused_accounts_show_their_own_request_then_wait_for_the_new_token():
    # Two accounts of c1 each asked Meta with the dead token; c1 kept a third request's error.
    own = {"act_1": "AAA111", "act_2": "BBB222"}
    dead = {
        name: failed(FAIL_AT + index * MIN, "token", error=meta_token_error(trace))
        for index, (name, trace) in enumerate(own.items())
    }

    def state(name: str, *later: SyncRun, **connection) -> AccountState:
        return account(
            [*live_history(), dead[name], *later], ad_account_id=name, connection_id="c1",
            **connection,
        )

    dead_connection = {
        "connection_status": "invalid",
        "connection_error": meta_token_error("CCC333"),
    }
    now = FAIL_AT + HOUR
    for name, trace in own.items():
        report = status(state(name, **dead_connection), now)
        assert (report.state, report.next_sync_at) == ("paused", None)
        assert report.last_error == meta_token_error(trace)
        assert "CCC333" not in report.last_error

    # `rastro connect` seals a new token: active, no stored error, a new sealed_at.
    sealed = FAIL_AT + 2 * HOUR
    now = sealed + 5 * MIN
    for name in own:
        report = status(state(name, sealed=sealed), now)
        assert (report.state, report.last_error, report.next_sync_at, report.backfill) == (
            "waiting", None, now, None,
        )
        assert report.to_json(["s1"])["state"] == "waiting"
        assert plan(state(name, sealed=sealed), now).reason.endswith("a new token was connected")

    # A sync running with the new token has not shown it works yet.
    running = run(None, None, now, outcome=None, finished=None)
    assert status(state("act_1", running, sealed=sealed), now + MIN).state == "waiting"

    good = live_on(now)
    report = status(state("act_1", good, sealed=sealed), now + 10 * MIN)
    assert (report.state, report.last_error) == ("live", None)
    assert report.last_sync_at == good.finished_at

    # The new token dies too: paused again, with the new run's request, not the old one's.
    again = failed(now, "token", error=meta_token_error("DDD444"))
    report = status(
        state("act_1", again, sealed=sealed, connection_status="invalid",
              connection_error=meta_token_error("DDD444")),
        now + 10 * MIN,
    )
    assert (report.state, report.last_error) == ("paused", meta_token_error("DDD444"))
    # An account whose own failure was the old token's shows the connection's error, marked.
    report = status(
        state("act_2", sealed=sealed, connection_status="invalid",
              connection_error=meta_token_error("EEE555")),
        now + 10 * MIN,
    )
    assert report.last_error == (
        f"{meta_token_error('EEE555')} (seen by another request on connection c1)"
    )


def test_a_paused_account_without_its_own_token_failure_shows_the_connections_marked():
    connection_error = meta_token_error("CCC333")
    never_failed = account(
        live_history(), connection_status="invalid", connection_error=connection_error,
        connection_id="c1",
    )
    expected = f"{connection_error} (seen by another request on connection c1)"
    assert status(never_failed, FAIL_AT + HOUR).last_error == expected

    # Refused before asking Meta: its error quotes the request that found the token dead.
    refused = failed(
        FAIL_AT, "token",
        error=f"META_TOKEN_INVALID: the connection's token is invalid: {connection_error}",
    )
    restated = account(
        [*live_history(), refused], connection_status="invalid",
        connection_error=connection_error, connection_id="c1",
    )
    assert status(restated, FAIL_AT + HOUR).last_error == expected

    # A long error is cut so the note stays, within the stored error's length.
    long_error = meta_token_error("FFF666") + " " + "x" * 400
    report = status(
        account(live_history(), connection_status="invalid", connection_error=long_error,
                connection_id="c1"),
        FAIL_AT + HOUR,
    )
    assert len(report.last_error) == MAX_ERROR_CHARS
    assert report.last_error.startswith("META_TOKEN_INVALID: Error validating access token")
    assert report.last_error.endswith(" (seen by another request on connection c1)")


def test_a_new_token_during_a_backfill_keeps_backfilling():
    # Brand new: never synced, so it owes its backfill, not a first good sync.
    assert status(account(), LINKED + MIN).state == "backfilling"
    dead = failed(LINKED + MIN, "token")
    report = status(account([dead], sealed=LINKED + HOUR), LINKED + HOUR + MIN)
    assert (report.state, report.backfill, report.last_error) == ("backfilling", (0, 90), None)


def test_sync_now_overrides_backoff_but_not_a_pause_or_a_running_sync():
    denied = failed(FAIL_AT, "permission")
    now = FAIL_AT + HOUR
    owed = plan(account([*live_history(), denied], requested=FAIL_AT + 30 * MIN), now)
    assert (owed.due_at, owed.kind) == (now, "live")
    assert "sync requested" in owed.reason
    stale = plan(account([*live_history(), denied], requested=FAIL_AT - MIN), now)
    assert stale.due_at == FAIL_END + 6 * HOUR
    # Before the live cadence would run, too.
    fresh = plan(account(live_history(), requested=utc(2026, 1, 2, 10, 5)), utc(2026, 1, 2, 10, 6))
    assert fresh.due_at == utc(2026, 1, 2, 10, 6)

    running = run(None, None, now - 5 * MIN, outcome=None, finished=None)
    busy = plan(account([*live_history(), denied, running], requested=now - MIN), now)
    assert busy.due_at == now + 10 * MIN


def test_a_running_sync_holds_a_lease_then_times_out():
    started = utc(2026, 1, 2, 11)
    running = run(d("2026-01-01"), d("2026-01-02"), started, outcome=None, finished=None)
    history = [*live_history(), running]
    owed = plan(account(history), started + 10 * MIN)
    assert owed.due_at == started + 15 * MIN
    assert "a sync is running" in owed.reason
    assert not owed.is_due(started + 10 * MIN)
    assert status(account(history), started + 10 * MIN).state == "live"

    # The lease ran out: the run is re-taken at once (a lost run is no failure), not backed off.
    owed = plan(account(history), started + 15 * MIN)
    assert owed.is_due(started + 15 * MIN)
    assert "RUN_TIMEOUT: the previous sync did not finish" in owed.reason
    report = status(account(history), started + 15 * MIN)
    assert (report.state, report.last_error) == (
        "error",
        "RUN_TIMEOUT: the previous sync did not finish",
    )
    # A second dead run is re-taken at once too, and a timeout adds no failure to a streak.
    again = run(None, None, started + 15 * MIN, outcome=None, finished=None)
    assert not plan(account([*history, again]), started + 29 * MIN).is_due(started + 29 * MIN)
    assert plan(account([*history, again]), started + 30 * MIN).is_due(started + 30 * MIN)
    after = failed(started + 40 * MIN)
    owed = plan(account([*history, again, after]), started + 41 * MIN)
    assert owed.due_at == after.finished_at + 15 * MIN  # the first failure's wait


def test_a_dead_run_before_a_good_one_is_forgotten():
    dead = run(None, None, utc(2026, 1, 2, 9), outcome=None, finished=None)
    history = [backfill_done(), dead, live_on(utc(2026, 1, 2, 10))]
    report = status(account(history), utc(2026, 1, 2, 10, 30))
    assert (report.state, report.last_error) == ("live", None)


# --- time zones and DST -----------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "now", "today"),
    [
        ("Pacific/Auckland", utc(2026, 1, 15, 12), "2026-01-16"),
        ("America/Los_Angeles", utc(2026, 1, 15, 5), "2026-01-14"),
        ("Asia/Tokyo", utc(2026, 1, 15, 20), "2026-01-16"),
    ],
)
def test_dates_are_account_local(tz, now, today):
    assert now.date().isoformat() != today
    owed = plan(account(tz=tz, linked=now - HOUR), now)
    assert (owed.kind, owed.until) == ("backfill", d(today))
    assert owed.since == d(today) - 89 * DAY
    linked = now - 30 * MIN
    history = [backfill_done(linked + MIN, tz=tz)]
    owed = plan(account(history, tz=tz, linked=linked), now)
    assert (owed.kind, owed.since, owed.until) == ("live", d(today) - DAY, d(today))


@pytest.mark.parametrize(
    ("tz", "day", "slot"),
    [
        ("Pacific/Auckland", "2026-01-16", utc(2026, 1, 15, 15)),
        ("America/Los_Angeles", "2026-01-14", utc(2026, 1, 14, 12)),
        ("Asia/Tokyo", "2026-01-16", utc(2026, 1, 15, 19)),
        ("America/New_York", "2026-03-08", utc(2026, 3, 8, 8)),  # spring forward
        ("America/New_York", "2026-11-01", utc(2026, 11, 1, 9)),  # fall back
        ("Europe/Berlin", "2026-03-29", utc(2026, 3, 29, 2)),
        ("Europe/Berlin", "2026-10-25", utc(2026, 10, 25, 3)),
        # Baku skipped 04:00-05:00 local: the slot is the first instant after.
        ("Asia/Baku", "2015-03-29", utc(2015, 3, 29, 0)),
    ],
)
def test_daily_slot_is_04_00_local_wall_clock(tz, day, slot):
    assert daily_slot(d(day), tz) == slot
    local = slot.astimezone(ZoneInfo(tz))
    assert (local.date(), local.hour) == (d(day), 5 if tz == "Asia/Baku" else 4)


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Asia/Tokyo", "2026-01-16"),
        ("Pacific/Auckland", "2026-01-16"),
        ("America/Los_Angeles", "2026-01-14"),
        ("America/New_York", "2026-03-08"),
        ("America/New_York", "2026-11-01"),
        ("Europe/Berlin", "2026-03-29"),
        ("Europe/Berlin", "2026-10-25"),
    ],
)
def test_daily_boundary_in_local_time(tz, day):
    today = d(day)
    linked = wall(tz, today.year, today.month, today.day, 12) - 3 * DAY
    last_live = wall(tz, today.year, today.month, today.day, 3, 30)
    history = [backfill_done(linked, tz=tz), run(today - DAY, today, last_live)]
    state = account(history, tz=tz, linked=linked - MIN)
    slot = wall(tz, today.year, today.month, today.day, 4)
    before = plan(state, slot - MIN)
    assert (before.kind, before.due_at) == ("live", slot)
    at_slot = plan(state, slot)
    assert (at_slot.kind, at_slot.since, at_slot.until) == ("daily", today - 6 * DAY, today)
    assert at_slot.is_due(slot)
    assert at_slot.due_at.astimezone(ZoneInfo(tz)).hour == 4


def test_live_interval_is_elapsed_time_across_fall_back():
    tz = "America/New_York"
    zone = ZoneInfo(tz)
    # 01:30 EDT, then the clocks fall back: 45 minutes later is 01:15 EST.
    started = datetime(2026, 11, 1, 1, 30, tzinfo=zone)
    history = [
        backfill_done(utc(2026, 10, 25, 12), tz=tz),
        weekly_at(utc(2026, 10, 31, 12)),
        run(d("2026-10-31"), d("2026-11-01"), started),
    ]
    now = datetime(2026, 11, 1, 1, 40, fold=1, tzinfo=zone)
    owed = plan(account(history, tz=tz, linked=utc(2026, 10, 25, 11)), now)
    assert owed.kind == "live"
    assert owed.due_at == utc(2026, 11, 1, 6, 15)
    assert owed.to_json()["due_at"] == "2026-11-01T01:15:00-05:00"
    assert owed.is_due(now)  # 01:40 EST is after 01:15 EST, whatever the wall says


def test_an_invalid_timezone_is_refused():
    with pytest.raises(ValueError, match="timezone"):
        plan(account(tz="Mars/Olympus"), LINKED)


def test_a_naive_instant_is_refused():
    with pytest.raises(ValueError, match="aware"):
        plan(account(), datetime(2026, 1, 2, 10))


# --- invariants, JSON, scale ------------------------------------------------


def test_never_a_date_after_today_nor_since_after_until():
    tz = "Pacific/Auckland"
    history = [backfill_done(LINKED, tz=tz)]
    now = LINKED
    for step in range(0, 24 * 40, 7):
        now = LINKED + step * HOUR
        today = now.astimezone(ZoneInfo(tz)).date()
        for state in (account(history, tz=tz), account(tz=tz, linked=now)):
            owed = plan(state, now)
            assert owed.since <= owed.until <= today, (now, owed)
        history.append(run(today - DAY, today, now + MIN))


def test_plan_json_shape():
    now = utc(2026, 1, 15, 12)
    owed = plan(account(tz="Pacific/Auckland", linked=now), now)
    assert owed.to_json() == {
        "ad_account_id": "act_1",
        "kind": "backfill",
        "since": "2025-10-19",
        "until": "2026-01-16",
        "catalog": True,
        "due_at": "2026-01-16T01:00:00+13:00",
        "reason": owed.reason,
        "rate_limit": None,
    }
    assert owed.reason and "\n" not in owed.reason
    paused = plan(account(connection_status="invalid", connection_error="expired"), now)
    assert paused.to_json() == {
        "ad_account_id": "act_1",
        "kind": "paused",
        "since": None,
        "until": None,
        "catalog": False,
        "due_at": None,
        "reason": paused.reason,
        "rate_limit": None,
    }


def test_status_json_shape():
    tz = "America/Los_Angeles"
    history = [backfill_done(utc(2026, 1, 2, 18), tz=tz)]
    state = account(history, tz=tz, linked=utc(2026, 1, 2, 17))
    report = status(state, utc(2026, 1, 2, 18, 30))
    assert report.to_json(["site_b", "site_a"]) == {
        "ad_account_id": "act_1",
        "sites": ["site_a", "site_b"],
        "state": "live",
        "last_sync_at": "2026-01-02T10:02:00-08:00",
        "next_sync_at": "2026-01-02T10:45:00-08:00",
        "backfill": None,
        "last_error": None,
        "rate_limit": None,
    }
    fresh = status(account(tz=tz, linked=utc(2026, 1, 2, 17)), utc(2026, 1, 2, 17))
    assert fresh.to_json([]) == {
        "ad_account_id": "act_1",
        "sites": [],
        "state": "backfilling",
        "last_sync_at": None,
        "next_sync_at": "2026-01-02T09:00:00-08:00",
        "backfill": {"done": 0, "total": 90},
        "last_error": None,
        "rate_limit": None,
    }


def test_5000_runs_in_any_order_plan_as_sorted():
    # How fast is bench/sensor.py's job (speed targets are benchmarks, not timed tests).
    start = LINKED + HOUR
    history = [backfill_done()]
    for index in range(5_000):
        started = start + index * 45 * MIN
        history.append(live_on(started) if index % 50 else failed(started))
    history.reverse()  # any order
    state = account(history)
    now = history[0].started_at + 10 * MIN
    owed = plan(state, now)
    report = status(state, now)
    assert owed.kind in ("live", "daily", "weekly")
    assert report.state == "live"
    assert plan(account(sorted(history, key=lambda run: run.started_at)), now) == owed

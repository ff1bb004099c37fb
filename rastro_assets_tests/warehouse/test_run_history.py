"""`meta_sync_runs` read back for the planner, against a real warehouse file: every row,
the marks' predicates, and the reduced reads the planner chains."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta

import pytest

from rastro_assets.planner.marks import DAILY_DAYS, MARK_RULES, WEEKLY_DAYS
from rastro_assets.planner.reduced import READ_SHAPE, planner_runs_by_account
from rastro_assets.planner.runs import epoch_us
from rastro_assets.planner.state import SyncRun
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse.run_history import (
    MARK_KINDS,
    ReducedReads,
    ReducedShape,
    mark_predicates,
    sync_run_rows,
)
from rastro_assets.warehouse.runs import SyncRunEnd, SyncRunStart, finish_sync_runs, start_sync_runs
from rastro_assets_tests.conftest import NOW, record_sync_run

TODAY = NOW.date()
DAY = timedelta(days=1)


def test_every_row_comes_by_account_oldest_first_with_instants_in_microseconds(con):
    record_sync_run(con, "b-late", "act_2", "live", TODAY - DAY, TODAY, NOW)
    record_sync_run(con, "a-late", "act_1", "live", TODAY - DAY, TODAY, NOW,
                    outcome="throttled", error="slow down", catalog=True)
    record_sync_run(con, "z-early", "act_1", "backfill", TODAY - 89 * DAY, TODAY, NOW - DAY)

    rows = sync_run_rows(con)

    assert [(row[0], row[1]) for row in rows] == [
        ("act_1", "z-early"), ("act_1", "a-late"), ("act_2", "b-late"),
    ]
    assert rows[1] == (
        "act_1", "a-late", "live", TODAY - DAY, TODAY, epoch_us(NOW),
        epoch_us(NOW + timedelta(seconds=5)), "throttled", "slow down", True,
        None, None, None, None, None,
    )
    assert [row[1] for row in sync_run_rows(con, ["act_2", "act_9"])] == ["b-late"]
    assert sync_run_rows(con, []) == []


# -- The marks' predicates -------------------------------------------------------------------

ZONES = ("Pacific/Kiritimati", "UTC", "Pacific/Pago_Pago")  # UTC+14 to UTC-11
STARTS = (NOW.replace(hour=0, minute=30), NOW.replace(hour=11), NOW.replace(hour=23, minute=30))
# (since, until) as days before the run's local start day.
SPANS = ((1, 0), (DAILY_DAYS - 1, 0), (DAILY_DAYS - 2, 0), (WEEKLY_DAYS - 1, 0),
         (WEEKLY_DAYS - 2, 0), (3, 1), (0, -1))


def candidate_runs() -> list[tuple[SyncRun, date]]:
    """Runs of every kind, span, catalog and outcome, each with its local start day."""
    runs = []
    combos = itertools.product(ZONES, STARTS, ("live", "daily", "backfill"), SPANS,
                               (True, False), ("ok", "other"))
    for index, (zone, start, kind, (back, ahead), catalog, outcome) in enumerate(combos):
        started_on = local_date(start, zone)
        run = SyncRun(f"r{index}", kind, started_on - back * DAY, started_on - ahead * DAY,
                      start, start + timedelta(minutes=1), outcome, catalog=catalog)
        runs.append((run, started_on))
    return runs


def write(con, runs: list[SyncRun]) -> None:
    start_sync_runs(con, [
        SyncRunStart(run.run_id, "act_1", run.kind, run.since, run.until, run.started_at,
                     run.catalog, None)
        for run in runs
    ])
    finish_sync_runs(con, [
        ((run.run_id, "act_1", run.since), SyncRunEnd(run.finished_at, run.outcome))
        for run in runs
    ])


def test_each_mark_s_predicate_holds_for_every_run_that_earns_the_mark(con):
    runs = candidate_runs()
    write(con, [run for run, _ in runs])
    predicates = mark_predicates(DAILY_DAYS, WEEKLY_DAYS)
    columns = ", ".join(f"{predicates[kind]} AS {kind}" for kind in MARK_KINDS)
    held = {
        run_id: dict(zip(MARK_KINDS, flags, strict=True))
        for run_id, *flags in con.execute(f"SELECT run_id, {columns} FROM meta_sync_runs")
        .fetchall()
    }
    for kind in MARK_KINDS:
        earned = {run.run_id for run, on in runs if MARK_RULES[kind](run, on)}
        selected = {run_id for run_id, flags in held.items() if flags[kind]}
        assert earned, kind
        assert earned <= selected, (kind, sorted(earned - selected))
        assert len(selected) < len(runs), kind  # the predicate narrows the scan


# -- The reduced reads -------------------------------------------------------------------------


@pytest.fixture
def history(con):
    """act_1: a backfill, a daily re-sync, live reads, a failure and a run in flight."""
    record_sync_run(con, "fill", "act_1", "backfill", TODAY - 89 * DAY, TODAY, NOW - 30 * DAY,
                    catalog=True)
    record_sync_run(con, "daily", "act_1", "daily", TODAY - 8 * DAY, TODAY - 2 * DAY,
                    NOW - 2 * DAY, catalog=True)
    record_sync_run(con, "live-old", "act_1", "live", TODAY - 3 * DAY, TODAY - 2 * DAY,
                    NOW - 2 * DAY + timedelta(hours=1))
    record_sync_run(con, "live", "act_1", "live", TODAY - DAY, TODAY, NOW - timedelta(hours=2))
    record_sync_run(con, "failed", "act_1", "live", TODAY - DAY, TODAY,
                    NOW - timedelta(hours=1), outcome="other")
    start_sync_runs(con, [SyncRunStart("flight", "act_1", "live", TODAY - DAY, TODAY,
                                       NOW, False, None)])
    return ReducedReads(con, READ_SHAPE)


def test_an_empty_history_has_no_newest_start(con):
    assert ReducedReads(con, READ_SHAPE).newest_start() is None


def test_summaries_give_the_last_good_run_and_each_mark_s_candidate(con, history):
    assert history.newest_start() == NOW
    [summary] = history.summaries_of(["act_1"])
    account, last_ok, finished, finished_start, *marks = summary
    assert account == "act_1"
    assert last_ok == finished_start == epoch_us(NOW - timedelta(hours=2))
    assert finished == epoch_us(NOW - timedelta(hours=2) + timedelta(seconds=5))
    assert marks == [
        epoch_us(NOW - timedelta(hours=2)),  # live
        epoch_us(NOW - 2 * DAY),  # daily
        epoch_us(NOW - 30 * DAY),  # weekly: the fill read every day
    ]
    # From a start on: only the runs of the last day, so the fill is no candidate.
    [recent] = history.summaries_from(NOW - DAY)
    assert recent[4:] == (epoch_us(NOW - timedelta(hours=2)), None, None)
    # The trailing reads leave out the live reads of less than a re-sync's days.
    [trailing] = history.trailing_summaries_from(NOW - 3 * DAY)
    assert trailing[1] == epoch_us(NOW - 2 * DAY)
    assert history.summaries_of(["act_9"]) == []


def test_late_finishes_name_good_runs_that_ended_after_the_floor(con, history):
    record_sync_run(con, "slow", "act_1", "weekly", TODAY - 27 * DAY, TODAY, NOW - 3 * DAY,
                    took=3 * DAY)
    assert history.late_finishes(NOW - DAY, NOW - timedelta(hours=1)) == [
        ("act_1", epoch_us(NOW))
    ]
    assert history.late_finishes(NOW - DAY, NOW + timedelta(hours=1)) == []


def test_buckets_leave_out_live_reads_unless_the_accounts_are_named(con, history):
    bucket_us = READ_SHAPE.bucket_us
    unnamed = history.good_run_buckets()
    named = history.good_run_buckets(["act_1"])
    # The fill and the daily re-sync start 28 days apart: two buckets.
    assert {row[2] for row in unnamed} == {epoch_us(NOW - 30 * DAY), epoch_us(NOW - 2 * DAY)}
    assert all(row[1] == row[2] // bucket_us for row in unnamed + named)
    assert max(row[2] for row in named) == epoch_us(NOW - timedelta(hours=2))
    assert max(row[2] for row in unnamed) == epoch_us(NOW - 2 * DAY)
    coverage = {start for row in named for start in row[3] or ()}
    assert coverage == {epoch_us(NOW - 30 * DAY)}


def test_chosen_rows_are_the_starts_the_runs_from_a_start_and_those_in_flight(con, history):
    fill = ("act_1", epoch_us(NOW - 30 * DAY))
    rows = history.chosen_rows([fill], {"act_1": NOW - timedelta(hours=2)})
    assert [row[1] for row in rows] == ["fill", "live", "failed", "flight", "flight"]
    with pytest.raises(ValueError):
        history.chosen_rows([], {})


def test_the_good_run_that_finished_last_is_named_by_its_exact_start(con, history):
    # A slow weekly re-sync started before the latest live read and finished after it; its
    # start has microseconds, and it alone (not the live read) is chosen by that start.
    started = NOW - timedelta(hours=3, microseconds=-123_457)
    record_sync_run(con, "slow", "act_1", "weekly", TODAY - 27 * DAY, TODAY, started,
                    took=timedelta(hours=2, minutes=30))
    [summary] = history.summaries_of(["act_1"])
    assert summary[3] == epoch_us(started)
    rows = history.chosen_rows([("act_1", summary[3])], {"act_1": NOW})
    assert [row[1] for row in rows] == ["slow", "flight", "flight"]


def test_a_start_chooses_every_block_that_began_then(con):
    # A run reading an account in two blocks starts both at once: one start, two rows, each
    # once however many of the reads' branches find it.
    for since in (TODAY - 89 * DAY, TODAY - 44 * DAY):
        record_sync_run(con, "fill", "act_1", "backfill", since, since + 44 * DAY, NOW - DAY)
    record_sync_run(con, "other", "act_2", "backfill", TODAY - DAY, TODAY, NOW - DAY)
    reads = ReducedReads(con, READ_SHAPE)
    rows = reads.chosen_rows([("act_1", epoch_us(NOW - DAY))] * 2, {"act_1": NOW - DAY})
    assert [(row[0], row[1], row[3]) for row in rows] == [
        ("act_1", "fill", TODAY - 89 * DAY), ("act_1", "fill", TODAY - 89 * DAY),
        ("act_1", "fill", TODAY - 44 * DAY), ("act_1", "fill", TODAY - 44 * DAY),
    ]
    linked = {"act_1": (NOW - 2 * DAY, "UTC")}
    runs = planner_runs_by_account(reads, linked)["act_1"]
    assert [(run.run_id, run.since) for run in runs] == [
        ("fill", TODAY - 89 * DAY), ("fill", TODAY - 44 * DAY)
    ]


def test_the_planner_refuses_reads_cut_another_way(con, history):
    other = ReducedShape(DAILY_DAYS, WEEKLY_DAYS, READ_SHAPE.bucket_us * 2)
    linked = {"act_1": (NOW - 40 * DAY, "UTC")}
    with pytest.raises(ValueError, match="cut by"):
        planner_runs_by_account(ReducedReads(con, other), linked)
    assert [run.run_id for run in planner_runs_by_account(history, linked)["act_1"]][-3:] == [
        "live", "failed", "flight"
    ]


def test_a_start_far_from_utc_midnight_keeps_its_day(con):
    # The predicates compare UTC day numbers; a start at 23:30 UTC is the next local day
    # east of UTC+1, inside the slack the predicates give.
    at = datetime(2026, 11, 29, 23, 30, tzinfo=UTC)
    record_sync_run(con, "east", "act_1", "live", date(2026, 11, 30), date(2026, 11, 30), at)
    predicates = mark_predicates(DAILY_DAYS, WEEKLY_DAYS)
    [(live,)] = con.execute(f"SELECT {predicates['live']} FROM meta_sync_runs").fetchall()
    assert live

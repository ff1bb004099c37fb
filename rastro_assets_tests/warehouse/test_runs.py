"""`meta_sync_runs` as syncs write it: leases opened and closed, the account lock a lease
takes, the days read completely, and the prune; the same answers on either engine."""

from __future__ import annotations

import threading
import time
from datetime import date, timedelta

import pytest

from rastro_assets.planner.runs import epoch_us, runs_by_account
from rastro_assets.warehouse.ad_spend_table import lock_accounts
from rastro_assets.warehouse.complete_reads import CompleteDay, complete_days, recent_ok_syncs
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets.warehouse.runs import (
    SyncRunEnd,
    SyncRunStart,
    finish_sync_runs,
    open_sync_runs,
    prune_sync_runs,
    record_finished_run,
    start_sync_runs,
)
from rastro_assets_tests.conftest import NOW, record_sync_run

DAY = timedelta(days=1)
D1, D2, D3 = date(2026, 11, 27), date(2026, 11, 28), date(2026, 11, 29)
LOCK_WAIT_SECONDS = 10


def start(run_id: str, account: str = "act_1", since: date = D1, until: date = D3,
          at=NOW) -> SyncRunStart:
    return SyncRunStart(run_id, account, "live", since, until, at, False, None)


def run_ids(con) -> set[str]:
    return {row[0] for row in con.execute("SELECT run_id FROM meta_sync_runs").fetchall()}


def test_a_lease_opens_closes_and_reopens_when_the_run_is_retried(con):
    start_sync_runs(con, [start("r1"), start("r1", "act_2"), start("r1", since=D3)])
    assert sorted(open_sync_runs(con)) == [("r1", "act_1", D1), ("r1", "act_1", D3),
                                           ("r1", "act_2", D1)]
    end = SyncRunEnd(NOW + DAY, "ok", rows_written=3, incomplete_days=(D2, D3))
    finish_sync_runs(con, [(("r1", "act_1", D1), end)])
    assert sorted(open_sync_runs(con, ["act_1"])) == [("r1", "act_1", D3)]

    start_sync_runs(con, [start("r1", at=NOW + 2 * DAY)])  # Dagster re-executes the run

    assert sorted(open_sync_runs(con, ["act_1"])) == [("r1", "act_1", D1), ("r1", "act_1", D3)]
    assert open_sync_runs(con, []) == []


def test_a_finished_run_is_recorded_once_beside_its_own_spend_sync(con):
    ended = SyncRunEnd(NOW + timedelta(minutes=1), "throttled", error="slow down")
    assert record_finished_run(con, start("hand"), ended)
    assert not record_finished_run(con, start("hand", since=D2), ended)
    assert con.execute(
        "SELECT run_id, since, outcome, error FROM meta_sync_runs"
    ).fetchall() == [("hand", D1, "throttled", "slow down")]


def test_a_run_records_the_limit_that_held_it_and_its_own_usage(con):
    start_sync_runs(con, [start("r1"), start("r1", "act_2")])
    held = SyncRunEnd(
        NOW + DAY, "throttled", error="RATE_LIMITED: (#80000) too many calls", usage_pct=100.0,
        regain_at=NOW + DAY + timedelta(minutes=7), rate_limit="ads_insights",
        account_usage_pct=100.0,
    )
    slowed = SyncRunEnd(NOW + DAY, "ok", usage_pct=91.0, account_usage_pct=4.5)
    finish_sync_runs(con, [(("r1", "act_1", D1), held), (("r1", "act_2", D1), slowed)])
    runs = runs_by_account(sync_run_rows(con))
    [throttled], [good] = runs["act_1"], runs["act_2"]
    assert (throttled.rate_limit, throttled.account_usage_pct) == ("ads_insights", 100.0)
    assert throttled.regain_at == NOW + DAY + timedelta(minutes=7)
    assert (good.rate_limit, good.usage_pct, good.account_usage_pct) == (None, 91.0, 4.5)


def test_complete_days_leave_out_a_truncated_day_of_that_read_only(con):
    # r1 reads D1..D3 but leaves D2 incomplete; r2 reads D2..D3 later; r3 failed; r4 is
    # unfinished. act_2's read starts before `first` and is cut to it.
    record_sync_run(con, "r1", "act_1", "live", D1, D3, NOW)
    finish_sync_runs(con, [(("r1", "act_1", D1),
                            SyncRunEnd(NOW + timedelta(seconds=5), "ok", incomplete_days=(D2,)))])
    record_sync_run(con, "r2", "act_1", "live", D2, D3, NOW + timedelta(hours=1))
    record_sync_run(con, "r3", "act_1", "live", D1, D3, NOW + 2 * timedelta(hours=1),
                    outcome="other")
    start_sync_runs(con, [start("r4", at=NOW + 3 * timedelta(hours=1))])
    record_sync_run(con, "r5", "act_2", "backfill", D1 - 30 * DAY, D1, NOW)

    first_finish, second_finish = NOW + timedelta(seconds=5), NOW + timedelta(hours=1, seconds=5)
    assert complete_days(con, D1) == [
        CompleteDay("act_1", D1, "r1", epoch_us(first_finish)),
        CompleteDay("act_1", D2, "r2", epoch_us(second_finish)),
        CompleteDay("act_1", D3, "r2", epoch_us(first_finish)),
        CompleteDay("act_2", D1, "r5", epoch_us(first_finish)),
    ]
    assert complete_days(con, D2, ad_account_ids=["act_1"], excluded_run_ids={"r2"}) == [
        CompleteDay("act_1", D3, "r1", epoch_us(first_finish)),
    ]
    assert complete_days(con, D1, ad_account_ids=[]) == []
    assert recent_ok_syncs(con, NOW + timedelta(minutes=1)) == [("act_1", "r2")]


def test_of_two_reads_finished_at_once_the_greater_run_id_read_the_day_last(con):
    for run_id in ("r-b", "r-a"):
        record_sync_run(con, run_id, "act_1", "live", D1, D1, NOW)
    assert [day.run_id for day in complete_days(con, D1)] == ["r-b"]


def test_an_old_live_read_at_the_instant_of_a_run_that_stays_bridges_only_its_neighbours(con):
    old = NOW - 100 * DAY
    record_sync_run(con, "fill", "act_1", "backfill", D1, D1, old)
    # A daily re-sync and a live read started at the same instant: the re-sync stays, and
    # is no neighbour of the live read; its neighbours are the fill and the last run.
    record_sync_run(con, "daily", "act_1", "daily", D1, D1, old + 2 * DAY)
    record_sync_run(con, "live", "act_1", "live", D1, D1, old + 2 * DAY)
    record_sync_run(con, "last", "act_1", "live", D1, D1, old + 4 * DAY)
    record_sync_run(con, "failed", "act_1", "live", D1, D1, old + DAY, outcome="other")
    start_sync_runs(con, [start("unfinished", at=old + 3 * DAY)])

    assert prune_sync_runs(con, NOW - 35 * DAY, 4 * DAY - timedelta(microseconds=1)) == 1
    assert run_ids(con) == {"fill", "daily", "live", "last", "unfinished"}
    assert prune_sync_runs(con, NOW - 35 * DAY, 4 * DAY) == 1
    assert run_ids(con) == {"fill", "daily", "last", "unfinished"}


def test_the_prune_deletes_one_block_of_a_run_and_keeps_its_other(con):
    old = NOW - 100 * DAY
    record_sync_run(con, "fill", "act_1", "backfill", D1, D1, old)
    record_sync_run(con, "live", "act_1", "live", D1, D1, old + DAY)
    record_sync_run(con, "live", "act_1", "live", D2, D2, old + DAY, outcome="other")
    record_sync_run(con, "last", "act_1", "live", D1, D1, old + 2 * DAY)
    record_sync_run(con, "recent", "act_2", "live", D1, D1, NOW, outcome="other")

    assert prune_sync_runs(con, NOW - 35 * DAY, 3 * DAY) == 2
    assert con.execute(
        "SELECT run_id, ad_account_id, since FROM meta_sync_runs ORDER BY started_at"
    ).fetchall() == [("fill", "act_1", D1), ("last", "act_1", D1), ("recent", "act_2", D1)]


@pytest.mark.engines("postgres")
def test_a_lease_waits_for_a_writer_holding_its_account_and_then_fences_it(warehouse, con):
    # A spend write holds act_1's row (as `lock_accounts` takes it) while it checks that no
    # newer sync started. A sync of act_1 starting meanwhile waits for that write to end,
    # so the check never misses a start that commits before the write does.
    con.execute(
        "INSERT INTO meta_ad_accounts (ad_account_id, connection_id, timezone, currency)"
        " VALUES ('act_1', 'c1', 'UTC', 'BRL'), ('act_2', 'c1', 'UTC', 'BRL')"
    )
    started = threading.Event()
    failures: list[BaseException] = []

    def open_lease() -> None:
        try:
            with warehouse.connect() as other:
                start_sync_runs(other, [start("newer", "act_2"), start("newer", "act_1")])
            started.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    with transaction(con):
        lock_accounts(con, ["act_1"])
        opener = threading.Thread(target=open_lease, daemon=True)
        opener.start()
        waiting = _wait_for_a_blocked_backend(con)
        # The writer's check, under the lock: no newer sync, and none can start until it ends.
        newer = con.execute(
            "SELECT count(*) FROM meta_sync_runs WHERE ad_account_id = 'act_1'"
        ).fetchone()[0]
        assert (waiting, started.is_set(), newer) == (True, False, 0)
    opener.join(LOCK_WAIT_SECONDS)
    assert not failures and started.is_set()
    assert sorted(open_sync_runs(con)) == [("newer", "act_1", D1), ("newer", "act_2", D1)]


def _wait_for_a_blocked_backend(con) -> bool:
    """Whether another backend comes to wait on a lock within the deadline."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while time.monotonic() < deadline:
        # pg_locks is read afresh by each statement; pg_stat_activity, once a transaction.
        blocked = con.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]
        if blocked:
            return True
        time.sleep(0.02)
    return False


"""Pruning `meta_sync_runs` (`warehouse.runs`) deletes what nothing needs and changes no plan."""

from __future__ import annotations

from datetime import date, timedelta

import pyarrow as pa
import pytest

from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.planner.rules import GAP_AFTER
from rastro_assets.settings import load_time
from rastro_assets.timekeeping import local_date, local_midnight
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.runs import prune_sync_runs
from rastro_assets_tests.conftest import NOW, record_sync_run
from rastro_assets_tests.planner.history import COLUMNS, History

TODAY = date(2026, 11, 30)  # act_1's local today at NOW


def record(con, run_id, kind, started_at, outcome="ok"):
    record_sync_run(con, run_id, "act_1", kind, TODAY, TODAY, started_at, outcome=outcome,
                    took=timedelta(seconds=3))


def test_sync_run_pruning_keeps_what_the_planner_needs(con, linked_account):
    old = NOW - timedelta(days=100)
    record(con, "backfill", "backfill", old)
    record(con, "old-live", "live", old + timedelta(days=1))
    record(con, "old-failure", "live", old + timedelta(days=2), outcome="other")
    record(con, "last-ok", "live", old + timedelta(days=3))
    record(con, "recent-failure", "live", NOW - timedelta(days=1), outcome="throttled")

    assert prune_sync_runs(con, NOW - timedelta(days=35), GAP_AFTER) == 2
    kept = {row[0] for row in con.execute("SELECT run_id FROM meta_sync_runs").fetchall()}
    assert kept == {"backfill", "last-ok", "recent-failure"}


def test_an_old_live_read_stays_where_its_neighbours_are_a_pause_apart(con, linked_account):
    old = NOW - timedelta(days=100)
    record(con, "backfill", "backfill", old)
    record(con, "old-live", "live", old + timedelta(days=1))
    record(con, "last-ok", "live", old + timedelta(days=3))

    # The runs that stay either side of the live read start 3 days apart: a pause of over
    # 2 days is one the planner would fill, so the read that bridges it stays.
    assert prune_sync_runs(con, NOW - timedelta(days=35), timedelta(days=2)) == 0
    assert prune_sync_runs(con, NOW - timedelta(days=35), timedelta(days=3)) == 1


TIMEZONE = "America/Sao_Paulo"
LINKED_AT = NOW - timedelta(days=90)
# A live sync is due now; the next 04:00 local re-sync, 20 hours later.
INSTANTS = [NOW, NOW + timedelta(hours=20)]


def insert_runs(con, rows) -> None:
    """Append `rows` (dicts of `COLUMNS`) to `meta_sync_runs` in start order, as syncs do."""
    rows = sorted(rows, key=lambda row: row["started_at"])
    table = pa.table({name: pa.array([row[name] for row in rows], kind) for name, kind in COLUMNS})
    con.register("incoming_runs", table)
    names = ", ".join(name for name, _ in COLUMNS)
    con.execute(f"INSERT INTO meta_sync_runs ({names}) SELECT * FROM incoming_runs")
    con.unregister("incoming_runs")


@pytest.fixture
def linked(con) -> History:
    """`act_1` linked 90 days ago, its 90-day backfill read at linking; no other run yet."""
    site_store.add_site(con, "s1", "Site one", LINKED_AT)
    registry.save_connection(con, "c1", b"\0" * 40, LINKED_AT)
    link_store.link_account(con, "s1", "act_1", "c1", TIMEZONE, "BRL", LINKED_AT)
    history = History("act_1", TIMEZONE, LINKED_AT)
    history.backfill(LINKED_AT + timedelta(minutes=1))
    return history


def assert_default_pruning_changes_no_plan(con) -> None:
    """Prune as the retention sensor does; the sensors' loader and every row still give the
    plans of the unpruned history, a live sync now and the daily re-sync at 04:00."""
    [unpruned] = planned_accounts(con, full_history=True)
    owed = [cadence.plan(unpruned.state, at) for at in INSTANTS]
    assert [plan.kind for plan in owed] == ["live", "daily"]

    pruned = prune_sync_runs(con, NOW - load_time().retention.sync_runs, GAP_AFTER)

    assert pruned > 500  # the live syncs older than the retention age, or most of them
    for account in (*planned_accounts(con), *planned_accounts(con, full_history=True)):
        for at, expected in zip(INSTANTS, owed, strict=True):
            plan = cadence.plan(account.state, at)
            assert plan.kind not in ("gap", "backfill"), plan.reason
            assert plan == expected


def test_pruning_a_steady_history_does_not_make_a_gap(con, linked):
    # A live sync every 45 minutes and the 04:00 re-sync (7 days and the catalog; 28 days
    # every seventh day) from the link to now. Pruning only ok backfills and gaps made the
    # 55 days between the backfill and the retention age a pause, and a gap owed.
    linked.cadence(LINKED_AT + timedelta(minutes=10), NOW - timedelta(minutes=5))
    insert_runs(con, linked.rows)
    assert_default_pruning_changes_no_plan(con)


def test_pruning_keeps_the_last_good_run_before_a_filled_pause(con, linked):
    # Syncs stop at 02:30 local, before that day's 04:00 re-sync, for 30 days: the last good
    # run before the pause is a live read, and the gap the planner then owes starts the day
    # before it. Were it pruned, the pause would start at the re-sync the day before, and the
    # filled gap would be owed again from one day earlier.
    paused_on = local_date(NOW - timedelta(days=60), TIMEZONE)
    paused_at = local_midnight(paused_on, TIMEZONE) + timedelta(hours=2, minutes=30)
    linked.cadence(LINKED_AT + timedelta(minutes=10), paused_at)
    insert_runs(con, linked.rows)
    resumed = paused_at + timedelta(days=30)
    [account] = planned_accounts(con)
    gap = cadence.plan(account.state, resumed)
    assert (gap.kind, gap.since) == ("gap", paused_on - timedelta(days=1))
    before = len(linked.rows)
    for block, (since, until) in enumerate(cadence.split_blocks(gap.since, gap.until)):
        linked.run("gap", since, until, resumed + timedelta(minutes=block))
    linked.cadence(resumed + timedelta(minutes=10), NOW - timedelta(minutes=5))
    insert_runs(con, linked.rows[before:])
    assert_default_pruning_changes_no_plan(con)

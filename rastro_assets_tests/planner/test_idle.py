"""Idle accounts: no spend today or yesterday and no ACTIVE ad, read live every 3 hours.

Pure planner tests on pinned instants, then the loader on a real DuckDB warehouse.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from rastro_assets.meta.models import Ad, InsightRow, insight_table
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.planner.state import AccountState, Delivery, SyncRun
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.account_states import recent_deliveries
from rastro_assets.warehouse.ad_spend_table import write_spend
from rastro_assets.warehouse.catalog import upsert_catalog
from rastro_assets_tests.conftest import record_sync_run

MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
LINKED = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
TODAY = date(2026, 11, 30)
BACKFILLED = LINKED + 2 * MIN  # after the 04:00 slot: it counts as the day's re-sync
IDLE = Delivery()


def good_run(since: date, until: date, started: datetime, kind: str, catalog: bool) -> SyncRun:
    return SyncRun(
        run_id=f"{kind}-{started.isoformat()}",
        kind=kind,
        since=since,
        until=until,
        started_at=started,
        finished_at=started + MIN,
        outcome="ok",
        catalog=catalog,
    )


def backfill(started: datetime = BACKFILLED) -> SyncRun:
    return good_run(TODAY - timedelta(days=89), TODAY, started, "backfill", True)


def live(started: datetime) -> SyncRun:
    today = started.date()
    return good_run(today - DAY, today, started, "live", False)


def account(runs, delivery: Delivery | None = IDLE) -> AccountState:
    return AccountState(
        ad_account_id="act_1",
        timezone="UTC",
        linked_at=LINKED,
        connection_status="active",
        connection_error=None,
        token_sealed_at=LINKED - DAY,
        sync_requested_at=None,
        runs=tuple(runs),
        delivery=delivery,
    )


def test_an_idle_account_is_read_live_three_hours_after_its_last_live_sync():
    owed = cadence.plan(account([backfill()]), BACKFILLED + 50 * MIN)
    assert (owed.kind, owed.since, owed.until, owed.catalog) == ("live", TODAY - DAY, TODAY, False)
    assert owed.due_at == BACKFILLED + 3 * HOUR
    assert not owed.is_due(BACKFILLED + 3 * HOUR - MIN)
    assert owed.reason == (
        "idle: no spend today or yesterday and no ACTIVE ad; live read every 3 h"
    )
    # A live read that still finds nothing keeps it at 3 hours.
    quiet = account([backfill(), live(BACKFILLED + 3 * HOUR)])
    assert cadence.plan(quiet, BACKFILLED + 4 * HOUR).due_at == BACKFILLED + 6 * HOUR
    assert cadence.status(quiet, BACKFILLED + 4 * HOUR).next_sync_at == BACKFILLED + 6 * HOUR


def test_an_idle_account_returns_to_the_45_minute_cadence_on_the_first_spend():
    first_spend = BACKFILLED + 3 * HOUR
    runs = [backfill(), live(first_spend)]
    # The live read at 3 hours wrote the account's first spend of today: the next plan
    # is 45 minutes after it, not 3 hours.
    woke = account(runs, Delivery(last_spend_day=TODAY))
    owed = cadence.plan(woke, first_spend + 2 * MIN)
    assert owed.due_at == first_spend + 45 * MIN
    assert owed.reason == "live read of today and yesterday every 45 min"
    assert cadence.plan(account(runs), first_spend + 2 * MIN).due_at == first_spend + 3 * HOUR


def test_spend_yesterday_keeps_the_45_minutes_and_spend_before_that_does_not():
    runs = [backfill()]
    at = BACKFILLED + 10 * MIN
    yesterday = account(runs, Delivery(last_spend_day=TODAY - DAY))
    assert cadence.plan(yesterday, at).due_at == BACKFILLED + 45 * MIN
    before = account(runs, Delivery(last_spend_day=TODAY - 2 * DAY))
    assert cadence.plan(before, at).due_at == BACKFILLED + 3 * HOUR
    # The next local day, yesterday's spend is two days old.
    next_day = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    runs = [backfill(), good_run(TODAY - timedelta(days=6), TODAY + DAY, next_day - 5 * HOUR,
                                 "daily", True), live(next_day)]
    spent_today = account(runs, Delivery(last_spend_day=TODAY))
    assert cadence.plan(spent_today, next_day + MIN).due_at == next_day + 45 * MIN
    old = account(runs, Delivery(last_spend_day=TODAY - DAY))
    assert cadence.plan(old, next_day + MIN).due_at == next_day + 3 * HOUR


def test_an_active_ad_keeps_an_account_without_spend_at_45_minutes():
    owed = cadence.plan(account([backfill()], Delivery(active_ad=True)), BACKFILLED + MIN)
    assert owed.due_at == BACKFILLED + 45 * MIN
    assert not owed.reason.startswith("idle")


def test_an_account_whose_delivery_is_unknown_is_not_idle():
    owed = cadence.plan(account([backfill()], delivery=None), BACKFILLED + MIN)
    assert owed.due_at == BACKFILLED + 45 * MIN


def test_idle_accounts_keep_their_daily_and_weekly_re_syncs():
    slot = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
    # A live read at 02:30 would next come at 05:30: the daily re-sync at 04:00 comes first.
    night = account([backfill(), live(slot - 90 * MIN)])
    waiting = cadence.plan(night, slot - 80 * MIN)
    assert (waiting.kind, waiting.due_at) == ("live", slot)
    assert waiting.reason.startswith("idle: ") and waiting.reason.endswith(
        "the daily re-sync starts at 04:00"
    )
    daily = cadence.plan(night, slot + MIN)
    assert (daily.kind, daily.since, daily.until, daily.catalog, daily.due_at) == (
        "daily", date(2026, 11, 25), date(2026, 12, 1), True, slot
    )
    week_later = slot + timedelta(days=7)
    runs = [backfill(), *(
        good_run(day.date() - timedelta(days=6), day.date(), day, "daily", True)
        for day in (slot + timedelta(days=offset) for offset in range(7))
    )]
    weekly = cadence.plan(account(runs), week_later + MIN)
    assert (weekly.kind, weekly.since, weekly.due_at) == (
        "weekly", date(2026, 11, 11), week_later
    )


def test_an_idle_interval_of_45_minutes_turns_idling_off():
    state = account([backfill()])
    owed = cadence.plan(state, BACKFILLED + MIN, idle_interval=45 * MIN)
    assert owed.due_at == BACKFILLED + 45 * MIN
    assert owed.reason == "live read of today and yesterday every 45 min"
    assert cadence.is_stale(state, BACKFILLED + HOUR, idle_interval=45 * MIN)
    four_hours = cadence.plan(state, BACKFILLED + MIN, idle_interval=4 * HOUR)
    assert four_hours.due_at == BACKFILLED + 4 * HOUR
    assert four_hours.reason.endswith("live read every 4 h")


def test_an_idle_account_is_stale_only_past_its_own_interval():
    idle = account([backfill()])
    assert not cadence.is_stale(idle, BACKFILLED + 3 * HOUR)
    assert cadence.is_stale(idle, BACKFILLED + 3 * HOUR + 6 * MIN)
    delivering = account([backfill()], Delivery(last_spend_day=TODAY))
    assert not cadence.is_stale(delivering, BACKFILLED + 50 * MIN)
    assert cadence.is_stale(delivering, BACKFILLED + 51 * MIN)


# -- The loader, on a real warehouse ----------------------------------------------------

ACCOUNTS = {
    "act_10": "spends today",
    "act_11": "spent yesterday in Auckland",
    "act_12": "rows of zero spend only",
    "act_13": "an ACTIVE ad, no spend",
    "act_14": "a PAUSED ad, spend three days ago",
    "act_15": "nothing at all",
}
TIMEZONES = {"act_11": "Pacific/Auckland"}


def spend(con, account: str, day: date, amount: str, ad: str = "a1",
          at: datetime = BACKFILLED + MIN) -> None:
    rows = insight_table([InsightRow(f"{account}-{ad}", day, Decimal(amount), 100, 2, 0)])
    write_spend(con, account, days=[day], rows=rows, complete_days=[day], synced_at=at)


@pytest.fixture
def warehouse_accounts(con):
    site_store.add_site(con, "s1", "Site", LINKED - DAY)
    registry.save_connection(con, "c1", b"\0" * 40, LINKED - DAY)
    for index, ad_account_id in enumerate(ACCOUNTS):
        timezone = TIMEZONES.get(ad_account_id, "UTC")
        link_store.link_account(con, "s1", ad_account_id, "c1", timezone, "USD", LINKED)
        record_sync_run(con, f"b{index}", ad_account_id, "backfill",
                        TODAY - timedelta(days=89), TODAY + DAY, BACKFILLED, catalog=True)
    spend(con, "act_10", TODAY, "12.3400")
    spend(con, "act_10", TODAY - timedelta(days=40), "1.0000", ad="a2")
    spend(con, "act_11", TODAY - DAY, "0.0100")
    spend(con, "act_12", TODAY, "0.0000")
    spend(con, "act_12", TODAY - DAY, "0.0000")
    upsert_catalog(con, "act_13", [Ad("act_13-a1", effective_status="ACTIVE"),
                                   Ad("act_13-a2", effective_status="PAUSED")],
                   BACKFILLED, refile=True)
    upsert_catalog(con, "act_14", [Ad("act_14-a1", effective_status="PAUSED")],
                   BACKFILLED, refile=True)
    spend(con, "act_14", TODAY - 3 * DAY, "5.0000")
    return con


def test_planned_accounts_loads_each_account_s_delivery(warehouse_accounts):
    con = warehouse_accounts
    at = BACKFILLED + 50 * MIN
    for full_history in (False, True):
        planned = {
            a.state.ad_account_id: a.state for a in planned_accounts(con, full_history=full_history)
        }
        idle = {
            account: cadence.is_idle(state, local_date(at, state.timezone))
            for account, state in planned.items()
        }
        assert idle == {
            "act_10": False, "act_11": False, "act_12": True,
            "act_13": False, "act_14": True, "act_15": True,
        }, ACCOUNTS
        due = {account: cadence.plan(state, at).due_at for account, state in planned.items()}
        assert due == {
            account: BACKFILLED + (3 * HOUR if idle[account] else 45 * MIN)
            for account in ACCOUNTS
        }
    assert planned["act_10"].delivery == Delivery(last_spend_day=TODAY, active_ad=False)
    assert planned["act_13"].delivery == Delivery(last_spend_day=None, active_ad=True)
    [named] = planned_accounts(con, ["act_10"])
    assert named.state.delivery == planned["act_10"].delivery
    assert recent_deliveries(con, []) == {}


def test_the_first_spend_written_wakes_an_idle_account(warehouse_accounts):
    con = warehouse_accounts
    woke_at = BACKFILLED + 3 * HOUR
    record_sync_run(con, "live-1", "act_15", "live", TODAY - DAY, TODAY, woke_at)
    [before] = planned_accounts(con, ["act_15"])
    assert cadence.plan(before.state, woke_at + 5 * MIN).due_at == woke_at + 3 * HOUR
    spend(con, "act_15", TODAY, "0.5000", at=woke_at + MIN)
    [after] = planned_accounts(con, ["act_15"])
    owed = cadence.plan(after.state, woke_at + 5 * MIN)
    assert owed.due_at == woke_at + 45 * MIN
    assert owed.reason == "live read of today and yesterday every 45 min"

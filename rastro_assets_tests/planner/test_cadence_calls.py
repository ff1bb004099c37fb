"""The cadence's Meta calls per account-day, over two simulated days of sensor ticks: the
reference's 33.0 for an account that delivers and 9.0 for an idle one, however busy the
app's share of Meta's limits is."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from rastro_assets.planner import cadence
from rastro_assets.planner.state import AccountState, Delivery, SyncRun
from rastro_assets.timekeeping import local_date

START = datetime(2026, 11, 30, tzinfo=UTC)
TICK = timedelta(minutes=1)
SYNC_TOOK = timedelta(seconds=30)
ADS = 20
PAGE_SIZE = 500
"""An account's ads and Meta's page: a read asks one page for each 500 ad-days, and one
more for the catalog."""


def meta_calls(plan: cadence.Plan) -> int:
    days = (plan.until - plan.since).days + 1
    return -(-days * ADS // PAGE_SIZE) + (-(-ADS // PAGE_SIZE) if plan.catalog else 0)


def backfilled(account: str, timezone: str, delivery: Delivery) -> AccountState:
    linked = START - timedelta(days=2)
    today = local_date(linked, timezone)
    backfill = SyncRun("fill", "backfill", today - timedelta(days=89), today, linked,
                       linked + timedelta(minutes=2), "ok", catalog=True)
    return AccountState(account, timezone, linked, "active", None, linked - timedelta(minutes=1),
                        None, [backfill], delivery)


def calls_per_day(state: AccountState, app_pct: float, own_pct: float) -> float:
    """Tick the planner for 48 hours, syncing the account whenever its read is due; the Meta
    calls of the second day (a steady one). Every sync reports the app's share at `app_pct`
    and the account's own at `own_pct`."""
    runs = list(state.runs)
    calls, now, checked_from = 0, START, START
    steady_from = START + timedelta(hours=24)
    while now < START + timedelta(hours=48):
        if now >= checked_from:
            plan = cadence.plan(state, now)
            if plan.kind in ("live", "daily", "weekly") and plan.is_due(now):
                runs.append(SyncRun(
                    f"w{len(runs)}", plan.kind, plan.since, plan.until, now, now + SYNC_TOOK,
                    "ok", catalog=plan.catalog, usage_pct=max(app_pct, own_pct),
                    account_usage_pct=own_pct,
                ))
                state = AccountState(**{**state.__dict__, "runs": runs})
                calls += meta_calls(plan) if now >= steady_from else 0
            else:
                # A plan only changes when its due time comes or a run ends.
                checked_from = plan.due_at or now + TICK
        now += TICK
    return float(calls)


@pytest.mark.parametrize("app_pct", [5.0, 90.0, 100.0])
def test_the_cadences_calls_per_account_day_stay_the_references(app_pct):
    found = Counter()
    for name, delivery, timezone in (
        ("active", Delivery(active_ad=True), "America/Sao_Paulo"),
        ("idle", Delivery(), "Asia/Tokyo"),
    ):
        found[name] = calls_per_day(backfilled(f"act_{name}", timezone, delivery), app_pct, 12.0)
    assert found == {"active": 33.0, "idle": 9.0}

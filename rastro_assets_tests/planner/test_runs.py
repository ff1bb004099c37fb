"""The planner's state built from values the warehouse read: run rows as `SyncRun`s, and
each linked account's state from its link, its delivery and its runs. Plain values only."""

from __future__ import annotations

from datetime import UTC, date, datetime

from rastro_assets.planner.history import planned_from
from rastro_assets.planner.runs import epoch_us, instant, runs_by_account
from rastro_assets.planner.state import Delivery, SyncRun
from rastro_assets.warehouse.account_states import LinkedState

STARTED = datetime(2026, 11, 30, 12, 0, 0, 250, tzinfo=UTC)
FINISHED = datetime(2026, 11, 30, 12, 0, 41, tzinfo=UTC)
REGAIN = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)


def row(account, run_id, *, finished=FINISHED, incomplete=None, catalog=True):
    return (
        account, run_id, "live", date(2026, 11, 29), date(2026, 11, 30), epoch_us(STARTED),
        None if finished is None else epoch_us(finished), "ok", None, catalog, 12.5,
        epoch_us(REGAIN), incomplete, "ads_insights", 97.5,
    )


def test_rows_become_runs_grouped_by_account_in_the_rows_order():
    rows = [
        row("act_1", "r1", incomplete="2026-11-29,2026-11-30"),
        row("act_1", "r2", finished=None, catalog=None),
        row("act_2", "r3"),
    ]
    history = runs_by_account(rows)
    assert list(history) == ["act_1", "act_2"]
    assert [run.run_id for run in history["act_1"]] == ["r1", "r2"]
    first, unfinished = history["act_1"]
    assert first == SyncRun(
        "r1", "live", date(2026, 11, 29), date(2026, 11, 30), STARTED, FINISHED, "ok", None,
        True, 12.5, REGAIN, (date(2026, 11, 29), date(2026, 11, 30)), "ads_insights", 97.5,
    )
    assert (unfinished.finished_at, unfinished.catalog, unfinished.incomplete_days) == (
        None, False, ()
    )
    assert runs_by_account([]) == {}


def test_instants_round_trip_through_microseconds():
    assert instant(epoch_us(STARTED)) == STARTED
    assert instant(None) is None
    assert epoch_us(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1_000_000


def link(account, *, status="active", sites=("s1",), shard=0) -> LinkedState:
    return LinkedState(
        ad_account_id=account, timezone="Asia/Tokyo", linked_at=STARTED,
        sync_requested_at=REGAIN, connection_id="c1", status=status,
        last_error="Meta said no" if status == "invalid" else None,
        sealed_at=STARTED if status else None, sites=sites, shard=shard,
    )


def test_planned_from_joins_each_link_to_its_delivery_and_runs():
    runs = runs_by_account([row("act_1", "r1")])
    planned = planned_from(
        [link("act_1", sites=("s1", "s2"), shard=2), link("act_2", status="invalid")],
        {"act_1": (date(2026, 11, 30), True)},
        runs,
    )
    assert [account.ad_account_id for account in planned] == ["act_1", "act_2"]
    first, second = planned
    assert (first.sites, first.shard, first.connection_id) == (("s1", "s2"), 2, "c1")
    assert first.state.runs == runs["act_1"]
    assert first.state.delivery == Delivery(last_spend_day=date(2026, 11, 30), active_ad=True)
    assert (first.state.connection_status, first.state.connection_error) == ("active", None)
    assert (first.state.timezone, first.state.linked_at, first.state.sync_requested_at) == (
        "Asia/Tokyo", STARTED, REGAIN
    )
    assert first.state.connection_id == "c1"
    # No runs, no recent delivery: an empty history, and nothing delivered.
    assert (second.state.runs, second.state.delivery) == ([], Delivery())
    assert (second.state.connection_status, second.state.connection_error) == (
        "invalid", "Meta said no"
    )


def test_an_account_whose_connection_is_missing_is_paused_by_no_connection():
    [planned] = planned_from([link("act_1", status=None)], {}, {})
    assert planned.state.connection_status == "invalid"
    assert planned.state.connection_error == "the connection is missing"
    assert (planned.state.connection_id, planned.connection_id) == (None, "c1")
    assert planned.state.token_sealed_at is None

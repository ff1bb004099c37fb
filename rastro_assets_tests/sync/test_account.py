"""The sync core against the fake Graph: truth, reconciliation, failures, outcomes."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest

from rastro_assets.planner.runs import runs_by_account
from rastro_assets.sync import reader
from rastro_assets.sync.types import SyncRefused, SyncRequest
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import TOKEN, record_sync_run
from rastro_assets_tests.truth import assert_equals_truth, stored_rows
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.world import Figures

SAO_PAULO_TODAY = date(2026, 11, 30)  # 12:00 UTC is 09:00 in Sao Paulo
TOKYO_TODAY = date(2026, 11, 30)  # and 21:00 in Tokyo

# What these check happens on Meta's side of the sync or before it writes; the statements
# they pass through run on both engines in the tests around them, so once is enough.
META_SIDE = pytest.mark.engines("duckdb")


def week(until: date = SAO_PAULO_TODAY) -> tuple[date, date]:
    return until - timedelta(days=6), until


def test_a_sync_makes_the_warehouse_equal_meta(syncer, warehouse, linked_world):
    since, until = week()
    outcome = syncer.sync(SyncRequest("act_101", since, until, run_id="r1"))
    assert outcome.ok, outcome.error
    assert outcome.complete_days == [since + timedelta(days=n) for n in range(7)]
    assert outcome.rows_written > 0 and outcome.rows_deleted == 0
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", since, until)
        assert_site_spend_exact(con)
        [run] = runs_by_account(sync_run_rows(con))["act_101"]
    assert (run.outcome, run.kind, run.since, run.until) == ("ok", "manual", since, until)
    assert run.finished_at is not None


def test_jpy_spend_is_exact_whole_yen(syncer, warehouse, linked_world):
    outcome = syncer.sync(SyncRequest("act_202", TOKYO_TODAY - timedelta(days=2), TOKYO_TODAY))
    assert outcome.ok
    with warehouse.connect() as con:
        spends = [row[0] for row in con.execute("SELECT spend FROM ad_spend_daily").fetchall()]
    assert spends and all(spend == spend.to_integral_value() for spend in spends)


def test_resync_of_unchanged_meta_changes_no_figure(syncer, warehouse):
    since, until = week()
    syncer.sync(SyncRequest("act_101", since, until, run_id="r1"))
    with warehouse.connect() as con:
        before = stored_rows(con, "act_101", since, until)
    again = syncer.sync(SyncRequest("act_101", since, until, run_id="r2"))
    assert (again.rows_written, again.rows_deleted) == (0, 0)
    with warehouse.connect() as con:
        assert stored_rows(con, "act_101", since, until) == before


def test_changed_figures_and_vanished_ad_days_are_reconciled(syncer, warehouse, linked_world):
    since, until = week()
    syncer.sync(SyncRequest("act_101", since, until, run_id="r1"))
    with warehouse.connect() as con:
        ad_id, day = con.execute("SELECT ad_id, day FROM ad_spend_daily LIMIT 1").fetchone()
    linked_world.set_ad_day("act_101", ad_id, day, None)
    other = next(row for row in linked_world.truth("act_101", until) if row.ad_id != ad_id)
    linked_world.set_ad_day(
        "act_101", other.ad_id, until, Figures(spend=Decimal("123.45"), impressions=999, clicks=9)
    )
    outcome = syncer.sync(SyncRequest("act_101", since, until, run_id="r2"))
    assert outcome.rows_deleted == 1 and outcome.rows_written >= 1
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", since, until)
        assert_site_spend_exact(con)


def test_a_failed_read_changes_nothing_and_is_classified(syncer, warehouse, linked_world):
    since, until = week()
    syncer.sync(SyncRequest("act_101", since, until, run_id="r1"))
    with warehouse.connect() as con:
        before = stored_rows(con, "act_101", since, until)
    for ad in list(linked_world.truth("act_101", until))[:2]:
        linked_world.set_ad_day("act_101", ad.ad_id, until, None)
    linked_world.fail("insights_page", "permission", account="act_101")
    linked_world.row_cap = 10**6
    outcome = syncer.sync(SyncRequest("act_101", since, until, run_id="r2"))
    assert outcome.outcome == "permission"
    assert outcome.error.startswith("META_PERMISSION: ")
    assert outcome.unread_days == [since + timedelta(days=n) for n in range(7)]
    with warehouse.connect() as con:
        assert stored_rows(con, "act_101", since, until) == before
        [_, failed] = runs_by_account(sync_run_rows(con))["act_101"]
    assert failed.outcome == "permission"


def test_throttling_records_when_access_returns(syncer, warehouse, linked_world, fake_clock):
    linked_world.fail("insights", "throttled", account="act_101", regain_minutes=90)
    outcome = syncer.sync(SyncRequest("act_101", *week(), run_id="r1"))
    assert outcome.outcome == "throttled"
    assert outcome.error.startswith("RATE_LIMITED: ")
    assert outcome.regain_at >= fake_clock() + timedelta(minutes=89)


def test_a_dead_token_invalidates_its_connection(syncer, warehouse, linked_world):
    linked_world.kill_token(TOKEN, subcode=463)
    outcome = syncer.sync(SyncRequest("act_101", *week(), run_id="r1"))
    assert outcome.outcome == "token"
    assert TOKEN not in outcome.error
    with warehouse.connect() as con:
        connection = registry.get_connection(con, "c1")
    assert connection.status == "invalid"
    assert connection.invalid_since is not None
    again = syncer.sync(SyncRequest("act_202", *week(TOKYO_TODAY), run_id="r2"))
    assert again.outcome == "token"
    assert again.api_calls == 0
    with warehouse.connect() as con:
        after_refusal = registry.get_connection(con, "c1")
    # A run refused before reading Meta learns nothing new about the token:
    # the first error and its time stay as Meta gave them.
    assert (after_refusal.last_error, after_refusal.invalid_since) == (
        connection.last_error,
        connection.invalid_since,
    )


@META_SIDE
def test_without_the_key_nothing_syncs(syncer, warehouse, monkeypatch):
    monkeypatch.delenv("RASTRO_SECRETS_KEY")
    outcome = syncer.sync(SyncRequest("act_101", *week(), run_id="r1"))
    assert outcome.outcome == "key"
    assert outcome.error.startswith("SECRETS_KEY_MISSING: ")
    assert "RASTRO_SECRETS_KEY" in outcome.error
    with warehouse.connect() as con:
        assert con.execute("SELECT count(*) FROM ad_spend_daily").fetchone() == (0,)


@META_SIDE
def test_a_day_past_local_today_is_refused(syncer):
    with pytest.raises(SyncRefused, match="after the account's local today"):
        syncer.sync(SyncRequest("act_101", SAO_PAULO_TODAY, SAO_PAULO_TODAY + timedelta(days=1)))


@META_SIDE
def test_a_range_older_than_meta_keeps_is_refused_before_any_read(
    syncer, warehouse, linked_world
):
    """Meta refuses the whole range (#3018): read, it would end failed and back the account
    off as if Meta were down."""
    oldest = date(2023, 10, 30)  # 37 months before Sao Paulo's today
    with pytest.raises(SyncRefused, match=f"before {oldest}, the first day Meta still keeps"):
        syncer.sync(SyncRequest("act_101", oldest - timedelta(days=1), oldest))
    assert linked_world.calls["insights"] == 0
    with warehouse.connect(read_only=True) as con:
        assert sync_run_rows(con) == []


def test_tokyo_today_is_already_tomorrow_for_a_utc_evening(syncer, fake_clock, linked_world):
    fake_clock.advance(hours=10)  # 22:00 UTC: Tokyo is on Dec 1st, Sao Paulo still Nov 30th
    assert syncer.sync(SyncRequest("act_202", date(2026, 12, 1), date(2026, 12, 1))).ok
    with pytest.raises(SyncRefused):
        syncer.sync(SyncRequest("act_101", date(2026, 12, 1), date(2026, 12, 1)))


@META_SIDE
def test_an_unknown_account_is_refused(syncer):
    with pytest.raises(SyncRefused, match="not linked"):
        syncer.sync(SyncRequest("act_999", *week()))


def test_a_day_that_stays_incomplete_keeps_its_old_rows(syncer, warehouse, linked_world):
    day = SAO_PAULO_TODAY - timedelta(days=3)
    syncer.sync(SyncRequest("act_101", day, day, run_id="r1"))
    with warehouse.connect() as con:
        before = stored_rows(con, "act_101", day, day)
    gone = next(iter(linked_world.truth("act_101", day)))
    linked_world.set_ad_day("act_101", gone.ad_id, day, None)
    linked_world.row_cap = 1
    linked_world.fail("async", "job_failed", account="act_101")
    outcome = syncer.sync(SyncRequest("act_101", day, day, run_id="r2"))
    assert outcome.ok
    assert outcome.incomplete_days == [day]
    assert outcome.error.startswith("META_TRUNCATED: ")
    with warehouse.connect() as con:
        assert stored_rows(con, "act_101", day, day) == before
        [_, run] = runs_by_account(sync_run_rows(con))["act_101"]
    assert run.incomplete_days == (day,)


def test_one_run_stamps_one_synced_at(syncer, warehouse, now):
    syncer.sync(SyncRequest("act_101", *week(), run_id="r1"), synced_at=now)
    with warehouse.connect() as con:
        stamps = con.execute("SELECT DISTINCT synced_at FROM ad_spend_daily").fetchall()
    assert stamps == [(now,)]


def test_an_unexpected_error_ends_the_run_as_a_failure(syncer, warehouse):
    def broken_client(token):
        raise RuntimeError("a bug")

    syncer.client_factory = broken_client
    outcome = syncer.sync(SyncRequest("act_101", *week(), run_id="r1"))
    assert outcome.outcome == "other"
    assert outcome.error == "META_UNAVAILABLE: unexpected RuntimeError in the sync"
    with warehouse.connect() as con:
        [run] = runs_by_account(sync_run_rows(con))["act_101"]
    assert (run.outcome, run.finished_at is not None) == ("other", True)


@pytest.fixture
def small_batches(monkeypatch):
    """Every chunk its own batch, so writes go through the writer thread."""
    monkeypatch.setattr(reader, "BATCH_ROWS", 1)


def test_batches_written_beside_the_read_equal_meta(
    syncer, warehouse, linked_world, small_batches
):
    linked_world.row_cap = 12  # a month of six ads reads in chunks of two days
    since, until = SAO_PAULO_TODAY - timedelta(days=29), SAO_PAULO_TODAY
    outcome = syncer.sync(SyncRequest("act_101", since, until, run_id="r1"))
    assert outcome.ok, outcome.error
    assert sorted(outcome.complete_days) == [since + timedelta(days=n) for n in range(30)]
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", since, until)
        assert_site_spend_exact(con)


def test_a_read_failing_after_batches_keeps_the_days_read_before(
    syncer, warehouse, linked_world, small_batches
):
    linked_world.row_cap = 12
    linked_world.fail("insights", "http5xx_html", times=None, account="act_101", skip=12)
    since, until = SAO_PAULO_TODAY - timedelta(days=29), SAO_PAULO_TODAY
    outcome = syncer.sync(SyncRequest("act_101", since, until, run_id="r1"))
    assert outcome.outcome == "other"
    read = sorted(outcome.complete_days)
    assert read and read == [since + timedelta(days=n) for n in range(len(read))]
    assert outcome.unread_days == [day for day in days_between(since, until) if day not in read]
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", read[0], read[-1])
        assert stored_rows(con, "act_101", read[-1] + timedelta(days=1), until) == set()
        assert_site_spend_exact(con)


def test_a_wave_writes_its_accounts_together_and_equals_meta(
    syncer, warehouse, linked_world, now
):
    def wave(run_id: str):
        requests = [
            SyncRequest("act_101", *week(), kind="daily", run_id=run_id),
            SyncRequest("act_202", *week(TOKYO_TODAY), kind="daily", run_id=run_id),
            SyncRequest("act_999", *week(), kind="daily", run_id=run_id),
        ]
        return syncer.sync_wave(requests, synced_at=now, concurrency=2)

    first = wave("w1")
    assert [request.ad_account_id for request, _ in first.refused] == ["act_999"]
    assert all(outcome.ok for outcome in first.outcomes)
    day = SAO_PAULO_TODAY - timedelta(days=2)
    gone = next(iter(linked_world.truth("act_101", day)))
    linked_world.set_ad_day("act_101", gone.ad_id, day, None)
    second = wave("w2")
    by_account = {outcome.request.ad_account_id: outcome for outcome in second.outcomes}
    assert by_account["act_101"].rows_deleted == 1
    assert by_account["act_101"].days[day].rows == len(linked_world.truth("act_101", day))
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", *week())
        assert_equals_truth(con, linked_world, "act_202", *week(TOKYO_TODAY))
        assert_site_spend_exact(con)
        runs = runs_by_account(sync_run_rows(con))
    for account in ("act_101", "act_202"):
        [_, run] = runs[account]
        assert (run.run_id, run.outcome, run.finished_at is not None) == ("w2", "ok", True)


@META_SIDE
def test_a_long_truncation_note_is_cut_like_every_error(syncer, warehouse, linked_world):
    linked_world.row_cap = 1  # every day needs an async report, and every report fails
    linked_world.fail("async", "job_failed", times=None)
    since, until = SAO_PAULO_TODAY - timedelta(days=29), SAO_PAULO_TODAY
    outcome = syncer.sync(SyncRequest("act_101", since, until, run_id="t1"))
    assert outcome.ok and len(outcome.incomplete_days) == 30
    assert outcome.error.startswith("META_TRUNCATED: ") and len(outcome.error) == 300
    with warehouse.connect() as con:
        [run] = runs_by_account(sync_run_rows(con))["act_101"]
    assert run.error == outcome.error


def test_a_throttle_without_a_wait_keeps_the_wait_announced_earlier_in_the_read(
    syncer, warehouse, linked_world, fake_clock
):
    # The read's first call fills the account's ads_insights hour: Meta announces the regain.
    allowed = linked_world.limits.insights_calls(linked_world.active_ads("act_101"))
    linked_world.use_up("act_101", "ads_insights", int(allowed) - 1)
    linked_world.fail("insights_page", "throttled", regain_minutes=0)
    outcome = syncer.sync(SyncRequest("act_101", *week(), run_id="r1"))
    assert outcome.outcome == "throttled"
    announced = outcome.usage.regain_seconds
    assert announced and outcome.regain_at == fake_clock() + timedelta(seconds=announced)
    with warehouse.connect() as con:
        [run] = runs_by_account(sync_run_rows(con))["act_101"]
    assert run.regain_at == outcome.regain_at


def test_a_run_that_no_longer_holds_its_account_writes_nothing(
    syncer, warehouse, linked_world, now
):
    since, until = week()
    with warehouse.connect() as con:  # a sync of act_101 started after this run did
        record_sync_run(con, "newer", "act_101", "manual", since, until,
                        now + timedelta(minutes=1))
    wave = syncer.sync_wave(
        [SyncRequest("act_101", since, until, kind="daily", run_id="w1"),
         SyncRequest("act_202", *week(TOKYO_TODAY), kind="daily", run_id="w1")],
        synced_at=now,
        concurrency=2,
    )
    taken, other = sorted(wave.outcomes, key=lambda outcome: outcome.request.ad_account_id)
    assert taken.outcome == "other" and taken.error.startswith("RUN_TIMEOUT: ")
    assert other.ok
    with warehouse.connect() as con:
        assert stored_rows(con, "act_101", since, until) == set()
        assert_equals_truth(con, linked_world, "act_202", *week(TOKYO_TODAY))
        assert_site_spend_exact(con)
        runs = {run.run_id: run for run in runs_by_account(sync_run_rows(con))["act_101"]}
    assert runs["w1"].error == taken.error

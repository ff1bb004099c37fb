"""The stored incidents, their notices and the daemon's checks, read and written as the
alert ledger does."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from rastro_assets.warehouse import incidents
from rastro_assets.warehouse.incidents import StoredIncident
from rastro_assets_tests.conftest import NOW

MINUTE = timedelta(minutes=1)


def incident(key: str, accounts: tuple[str, ...] = ()) -> StoredIncident:
    return StoredIncident(
        key=key,
        opened_at=NOW,
        kind="stale",
        summary=f"{key} is stale",
        detail="",
        fix="",
        accounts=accounts,
        last_seen_at=NOW,
        notified_at=None,
    )


def test_incidents_keep_their_accounts_until_resolved(con):
    incidents.insert_incident(con, incident("one", ("act_1", "act_2")))
    incidents.insert_incident(con, incident("none"))
    assert [(i.key, i.accounts) for i in incidents.open_incidents(con)] == [
        ("none", ()),
        ("one", ("act_1", "act_2")),
    ]
    resolved = replace(
        incident("one", ("act_2",)), last_seen_at=NOW + MINUTE, resolved_at=NOW + MINUTE
    )
    incidents.update_incident(con, resolved)
    [still_open] = incidents.open_incidents(con)
    assert still_open.key == "none"
    incidents.prune(con, NOW + 2 * MINUTE, keep=MINUTE / 2)
    assert con.execute("SELECT incident_key FROM alert_incidents").fetchall() == [("none",)]


def test_notices_are_tried_again_given_up_or_delivered(con):
    stale = incident("one")
    incidents.insert_incident(con, stale)
    incidents.queue_notices(con, stale, "opened", NOW, ["mail", "hook", "gone"], "s", "b")
    incidents.queue_notices(con, stale, "opened", NOW, ["mail"], "s", "b")
    due = incidents.due_notices(con, NOW, limit=10)
    assert sorted(n.channel_id for n in due) == ["gone", "hook", "mail"]
    by_channel = {notice.channel_id: notice for notice in due}

    assert incidents.abandon_unconfigured(con, ["mail", "hook"], NOW) == 1
    incidents.record_attempt(
        con, by_channel["hook"], NOW, error="timed out", retry_at=NOW + 5 * MINUTE
    )
    incidents.record_attempt(con, by_channel["mail"], NOW, error="refused", retry_at=None)
    assert incidents.due_notices(con, NOW + MINUTE, limit=10) == []
    [again] = incidents.due_notices(con, NOW + 5 * MINUTE, limit=10)
    assert (again.channel_id, again.attempts) == ("hook", 1)
    [trouble] = incidents.channel_troubles(con)
    assert (trouble.channel_id, trouble.waiting, trouble.last_error) == ("hook", 1, "timed out")
    assert trouble.failing_since == NOW

    incidents.record_attempt(con, again, NOW + 5 * MINUTE, error=None, retry_at=None)
    assert incidents.channel_troubles(con) == []
    settled = con.execute(
        "SELECT channel_id, delivered_at IS NOT NULL, abandoned_at IS NOT NULL, attempts"
        " FROM alert_notices ORDER BY channel_id"
    ).fetchall()
    assert settled == [("gone", False, True, 0), ("hook", True, False, 2), ("mail", False, True, 1)]


def test_the_last_check_and_the_first_sync_after_an_instant(con):
    assert incidents.last_check(con, incidents.DAEMON_CHECKER) is None
    incidents.record_check(con, incidents.DAEMON_CHECKER, NOW)
    incidents.record_check(con, incidents.DAEMON_CHECKER, NOW + MINUTE)
    assert incidents.last_check(con, incidents.DAEMON_CHECKER) == NOW + MINUTE

    assert incidents.first_sync_since(con, None) is None
    for minutes, run in ((0, "r0"), (10, "r10")):
        con.execute(
            "INSERT INTO meta_sync_runs (run_id, ad_account_id, since, started_at)"
            " VALUES (?, 'act_1', DATE '2026-11-29', ?)",
            [run, NOW + minutes * MINUTE],
        )
    assert incidents.first_sync_since(con, None) == NOW
    assert incidents.first_sync_since(con, NOW) == NOW + 10 * MINUTE
    assert incidents.first_sync_since(con, NOW + 10 * MINUTE) is None

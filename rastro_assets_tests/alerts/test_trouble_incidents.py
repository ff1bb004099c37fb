"""Each trouble the demo stages, rehearsed on real parts: the fake Graph staging it, the real
syncer and planner deciding when each account is read, and the incidents found the way the
daemon's sensor and `rastro status --check` find them (`alerts.look`), stored by the real
ledger. Each opens one incident after the next sync fails and resolves once the trouble is
taken away and its incident's fix is done, with nothing opened or resolved in between.

The clock is pinned and moved a minute at a time; an account is read only when the planner
says it is due, as the cadence sensor asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from rastro_assets.alerts.incidents import DAEMON_KINDS, IncidentKind
from rastro_assets.alerts.ledger import reconcile
from rastro_assets.alerts.look import warehouse_incidents
from rastro_assets.analytics.publish import Publisher
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.settings import MAX_ALERT_MINUTES, AlertThresholds
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.incidents import open_incidents
from rastro_assets_tests.conftest import NOW, TOKEN, record_sync_run
from rastro_assets_tests.defs.conftest import TODAY

ACCOUNTS = ("act_101", "act_202")
NEW_TOKEN = "EAAnewTOKENr5Jw27KxQm8VtYp03"
# Every threshold at its default but the snapshot's, which is judged on the wall clock.
THRESHOLDS = AlertThresholds(snapshot=timedelta(minutes=MAX_ALERT_MINUTES))
CHECKED = {kind.value for kind in IncidentKind if kind not in DAEMON_KINDS} - {"daemon"}


QUIET_STEP = timedelta(minutes=10)
"""The incident check's spacing while nothing is read: only a threshold can change what it
finds then, and each is minutes long."""


def _minute_up(instant: datetime) -> datetime:
    whole = instant.replace(second=0, microsecond=0)
    return whole if whole == instant else whole + timedelta(minutes=1)


@dataclass
class Rehearsal:
    """The cadence and the daemon's incident check, a minute at a time on a pinned clock."""

    warehouse: object
    syncer: object
    clock: object
    publisher: Publisher
    at: datetime = NOW
    runs: int = 0
    said: list[tuple[str, str, str]] = field(default_factory=list)
    """(event, key, summary) of each transition, in order."""
    synced: list[tuple[datetime, str, str]] = field(default_factory=list)
    busy: bool = True

    def step(self, limit: datetime) -> None:
        """To the next instant something may change, at most `limit`: a minute after a
        sync, an account's due time, or `QUIET_STEP` on; then the cadence's syncs due and
        the incident check, as the daemon's ticks would do them."""
        after = self.at + (timedelta(minutes=1) if self.busy else QUIET_STEP)
        due = [plan.due_at for plan in self.plans() if plan.due_at is not None]
        soonest = min(
            (max(_minute_up(at), self.at + timedelta(minutes=1)) for at in due), default=after
        )
        self.at = min(after, soonest, limit)
        self.clock.set(self.at)
        due_now = [(account, plan) for account, plan in self.due(self.at)]
        for account, plan in due_now:
            self.runs += 1
            request = SyncRequest(
                account.state.ad_account_id, plan.since, plan.until, kind=plan.kind,
                run_id=f"run-{self.runs}", catalog=plan.catalog,
            )
            outcome = self.syncer.sync(request, synced_at=self.at)
            self.synced.append((self.at, request.ad_account_id, str(outcome.outcome)))
        self.busy = bool(due_now)
        with self.warehouse.connect() as con:
            found, _ = warehouse_incidents(con, self.publisher, self.at, THRESHOLDS)
            transitions = reconcile(
                con, found, CHECKED, [], self.at, THRESHOLDS.remind, "rehearsal"
            )
        self.said += [(t.event, t.incident.key, t.incident.summary) for t in transitions]

    def plans(self) -> list:
        with self.warehouse.connect(read_only=True) as con:
            return [cadence.plan(account.state, self.at) for account in planned_accounts(con)]

    def due(self, at: datetime) -> list:
        with self.warehouse.connect(read_only=True) as con:
            return [
                (account, plan)
                for account in planned_accounts(con)
                if (plan := cadence.plan(account.state, at)).is_due(at)
                and plan.since is not None
            ]

    def minutes(self, count: int) -> None:
        end = self.at + timedelta(minutes=count)
        while self.at < end:
            self.step(end)

    def until_said(self, count: int, within: int) -> None:
        """On until `count` transitions have been said, at most `within` minutes."""
        end = self.at + timedelta(minutes=within)
        while len(self.said) < count and self.at < end:
            self.step(end)
        assert len(self.said) >= count, (self.said, self.synced[-5:])

    def sync_now(self, account: str) -> None:
        """`rastro sync-now ACCOUNT`: a sync at the cadence's next tick."""
        with self.warehouse.connect() as con:
            registry.request_sync(con, account, self.at)

    def open_now(self):
        with self.warehouse.connect(read_only=True) as con:
            return {incident.key: incident for incident in open_incidents(con)}


@pytest.fixture
def rehearsal(warehouse, syncer, fake_clock, tmp_path: Path) -> Rehearsal:
    with warehouse.connect() as con:
        for account in ACCOUNTS:
            record_sync_run(
                con, f"backfill-{account}", account, "backfill", TODAY - timedelta(days=89),
                TODAY, NOW - timedelta(minutes=2), catalog=True,
            )
    publisher = Publisher(warehouse, tmp_path / "analytics.duckdb", clock=fake_clock)
    rehearsal = Rehearsal(warehouse, syncer, fake_clock, publisher)
    rehearsal.minutes(3)  # both accounts read live at 12:01
    assert [outcome for _, _, outcome in rehearsal.synced] == ["ok", "ok"]
    assert rehearsal.said == []
    return rehearsal


def opened_after_the_failed_sync(rehearsal: Rehearsal, account: str, within: int = 1):
    """The one incident opened once `account`'s sync failed, at most `within` checks later."""
    [(failed_at, _, outcome)] = [
        each for each in rehearsal.synced[2:] if each[1] == account
    ][:1]
    assert outcome != "ok"
    rehearsal.until_said(1, within + 2)
    [(event, key, _)] = rehearsal.said
    assert event == "opened"
    return key, failed_at




def test_a_dead_token_opens_at_its_first_failed_sync_and_resolves_at_rastro_connect(
    rehearsal, fake_world, vault
):
    fake_world.kill_token(TOKEN)
    rehearsal.sync_now("act_101")  # `rastro demo trouble` asks for a sync
    rehearsal.minutes(2)
    key, failed_at = opened_after_the_failed_sync(rehearsal, "act_101")
    assert key == "token:c1"
    incident = rehearsal.open_now()["token:c1"]
    assert incident.opened_at == failed_at
    assert incident.summary.startswith("connection c1's token is invalid: it pauses 2 accounts")
    assert "`rastro connect c1`" in incident.fix
    rehearsal.minutes(15)
    # Taken away at Meta: the accounts stay paused until the fix is done.
    fake_world.revive_token(TOKEN)
    rehearsal.minutes(10)
    assert [event for event, *_ in rehearsal.said] == ["opened"]
    with rehearsal.warehouse.connect() as con:  # `rastro connect c1`, the token checked
        registry.save_connection(con, "c1", vault.seal("c1", TOKEN), rehearsal.at)
    connected = rehearsal.at
    rehearsal.until_said(2, 3)
    assert rehearsal.said[1][:2] == ("resolved", "token:c1")
    assert rehearsal.at - connected <= timedelta(minutes=2)
    rehearsal.minutes(50)
    assert [event for event, *_ in rehearsal.said] == ["opened", "resolved"]
    read_since = [outcome for at, _, outcome in rehearsal.synced if at > connected]
    assert len(read_since) >= 2 and set(read_since) == {"ok"}


def test_a_throttle_on_one_account_opens_once_at_its_threshold_and_resolves_at_its_retry(
    rehearsal, fake_world, monkeypatch
):
    # The threshold as a rehearsal sets it: a throttle told a minute after it refused.
    rehearsal_thresholds = AlertThresholds(
        rate_limited=timedelta(minutes=1), snapshot=THRESHOLDS.snapshot
    )
    monkeypatch.setattr(f"{__name__}.THRESHOLDS", rehearsal_thresholds)
    fake_world.fail("insights", "throttled_80000", times=None, account="act_101",
                    regain_minutes=10)
    rehearsal.sync_now("act_101")
    rehearsal.minutes(1)
    key, failed_at = opened_after_the_failed_sync(rehearsal, "act_101", within=2)
    assert key == "rate_limited:c1"
    incident = rehearsal.open_now()["rate_limited:c1"]
    assert incident.accounts == ("act_101",)
    assert incident.opened_at - failed_at <= timedelta(minutes=2)
    assert "refused by Meta's rate limits (ads_insights)" in incident.summary
    assert "; next try at " in incident.summary and " UTC" in incident.summary
    # Meta's ten minutes end before its next live read (45 minutes after the last): that
    # read is its retry, as `rastro status` says.
    assert incident.detail.startswith(
        "act_101 (sites s1): retried at 2026-11-30 09:46 America/Sao_Paulo (12:46 UTC), its "
        "next read; refused last by its ads_insights business use case (calls an hour) "
        "(ads_insights); `RATE_LIMITED: "
    )
    assert incident.summary.endswith("every try; next try at 12:46 UTC")
    # Every retry is refused while it lasts: said once, the other account read as ever.
    rehearsal.minutes(50)
    assert [event for event, *_ in rehearsal.said] == ["opened"]
    refused = [at for at, account, outcome in rehearsal.synced if outcome == "throttled"]
    assert len(refused) >= 2
    assert {outcome for _, account, outcome in rehearsal.synced if account == "act_202"} == {"ok"}
    fake_world.clear_failures()
    mended = rehearsal.at
    # Retried when its hold ends: Meta's ten minutes, doubled floors and jitter.
    rehearsal.until_said(2, 40)
    assert rehearsal.said[1][:2] == ("resolved", "rate_limited:c1")
    rehearsal.minutes(20)
    assert [event for event, *_ in rehearsal.said] == ["opened", "resolved"]
    assert [o for at, a, o in rehearsal.synced if a == "act_101" and at > mended][0] == "ok"


@pytest.mark.parametrize(
    "points, failure",
    [(["insights"], "transient"), (["insights", "async", "report"], "timeout")],
    ids=["retry later", "timed out"],
)
def test_a_slow_meta_opens_once_at_the_first_failed_sync_and_resolves_when_it_answers(
    rehearsal, fake_world, points, failure
):
    # A timed-out read is asked again as a report: Meta slow at both fails the sync.
    for point in points:
        fake_world.fail(point, failure, times=None)
    rehearsal.sync_now("act_101")
    rehearsal.minutes(2)
    key, failed_at = opened_after_the_failed_sync(rehearsal, "act_101")
    assert key == "unavailable:c1"
    incident = rehearsal.open_now()["unavailable:c1"]
    assert incident.opened_at == failed_at
    assert incident.summary == (
        "1 account of connection c1 could not be read: Meta timed out or failed every try "
        "since 12:04 UTC (site s1)"
    )
    assert "`rastro sync-now AD_ACCOUNT_ID`" in incident.fix
    # The other account fails at its next live read: the same incident, said once.
    rehearsal.minutes(60)
    assert rehearsal.open_now()["unavailable:c1"].accounts == ("act_101", "act_202")
    assert [event for event, *_ in rehearsal.said] == ["opened"]
    fake_world.clear_failures()
    # Each retries on its own, at its back-off: one account back first does not resolve it.
    rehearsal.until_said(2, 180)
    assert rehearsal.said[1][:2] == ("resolved", "unavailable:c1")
    rehearsal.minutes(20)
    assert [event for event, *_ in rehearsal.said] == ["opened", "resolved"]


def test_a_lost_permission_opens_at_once_and_resolves_at_the_sync_its_fix_asks_for(
    rehearsal, fake_world
):
    fake_world.revoke(TOKEN, "act_101")
    rehearsal.sync_now("act_101")
    rehearsal.minutes(2)
    key, failed_at = opened_after_the_failed_sync(rehearsal, "act_101")
    assert key == "permission:c1"
    incident = rehearsal.open_now()["permission:c1"]
    assert incident.opened_at == failed_at and incident.accounts == ("act_101",)
    assert incident.summary == "1 account of connection c1 lost permission at Meta (site s1)"
    assert "then `rastro sync-now AD_ACCOUNT_ID`" in incident.fix
    rehearsal.minutes(20)
    assert [event for event, *_ in rehearsal.said] == ["opened"]
    # Access given back, and the sync the fix names: resolved at the next check.
    fake_world.grant(TOKEN, "act_101")
    rehearsal.sync_now("act_101")
    asked = rehearsal.at
    rehearsal.until_said(2, 3)
    assert rehearsal.said[1][:2] == ("resolved", "permission:c1")
    assert rehearsal.at - asked <= timedelta(minutes=2)
    rehearsal.minutes(20)
    assert [event for event, *_ in rehearsal.said] == ["opened", "resolved"]

"""A wave of fifty accounts in which Meta refuses one on its own business-use-case limit:
that account waits its regain time, and the other 49 keep their cadence."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rastro_assets.meta.models import Ad
from rastro_assets.planner import backoff, cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.catalog import upsert_catalog
from rastro_assets_tests.conftest import NOW, TOKEN, record_sync_run

ACCOUNTS = [f"act_{3000 + n}" for n in range(50)]
HELD = ACCOUNTS[17]
REGAIN = timedelta(minutes=30)
LINKED = NOW - timedelta(hours=2)
TIMEZONE = "America/Sao_Paulo"


@pytest.fixture
def fifty(warehouse, vault, fake_clock):
    """Fifty accounts on one token, each backfilled through today 90 minutes before NOW, with
    an ACTIVE ad: read live every 45 minutes."""
    from rastro_fake_graph.world import FakeWorld

    world = FakeWorld(clock=fake_clock, seed=11)
    today = NOW.astimezone(cadence.zone(TIMEZONE)).date()
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", "Site one", LINKED)
        registry.save_connection(con, "c1", vault.seal("c1", TOKEN), LINKED)
        for account in ACCOUNTS:
            world.add_account(account, timezone=TIMEZONE, currency="BRL", n_ads=2, token=TOKEN)
            link_store.link_account(con, "s1", account, "c1", TIMEZONE, "BRL", LINKED)
            record_sync_run(con, f"fill-{account}", account, "backfill",
                            today - timedelta(days=89), today, NOW - timedelta(minutes=90),
                            catalog=True)
            upsert_catalog(con, account, [Ad(f"{account}-ad", effective_status="ACTIVE")],
                           LINKED, refile=True)
    return world


def test_one_account_on_its_own_limit_waits_its_regain_time_and_49_go_on(
    fifty, warehouse, fake_clock, secrets_key
):
    from rastro_assets.meta.client import MetaClient
    from rastro_assets.sync.syncer import Syncer
    from rastro_fake_graph.app import FakeGraphTransport

    def client(token: str) -> MetaClient:
        return MetaClient(
            token, base_url="https://graph.facebook.com/v25.0",
            transport=FakeGraphTransport(fifty), sleep=lambda seconds: None,
            async_poll_seconds=0, page_size=10,
        )

    def plans(at) -> dict[str, cadence.Plan]:
        with warehouse.connect() as con:
            return {a.state.ad_account_id: cadence.plan(a.state, at) for a in planned_accounts(con)}

    owed = plans(NOW)
    assert {plan.kind for plan in owed.values()} == {"live"}
    assert all(plan.is_due(NOW) for plan in owed.values())
    fifty.fail("insights", "throttled_80000", account=HELD,
               regain_minutes=int(REGAIN.total_seconds() // 60))
    requests = [
        SyncRequest(account, plan.since, plan.until, kind=plan.kind, run_id="wave-1",
                    catalog=plan.catalog)
        for account, plan in owed.items()
    ]
    wave = Syncer(warehouse, client, clock=fake_clock).sync_wave(
        requests, synced_at=NOW, concurrency=4
    )
    outcomes = {outcome.request.ad_account_id: outcome for outcome in wave.outcomes}
    assert outcomes[HELD].outcome == "throttled"
    assert {account for account, outcome in outcomes.items() if outcome.ok} == (
        set(ACCOUNTS) - {HELD}
    )

    at = NOW + timedelta(minutes=1)
    after = plans(at)
    held = after[HELD]
    # Meta's regain time, stretched by at most the jitter's share: not an hour.
    assert NOW + REGAIN <= held.due_at <= NOW + REGAIN * (1 + backoff.HOLD_JITTER)
    assert "RATE_LIMITED: held until" in held.reason
    with warehouse.connect() as con:
        states = {a.state.ad_account_id: a.state for a in planned_accounts(con)}
    report = cadence.status(states[HELD], at)
    assert report.state == "error" and report.rate_limit.until == held.due_at
    for account in set(ACCOUNTS) - {HELD}:
        plan = after[account]
        assert (plan.kind, plan.due_at) == ("live", NOW + cadence.LIVE_INTERVAL), account
        assert plan.rate_limit is None and "RATE_LIMITED" not in plan.reason
        report = cadence.status(states[account], at)
        assert (report.state, report.last_error, report.rate_limit) == ("live", None, None)

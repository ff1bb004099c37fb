"""End to end: a real dagster-daemon keeps a linked account of the fake Graph fresh.

Link → the sensors add the partition and start a 90-day partition backfill
(three 30-day runs) → sync-now → live waves land → the token dies at Meta →
the account pauses → a new token is connected → the account resumes. All the
while two analysts hold sessions open on the analytics snapshot, one
read-only and one read-write, and nothing waits on them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.timekeeping import days_between, local_date
from rastro_assets.warehouse import registry
from rastro_assets_tests.analytics.analyst import Analyst
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    LAG_SECONDS,
    LEASE_SECONDS,
    MONITOR_SECONDS,
    POLL_SECONDS,
    account_status,
    freeze_today,
    instance_yaml,
    linked_world,
    one_account_world,
    sync_now,
    wait_for,
    wait_for_the_backfill,
    wave_outcome_after,
)
from rastro_assets_tests.truth import assert_equals_truth

# Four minutes on the 2-core machine at load average 9-12, five at 14: its own waits bound
# each step, this only the whole.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NEW_TOKEN = "EAAnewTOKENq81ZrW0pLx3Tm5Yc"


@pytest.fixture
def daemon_world(tmp_path, secrets_key):
    world = one_account_world()
    world.add_token(NEW_TOKEN)
    world.grant(NEW_TOKEN, ACCOUNT)
    config = instance_yaml(tmp_path / "dagster_home")
    # The analyst opens read-write, as DBeaver and `duckdb FILE` do by default: it locks the
    # file it opened, which later publishes replace rather than write.
    with (
        linked_world(tmp_path, secrets_key, world, config) as linked,
        Analyst(linked.snapshot_path, read_only=False) as writer,
    ):
        yield world, linked.warehouse, linked.vault, linked.home, linked.daemon, writer


def newest_published(snapshot_path: Path) -> tuple[datetime, datetime | None]:
    """What a new analyst session sees: when its snapshot was published, and its newest sync."""
    with Analyst(snapshot_path) as analyst:
        [[published_at, last_sync_at]] = analyst.query(
            "SELECT (SELECT published_at FROM snapshot_info),"
            " (SELECT max(last_sync_at) FROM account_sync_status)"
        )
    return datetime.fromisoformat(published_at), (
        datetime.fromisoformat(last_sync_at) if last_sync_at else None
    )


def busy_skips(home: Path) -> list[str]:
    """Every sensor tick the daemon skipped because the warehouse was locked."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    skips = []
    for state in instance.all_instigator_state():
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id):
            if tick.skip_reason and "the warehouse is busy" in tick.skip_reason:
                skips.append(f"{state.instigator_name}: {tick.skip_reason}")
    return skips


def resyncs_started_before(warehouse, instant: datetime) -> list[tuple]:
    """The daily and weekly syncs started before `instant`."""
    with warehouse.connect() as con:
        return con.execute(
            "SELECT kind, started_at FROM meta_sync_runs"
            " WHERE kind IN ('daily', 'weekly') AND started_at < ?",
            [instant],
        ).fetchall()


@pytest.mark.e2e
def test_the_daemon_backfills_syncs_pauses_and_resumes_while_analysts_read(daemon_world):
    world, warehouse, vault, home, daemon, writer = daemon_world
    log = daemon.log
    snapshot_path = Path(warehouse.path).with_name("analytics.duckdb")
    spend_rows = "SELECT count(*) FROM ad_spend_daily"
    assert writer.query(spend_rows) == [[0]]
    reader = None
    try:
        wait_for_the_backfill(warehouse, world, timeout_seconds=240)
        # Each account-day of the 90 shows materialized, recorded as its block was written.
        today = local_date(datetime.now(UTC), "Pacific/Auckland")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            grid = instance.get_materialized_partitions(dg.AssetKey("ad_spend_daily"))
        assert {
            f"{ACCOUNT}|{day}" for day in days_between(today - timedelta(days=89), today)
        } - grid <= {f"{ACCOUNT}|{today}"}
        # The backfill's last run read the catalog and counts as the daily and weekly re-sync.
        with warehouse.connect() as con:
            [account] = planned_accounts(con)
            catalog = con.execute(
                "SELECT ad_id FROM ad_catalog WHERE ad_account_id = ?", [ACCOUNT]
            ).fetchall()
        assert {ad_id for (ad_id,) in catalog} == set(world.accounts[ACCOUNT].ads)
        now = datetime.now(UTC)
        assert cadence.plan(account.state, now).kind == "live"
        # Nor does a 7- or 28-day read follow within the hour (unless a new local day's
        # 04:00 slot falls inside it: that daily is owed).
        local_today = local_date(now, "Pacific/Auckland")
        slot = cadence.daily_slot(local_today, "Pacific/Auckland")
        if slot <= now:
            slot = cadence.daily_slot(local_today + timedelta(days=1), "Pacific/Auckland")
        horizon = min(now + timedelta(minutes=59), slot - timedelta(minutes=1))
        assert cadence.plan(account.state, horizon).kind == "live"
        reader = Analyst(snapshot_path, read_only=True)
        backfilled_view = reader.query(spend_rows)

        for _ in range(3):
            requested_at = sync_now(warehouse)
            outcome = wait_for(
                "a wave sync",
                lambda since=requested_at: wave_outcome_after(warehouse, since),
                120,
            )
            assert outcome == "ok"
        # Live reads all: a 7- or 28-day one only once the local 04:00 slot has come, which
        # a test run at that hour spans.
        assert resyncs_started_before(warehouse, slot) == []
        with warehouse.connect() as con:
            [[last_ok]] = con.execute(
                "SELECT max(finished_at) FROM meta_sync_runs WHERE outcome = 'ok'"
            ).fetchall()
        wait_for(
            "the last wave in a new analyst session",
            lambda: (newest_published(snapshot_path)[1] or last_ok - timedelta(1)) >= last_ok,
            LAG_SECONDS + 30,
        )
        seen_at = datetime.now(UTC)
        assert (seen_at - last_ok).total_seconds() <= LAG_SECONDS + POLL_SECONDS + 5

        world.kill_token(TOKEN, subcode=463)
        requested_at = sync_now(warehouse)
        wait_for("the pause", lambda: account_status(warehouse).state == "paused", 120)
        assert account_status(warehouse).last_error.startswith("META_TOKEN_INVALID")

        reconnected_at = datetime.now(UTC)
        with warehouse.connect() as con:
            registry.save_connection(con, "c1", vault.seal("c1", NEW_TOKEN), reconnected_at)
        outcome = wait_for(
            "the resumed sync", lambda: wave_outcome_after(warehouse, reconnected_at), 120
        )
        assert outcome == "ok"
        assert account_status(warehouse).state == "live"
        assert busy_skips(home) == []

        # SIGKILL the daemon and the wave's run worker while the wave waits on Meta: once the
        # lease and a monitoring poll are past, the cadence goes on by itself.
        world.server_stall_seconds = 300
        world.fail("insights", "timeout", times=None, account=ACCOUNT)
        asked = world.calls["insights"]
        sync_now(warehouse)
        wait_for("a wave stalled on Meta", lambda: world.calls["insights"] > asked, 120)
        daemon.kill()
        killed_at = datetime.now(UTC)
        world.clear_failures()
        freeze_today(world)
        daemon.start()
        outcome = wait_for(
            "a wave after the kill", lambda: wave_outcome_after(warehouse, killed_at), 180
        )
        assert outcome == "ok"
        resumed_in = (datetime.now(UTC) - killed_at).total_seconds()
        print(f"waves resumed {resumed_in:.0f} s after the kill (lease {LEASE_SECONDS} s)")
        assert resumed_in <= LEASE_SECONDS + MONITOR_SECONDS + 60
        today = local_date(datetime.now(UTC), "Pacific/Auckland")
        with warehouse.connect() as con:
            assert_equals_truth(con, world, ACCOUNT, today - timedelta(days=1), today)
        # The analysts' sessions never moved: each still reads the copy it opened.
        assert writer.query(spend_rows) == [[0]]
        assert reader.query(spend_rows) == backfilled_view
    except AssertionError:
        print(log.read_text()[-6000:])
        raise
    finally:
        if reader is not None:
            reader.close()
    leaks = [
        path
        for path in [*home.rglob("*"), snapshot_path]
        if path.is_file() and TOKEN.encode() in path.read_bytes()
    ]
    assert leaks == []

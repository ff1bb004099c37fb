"""End to end on Postgres: the operator guide's `docs/dagster.scaled.yaml` runs a real
dagster-daemon against a real PostgreSQL server the test starts itself.

A newly linked account's 90-day backfill completes as a Dagster partition backfill, then
live waves run; the warehouse equals the fake Graph, and Dagster's state is in Postgres.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
import yaml

from rastro_assets.timekeeping import local_date
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    REPO,
    TIMEZONE,
    account_status,
    freeze_today,
    linked_world,
    one_account_world,
    sync_now,
    wait_for,
    wait_for_the_backfill,
    wave_outcome_after,
)
from rastro_assets_tests.postgres_server import postgres_server
from rastro_assets_tests.truth import assert_equals_truth

# Three backfill runs and two waves through a real daemon took 6.5 minutes with the 2-core
# machine at load average ~10 (other suites beside it); the waits allow for that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LIVE_WAVES = 2


def scaled_instance_yaml() -> dict:
    """`docs/dagster.scaled.yaml` as shipped, but for the one section that cannot run here.

    Replaced: `run_launcher` (K8sRunLauncher needs a Kubernetes cluster) by Dagster's default
    launcher, which runs each run as a local process. Everything else is kept as written:
    Postgres storage from the `DAGSTER_PG_*` variables with `sslmode: require` (the test's
    server speaks TLS), the queued coordinator, the concurrency limits and pools, run
    monitoring, tick retention, threaded sensors and backfills, the no-op compute logs.
    """
    config = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    del config["run_launcher"]
    return config


@pytest.fixture
def postgres_world(tmp_path, secrets_key, monkeypatch):
    with postgres_server() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        world = one_account_world()
        with linked_world(tmp_path, secrets_key, world, scaled_instance_yaml()) as linked:
            yield server, linked


def backfills_and_their_runs(home) -> list[tuple[str, bool, list[str]]]:
    """Each backfill in the instance: its status, whether it targets assets, its runs' states."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        return [
            (
                backfill.status.value,
                backfill.is_asset_backfill,
                [
                    run.status.value
                    for run in instance.get_runs(
                        dg.RunsFilter(tags={"dagster/backfill": backfill.backfill_id})
                    )
                ],
            )
            for backfill in instance.get_backfills()
        ]


def materialized_keys(home, asset: str) -> set[str]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        return set(instance.get_materialized_partitions(dg.AssetKey(asset)))


def wave_runs(home) -> list[str]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        return [
            run.status.value
            for run in instance.get_runs(dg.RunsFilter(job_name="meta_sync_wave"))
        ]


@pytest.mark.e2e
def test_the_scaled_config_backfills_and_runs_live_waves_on_postgres(postgres_world):
    server, linked = postgres_world
    warehouse, home, world = linked.warehouse, linked.home, linked.world
    try:
        backfill = wait_for_the_backfill(warehouse, world, timeout_seconds=480)
        [(status, is_asset_backfill, run_states)] = wait_for(
            "the backfill to be marked complete",
            lambda: [
                found for found in backfills_and_their_runs(home) if found[0] != "REQUESTED"
            ],
            timeout_seconds=120,
        )
        assert (status, is_asset_backfill) == ("COMPLETED_SUCCESS", True)
        # One run reads the account's 90 days, block by block.
        assert len(run_states) >= 1 and set(run_states) == {"SUCCESS"}
        backfilled_days = {
            f"{ACCOUNT}|{since + timedelta(days=offset)}"
            for since, until, _ in backfill
            for offset in range((until - since).days + 1)
        }
        assert len(backfilled_days) >= 90
        assert backfilled_days <= materialized_keys(home, "ad_spend_daily")

        freeze_today(world)
        for _ in range(LIVE_WAVES):
            requested_at = sync_now(warehouse)
            outcome = wait_for(
                "a live wave",
                lambda since=requested_at: wave_outcome_after(warehouse, since),
                120,
            )
            assert outcome == "ok"
        assert account_status(warehouse).state == "live"
        today = local_date(datetime.now(UTC), TIMEZONE)
        with warehouse.connect() as con:
            assert_equals_truth(con, world, ACCOUNT, today - timedelta(days=1), today)
        wait_for(
            "the waves' runs to succeed in Dagster",
            lambda: wave_runs(home).count("SUCCESS") >= LIVE_WAVES,
            timeout_seconds=120,
        )
        assert "FAILURE" not in wave_runs(home)
        with contextlib.closing(server.connect()) as con, con.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM event_logs"
                " WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND asset_key LIKE %s",
                ['%ad_spend_daily%'],
            )
            [[materializations]] = cursor.fetchall()
        assert materializations >= len(backfilled_days)
    except AssertionError:
        print(linked.daemon.log.read_text()[-6000:])
        raise


def test_the_server_stops_and_its_files_go_even_when_the_test_fails():
    with pytest.raises(RuntimeError, match="the test failed"), postgres_server() as server:
        with contextlib.closing(server.connect()) as con, con.cursor() as cursor:
            cursor.execute("SELECT current_database()")
            assert cursor.fetchall() == [("dagster",)]
        root = server.log.parent
        raise RuntimeError("the test failed")
    assert not root.exists()
    with pytest.raises(psycopg2.OperationalError):
        server.connect()

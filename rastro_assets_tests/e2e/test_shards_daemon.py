"""End to end: three account shards through a real dagster-daemon.

An install configured for three shards of one account (`RASTRO_ACCOUNT_SHARDS=3`,
`RASTRO_SHARD_ACCOUNTS=1`) holds one account in shard 0 when the daemon starts; two more are
linked while it runs and go to shards 1 and 2.
Each account's 90-day backfill lands in its own shard's spend pair and nowhere else; a wave
syncs them all; an account-day synced by hand with the documented command lands in its
shard and is checked there; an unlinked account leaves its shard's partitions only.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rastro_assets import shards
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.timekeeping import days_between, local_date
from rastro_assets.warehouse import link_store, registry, shard_store
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    REPO,
    instance_yaml,
    linked_world,
    one_account_world,
    wait_for,
)
from rastro_assets_tests.truth import assert_equals_truth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHARDS = 3
SHARD_SIZE = 1
LINKED_LATER = {"act_702": ("America/Sao_Paulo", "BRL"), "act_703": ("Asia/Tokyo", "JPY")}
HOME_SHARD = {ACCOUNT: 0, "act_702": 1, "act_703": 2}


@pytest.fixture
def sharded_world(tmp_path, secrets_key):
    world = one_account_world()
    for account, (timezone, currency) in LINKED_LATER.items():
        world.add_account(account, timezone=timezone, currency=currency, n_ads=2, token=TOKEN)
    config = instance_yaml(tmp_path / "dagster_home")
    env = {"RASTRO_ACCOUNT_SHARDS": str(SHARDS), "RASTRO_SHARD_ACCOUNTS": str(SHARD_SIZE)}
    with linked_world(tmp_path, secrets_key, world, config, extra_env=env) as linked:
        yield linked


def statuses(warehouse) -> dict[str, cadence.AccountStatus]:
    now = datetime.now(UTC)
    with warehouse.connect() as con:
        return {
            account.state.ad_account_id: cadence.status(account.state, now)
            for account in planned_accounts(con)
        }


def all_live(warehouse) -> bool:
    found = statuses(warehouse)
    assert not [status for status in found.values() if status.state in ("error", "paused")]
    return set(found) == set(HOME_SHARD) and all(
        status.state == "live" and status.backfill is None for status in found.values()
    )


def materialized(home: Path) -> dict[str, set[str]]:
    """Each shard's spend asset: the account-days materialized in it."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {
            shards.ad_spend_name(shard): set(
                instance.get_materialized_partitions(dg.AssetKey(shards.ad_spend_name(shard)))
            )
            for shard in range(SHARDS)
        }


def backfills_done(home: Path) -> bool:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        backfills = instance.get_backfills()
    states = {backfill.status.value for backfill in backfills}
    assert "FAILED" not in states
    return len(backfills) >= 2 and states == {"COMPLETED_SUCCESS"}


def partitions(home: Path) -> dict[int, list[str]]:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {
            shard: sorted(instance.get_dynamic_partitions(shards.accounts_name(shard)))
            for shard in range(SHARDS)
        }


def accounts_in(keys: set[str]) -> set[str]:
    return {key.split("|", 1)[0] for key in keys}


def wave_outcomes(warehouse, since: datetime) -> dict[str, str] | None:
    """Each account's first finished wave sync started after `since`, once all have one."""
    with warehouse.connect() as con:
        rows = con.execute(
            "SELECT ad_account_id, arg_min(outcome, started_at) FROM meta_sync_runs"
            " WHERE kind IN ('live', 'daily', 'weekly') AND started_at > ?"
            " AND outcome IS NOT NULL GROUP BY ALL",
            [since],
        ).fetchall()
    found = dict(rows)
    return found if set(found) == set(HOME_SHARD) else None


def latest_sum_check(home: Path, shard: int, key: str):
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        asset = dg.AssetKey(shards.site_spend_name(shard))
        check = dg.AssetCheckKey(asset, "equals_sum_of_ad_spend")
        records = instance.event_log_storage.get_asset_check_execution_history(check, limit=50)
    return next(
        (record for record in records if record.partition == key and record.event), None
    )


@pytest.mark.e2e
def test_three_shards_backfill_sync_by_hand_and_unlink_each_in_its_own_pair(sharded_world):
    linked = sharded_world
    warehouse, home, world, daemon = linked.warehouse, linked.home, linked.world, linked.daemon
    try:
        now = datetime.now(UTC)
        with warehouse.connect() as con:
            for account, (timezone, currency) in LINKED_LATER.items():
                link_store.link_account(
                    con, "s1", account, "c1", timezone, currency, now, shards=SHARDS,
                    shard_size=SHARD_SIZE,
                )
            assert shard_store.account_shards(con) == HOME_SHARD

        wait_for("every account's 90-day backfill", lambda: all_live(warehouse), 420)
        # A run records its account-days in Dagster after it wrote the warehouse.
        wait_for("the backfills to complete in Dagster", lambda: backfills_done(home), 120)
        by_asset = materialized(home)
        for account, shard in HOME_SHARD.items():
            timezone = world.accounts[account].timezone
            today = local_date(datetime.now(UTC), timezone)
            since, until = today - timedelta(days=89), today - timedelta(days=2)
            with warehouse.connect() as con:
                assert_equals_truth(con, world, account, since, until)
                spent = {
                    f"{account}|{day}"
                    for (day,) in con.execute(
                        "SELECT DISTINCT day FROM ad_spend_daily"
                        " WHERE ad_account_id = ? AND day BETWEEN ? AND ?",
                        [account, since, until],
                    ).fetchall()
                }
            assert spent, account
            # Every account-day of the 90, a day without spend too, shows materialized.
            grid = {f"{account}|{day}" for day in days_between(since, until)}
            assert grid <= by_asset[shards.ad_spend_name(shard)], account
        assert {asset: accounts_in(keys) for asset, keys in by_asset.items()} == {
            shards.ad_spend_name(shard): {account} for account, shard in HOME_SHARD.items()
        }

        # A wave syncs every shard's accounts.
        asked_at = datetime.now(UTC)
        with warehouse.connect() as con:
            for account in HOME_SHARD:
                registry.request_sync(con, account, asked_at)
        assert wait_for(
            "a wave sync of every account", lambda: wave_outcomes(warehouse, asked_at), 180
        ) == {account: "ok" for account in HOME_SHARD}

        # One account-day by hand, with the command the guide gives for any layout.
        account, shard = "act_702", HOME_SHARD["act_702"]
        day = local_date(datetime.now(UTC), "America/Sao_Paulo") - timedelta(days=3)
        key = f"{account}|{day}"
        completed = subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"), "asset", "materialize",
                "-m", "rastro_assets.definitions",
                "--select", f"{shards.ad_spend_name(shard)},{shards.site_spend_name(shard)}",
                "--partition", key,
            ],
            cwd=REPO, env=daemon.env, capture_output=True, text=True, timeout=300,
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert TOKEN not in completed.stdout + completed.stderr
        with warehouse.connect() as con:
            [[manual]] = con.execute(
                "SELECT count(*) FROM meta_sync_runs WHERE ad_account_id = ? AND kind = 'manual'"
                " AND outcome = 'ok'",
                [account],
            ).fetchall()
        assert manual >= 1
        check = latest_sum_check(home, shard, key)
        assert check is not None and check.event.asset_check_evaluation.passed
        assert all(latest_sum_check(home, other, key) is None for other in (0, 2))

        # Unlinked, an account leaves its own shard's partitions; the others keep theirs.
        with warehouse.connect() as con:
            link_store.unlink_account(con, "s1", "act_703")
        wait_for(
            "act_703 to leave its shard's partitions",
            lambda: partitions(home)[2] == [],
            120,
        )
        assert partitions(home) == {0: [ACCOUNT], 1: ["act_702"], 2: []}
    except AssertionError:
        print(daemon.log.read_text()[-6000:])
        raise

"""End to end on PostgreSQL, as on many machines: Dagster's storage and the warehouse are two
databases of a real PostgreSQL server the test starts itself, a real dagster-daemon runs the
operator guide's `docs/dagster.scaled.yaml`, and every run worker starts as if on a machine of
its own (`separate_hosts.SeparateHostRunLauncher`): an empty working directory, an empty
`TMPDIR`, a Dagster home holding only `dagster.yaml`, and no DuckDB file named anywhere.

A newly linked account's 90-day backfill completes as a Dagster partition backfill, then a
live wave runs. Then the install grows to three shards (the daemon restarted with
`RASTRO_ACCOUNT_SHARDS=3`), two more accounts are linked, and each one's backfill lands in its
own shard's pair and nowhere else while a webserver runs beside the daemon; a wave syncs every
shard's accounts; an account-day synced by hand with the documented command lands in its shard
and is checked there; an unlinked account leaves its shard's partitions only. The warehouse
equals the fake Graph; the runs left nothing on their disks; each process's warehouse
connections are counted in `pg_stat_activity`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
import yaml

from rastro_assets import shards
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.timekeeping import days_between, local_date
from rastro_assets.warehouse import link_store, registry, shard_store
from rastro_assets.warehouse.postgres import POOL_IDLE_CONNECTIONS
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.e2e.daemon_harness import (
    ACCOUNT,
    REPO,
    TIMEZONE,
    LinkedWorld,
    account_status,
    freeze_today,
    linked_world,
    one_account_world,
    sync_now,
    wait_for,
    wait_for_the_backfill,
    wave_outcome_after,
)
from rastro_assets_tests.e2e.pg_connections import ConnectionCounts, counting_connections
from rastro_assets_tests.e2e.webserver_harness import graphql, webserver
from rastro_assets_tests.postgres_server import PostgresServer, WarehouseServer, postgres_server
from rastro_assets_tests.truth import assert_equals_truth

# Three backfill runs and two waves through a real daemon took 6.5 minutes with the 2-core
# machine at load average ~10 (other suites beside it); the waits allow for that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LIVE_WAVES = 1
WAREHOUSE_DB = "warehouse"
SHARDS = 3
SHARD_SIZE = 1
LINKED_LATER = {"act_702": ("America/Sao_Paulo", "BRL"), "act_703": ("Asia/Tokyo", "JPY")}
HOME_SHARD = {ACCOUNT: 0, "act_702": 1, "act_703": 2}


def scaled_instance_yaml(hosts_dir: Path) -> dict:
    """`docs/dagster.scaled.yaml` as shipped, but for the one section that cannot run here.

    Replaced: `run_launcher` (K8sRunLauncher needs a Kubernetes cluster) by a launcher that
    starts each run as a local process the way a Job starts a pod: its own empty directories
    under `hosts_dir`, `dagster.yaml` its only file. Everything else is kept as written:
    Postgres storage from the `DAGSTER_PG_*` variables with `sslmode: require` (the test's
    server speaks TLS), the queued coordinator, the concurrency limits and pools, run
    monitoring, tick retention, threaded sensors and backfills, the no-op compute logs.
    """
    config = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    config["run_launcher"] = {
        "module": "rastro_assets_tests.e2e.separate_hosts",
        "class": "SeparateHostRunLauncher",
        "config": {"hosts_dir": str(hosts_dir)},
    }
    return config


def new_database(server: PostgresServer, name: str) -> str:
    """A new empty database on `server`: its URL, as `RASTRO_WAREHOUSE_URL` takes it."""
    with contextlib.closing(server.connect()) as con:
        con.autocommit = True
        with con.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
    return WarehouseServer(dataclasses.replace(server, db=name)).url()


@dataclasses.dataclass
class PostgresWorld:
    server: PostgresServer
    linked: LinkedWorld
    hosts: Path
    connections: ConnectionCounts


@pytest.fixture
def postgres_world(tmp_path, secrets_key, monkeypatch):
    with postgres_server() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        # A pod's image holds its launcher's module, as a Kubernetes image holds dagster-k8s;
        # this launcher is a test module, which the wheel does not ship: its checkout is the
        # image's path, for the daemon and each run it starts.
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        )
        warehouse_url = new_database(server, WAREHOUSE_DB)
        world = one_account_world()
        for account, (timezone, currency) in LINKED_LATER.items():
            world.add_account(account, timezone=timezone, currency=currency, n_ads=2, token=TOKEN)
        hosts = tmp_path / "run_hosts"
        # The one directory shared with other machines: where analysts read the snapshot.
        analysts = tmp_path / "analysts"
        analysts.mkdir()
        with (
            counting_connections(server, WAREHOUSE_DB) as connections,
            linked_world(
                tmp_path,
                secrets_key,
                world,
                scaled_instance_yaml(hosts),
                warehouse_url=warehouse_url,
                snapshot_dir=analysts,
            ) as linked,
        ):
            yield PostgresWorld(server, linked, hosts, connections)


def backfills_and_their_runs(home) -> list[tuple[str, bool, list[str]]]:
    """Each backfill in the instance: its status, whether it targets assets, its runs' states."""
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
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return set(instance.get_materialized_partitions(dg.AssetKey(asset)))


def all_runs(home) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return list(instance.get_runs())


def wave_runs(home) -> list[str]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return [
            run.status.value
            for run in instance.get_runs(dg.RunsFilter(job_name="meta_sync_wave"))
        ]


def all_live(warehouse) -> bool:
    now = datetime.now(UTC)
    with warehouse.connect() as con:
        found = {
            account.state.ad_account_id: cadence.status(account.state, now)
            for account in planned_accounts(con)
        }
    assert not [status for status in found.values() if status.state in ("error", "paused")]
    return set(found) == set(HOME_SHARD) and all(
        status.state == "live" and status.backfill is None for status in found.values()
    )


def backfills_done(home) -> bool:
    """Every backfill of the instance completed, none failed."""
    states = {status for status, _, _ in backfills_and_their_runs(home)}
    assert "FAILED" not in states
    return states == {"COMPLETED_SUCCESS"}


def wave_outcomes(warehouse, since: datetime) -> dict[str, str] | None:
    """Each account's first finished wave sync started after `since`, once all have one."""
    with warehouse.connect() as con:
        rows = con.execute(
            "SELECT ad_account_id, outcome FROM meta_sync_runs"
            " WHERE kind IN ('live', 'daily', 'weekly') AND started_at > ?"
            " AND outcome IS NOT NULL ORDER BY started_at DESC",
            [since],
        ).fetchall()
    found = dict(rows)
    return found if set(found) == set(HOME_SHARD) else None


def partitions(home) -> dict[int, list[str]]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return {
            shard: sorted(instance.get_dynamic_partitions(shards.accounts_name(shard)))
            for shard in range(SHARDS)
        }


def latest_sum_check(home, shard: int, key: str):
    with dg.DagsterInstance.from_config(str(home)) as instance:
        asset = dg.AssetKey(shards.site_spend_name(shard))
        check = dg.AssetCheckKey(asset, "equals_sum_of_ad_spend")
        records = instance.event_log_storage.get_asset_check_execution_history(check, limit=50)
    return next(
        (record for record in records if record.partition == key and record.event), None
    )


def spend_partitions_in_the_ui(url: str) -> int:
    """How many of shard 0's spend partitions the asset's page shows materialized."""
    data = graphql(
        url,
        """{ assetNodeOrError(assetKey: {path: ["ad_spend_daily"]}) {
             ... on AssetNode { partitionStats { numMaterialized } } } }""",
    )
    return data["assetNodeOrError"]["partitionStats"]["numMaterialized"]


def left_on_disk(host: Path) -> list[str]:
    """What a run left in its own directories, but for the `dagster.yaml` it was given."""
    return sorted(
        str(path.relative_to(host))
        for directory in ("work", "tmp", "dagster_home")
        for path in (host / directory).rglob("*")
        if path != host / "dagster_home" / "dagster.yaml"
    )


@pytest.mark.e2e
def test_dagster_and_the_warehouse_on_postgres_with_runs_on_machines_of_their_own(
    postgres_world,
):
    server, linked, hosts = postgres_world.server, postgres_world.linked, postgres_world.hosts
    warehouse, home, world, daemon = linked.warehouse, linked.home, linked.world, linked.daemon
    assert warehouse.engine == "postgres" and "RASTRO_DUCKDB_PATH" not in daemon.env
    started = time.monotonic()
    try:
        backfill = wait_for_the_backfill(warehouse, world, timeout_seconds=480)
        # The live waves first: Dagster's backfill daemon marks the backfill complete at its
        # next look, up to half a minute later, and the waves need not wait for that.
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

        # Growing to three shards: the code location restarts with the new count, and the
        # next two accounts linked each go to a shard of their own.
        print(f"one shard: {time.monotonic() - started:.0f} s")
        started = time.monotonic()
        daemon.stop()
        daemon.env.update(
            RASTRO_ACCOUNT_SHARDS=str(SHARDS), RASTRO_SHARD_ACCOUNTS=str(SHARD_SIZE)
        )
        daemon.start()
        now = datetime.now(UTC)
        with warehouse.connect() as con:
            for account, (timezone, currency) in LINKED_LATER.items():
                link_store.link_account(
                    con, "s1", account, "c1", timezone, currency, now, shards=SHARDS,
                    shard_size=SHARD_SIZE,
                )
            assert shard_store.account_shards(con) == HOME_SHARD
        # The UI beside it, on its own, as a webserver on another machine would be: its
        # connections are counted with the rest.
        with webserver(daemon.env, daemon.log.with_name("webserver.log")) as url:
            wait_for("the new accounts' backfills", lambda: all_live(warehouse), 300)
            assert spend_partitions_in_the_ui(url) >= len(backfilled_days)
        # A wave syncs every shard's accounts: asked for now, it runs while the backfill
        # daemon marks the backfills complete.
        asked_at = datetime.now(UTC)
        with warehouse.connect() as con:
            for account in HOME_SHARD:
                registry.request_sync(con, account, asked_at)
        # A run records its account-days in Dagster after it wrote the warehouse.
        wait_for("the backfills to complete in Dagster", lambda: backfills_done(home), 120)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            by_shard = {
                shard: set(
                    instance.get_materialized_partitions(
                        dg.AssetKey(shards.ad_spend_name(shard))
                    )
                )
                for shard in range(SHARDS)
            }
        for account, shard in HOME_SHARD.items():
            today = local_date(datetime.now(UTC), world.accounts[account].timezone)
            since, until = today - timedelta(days=89), today - timedelta(days=2)
            with warehouse.connect() as con:
                assert_equals_truth(con, world, account, since, until)
                spent = con.execute(
                    "SELECT count(*) FROM ad_spend_daily"
                    " WHERE ad_account_id = ? AND day BETWEEN ? AND ?",
                    [account, since, until],
                ).fetchone()[0]
            assert spent, account
            # Every account-day of the 90, a day without spend too, shows materialized.
            assert {f"{account}|{day}" for day in days_between(since, until)} <= by_shard[shard]
        assert {
            shard: {key.split("|", 1)[0] for key in keys} for shard, keys in by_shard.items()
        } == {shard: {account} for account, shard in HOME_SHARD.items()}

        assert wait_for(
            "a wave sync of every account", lambda: wave_outcomes(warehouse, asked_at), 180
        ) == {account: "ok" for account in HOME_SHARD}

        print(f"three shards: {time.monotonic() - started:.0f} s")
        # No run needed a disk of its own: each left its directories as it found them.
        launched = {host.name for host in hosts.iterdir()}
        runs = all_runs(home)
        assert launched <= {run.run_id for run in runs}
        assert {run.run_id for run in runs if run.status.value == "SUCCESS"} <= launched
        assert {run_id: left_on_disk(hosts / run_id) for run_id in launched} == {
            run_id: [] for run_id in launched
        }
        assert [path.parent.name for path in Path(home).parent.rglob("*.duckdb")] == [
            "analysts"
        ]

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
    finally:
        print("warehouse connections:", postgres_world.connections.summary())
    # Connections a pooler must serve: each process keeps at most its pool's idle ones, and
    # a run worker's steps are processes of their own.
    held = postgres_world.connections.per_process
    assert held["run worker"] >= 1
    assert max(held.values()) <= 2 * POOL_IDLE_CONNECTIONS


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

"""Two runs SIGKILLed while they hold `meta_api` slots do not stop every later sync.

The repo's `dagster.yaml` caps Meta work at two slots of the `meta_api` pool. A run worker
killed mid-step (an OOM kill, a host restart) never gives its slot back; run monitoring
later marks the run failed, and only the monitoring daemon's slot sweep
(`run_monitoring.free_slots_after_run_end_seconds`) frees what a finished run still holds.

Here two wave runs each take a slot, stay in their step (Meta answers slowly) and are
SIGKILLed there. A third wave then waits on the pool ("Step blocked by limit for pool
meta_api") until a real `dagster-daemon` on the repo's run monitoring settings fails the
dead runs and frees their slots, and then it completes. Only the waits are shortened: the
poll interval, the dead runs' `dagster/max_runtime`, and the sweep's delay where the config
sets one.

The daemon serves an empty workspace: the product's sensors would launch syncs of their
own, and monitoring needs no code location. The runs are `dagster job execute` processes:
each is its run's worker, as a process the run launcher starts would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml

from rastro_assets.analytics.publish import Publisher
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import Vault
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.conftest import TOKEN
from rastro_fake_graph.server import serve
from rastro_fake_graph.world import FakeWorld

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POOL = "meta_api"
TIMEZONE = "UTC"
KILLED = ("act_201", "act_202")
SURVIVOR = "act_203"
# Long enough that a killed run is still in its step when it dies.
SLOW_META_SECONDS = 120.0
# The dead runs' runtime limit: monitoring fails them at its first poll after it.
DEAD_RUN_MAX_RUNTIME = 1
POLL_SECONDS = 1
SWEEP_SECONDS = 1
START_SECONDS = 60
FREED_SECONDS = 40


def instance_config(home: Path) -> dict:
    """The repo's instance config with its storage in `home` and its waits shortened."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["storage"] = {"sqlite": {"base_dir": str(home / "storage")}}
    config["local_artifact_storage"]["config"]["base_dir"] = str(home)
    config["compute_logs"]["config"]["base_dir"] = str(home / "logs")
    monitoring = config["run_monitoring"]
    monitoring["poll_interval_seconds"] = POLL_SECONDS
    if "free_slots_after_run_end_seconds" in monitoring:
        monitoring["free_slots_after_run_end_seconds"] = SWEEP_SECONDS
    return config


def wave(tmp_path: Path, env: dict, account: str, tags: dict, name: str) -> subprocess.Popen:
    """A `meta_sync_wave` run of `account`'s last two days, as its own run worker."""
    today = local_date(datetime.now(UTC), TIMEZONE)
    config = {
        "ops": {
            "sync_wave": {
                "config": {
                    "syncs": [
                        {
                            "ad_account_id": account,
                            "kind": "live",
                            "since": (today - timedelta(days=1)).isoformat(),
                            "until": today.isoformat(),
                        }
                    ]
                }
            }
        }
    }
    config_file = tmp_path / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [str(BIN / "dagster"), "job", "execute", "-m", "rastro_assets.definitions",
         "-j", "meta_sync_wave", "-c", str(config_file), "--tags", json.dumps(tags)],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / f"{name}.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for(what: str, predicate, timeout_seconds: float, logs: list[Path] = ()):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
    raise AssertionError(f"timed out after {timeout_seconds:.0f} s waiting for {what}\n{tails}")


def slot_holders(instance: dg.DagsterInstance) -> set[str]:
    return set(instance.event_log_storage.get_concurrency_info(POOL).active_run_ids)


def run_of(instance: dg.DagsterInstance, account: str) -> dg.DagsterRun | None:
    runs = instance.get_runs(dg.RunsFilter(tags={"test/account": account}))
    return runs[0] if runs else None


def kill(process: subprocess.Popen) -> None:
    """SIGKILL the process with its group: nothing of it ends cleanly."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.timeout(180)
def test_two_runs_killed_holding_meta_api_slots_then_a_sync_completes(tmp_path, secrets_key):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config(home)))
    (tmp_path / "empty_workspace.yaml").write_text("load_from: []\n")

    world = FakeWorld(seed=5)
    for account in (*KILLED, SURVIVOR):
        world.add_account(account, timezone=TIMEZONE, currency="USD", n_ads=2, token=TOKEN)
    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    warehouse.migrate()
    vault = Vault.from_env()
    now = datetime.now(UTC)
    with warehouse.connect() as con:
        registry.add_site(con, "s1", "Site one", now)
        registry.save_connection(con, "c1", vault.seal("c1", TOKEN), now)
        for account in (*KILLED, SURVIVOR):
            registry.link_account(con, "s1", account, "c1", TIMEZONE, "USD", now)
    snapshot_path = tmp_path / "analytics.duckdb"
    Publisher(warehouse, snapshot_path).publish()

    processes: list[subprocess.Popen] = []
    logs = [tmp_path / f"{name}.log" for name in ("killed-0", "killed-1", "next", "daemon")]
    with serve(world) as server, dg.DagsterInstance.from_config(str(home)) as instance:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "RASTRO_DUCKDB_PATH": str(warehouse.path),
            "RASTRO_META_GRAPH_URL": server.base_url,
            "RASTRO_SECRETS_KEY": secrets_key,
            "RASTRO_ANALYTICS_PATH": str(snapshot_path),
        }
        try:
            world.request_delay_seconds = SLOW_META_SECONDS
            killed = [
                wave(
                    tmp_path,
                    env,
                    account,
                    {"dagster/max_runtime": str(DEAD_RUN_MAX_RUNTIME), "test/account": account},
                    f"killed-{index}",
                )
                for index, account in enumerate(KILLED)
            ]
            processes += killed
            holders = wait_for(
                f"both runs to hold a {POOL} slot",
                lambda: len(slot_holders(instance)) == 2 and slot_holders(instance),
                START_SECONDS,
                logs[:2],
            )
            dead = {run_of(instance, account).run_id for account in KILLED}
            assert holders == dead
            for process in killed:
                kill(process)
                assert process.returncode == -signal.SIGKILL
            world.request_delay_seconds = 0.0

            survivor = wave(tmp_path, env, SURVIVOR, {"test/account": SURVIVOR}, "next")
            processes.append(survivor)
            wait_for(
                f"the next sync to wait on the {POOL} pool",
                lambda: (run := run_of(instance, SURVIVOR)) is not None
                and run.run_id
                in instance.event_log_storage.get_concurrency_info(POOL).pending_run_ids,
                START_SECONDS,
                logs[2:3],
            )
            assert slot_holders(instance) == dead

            daemon = subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", str(tmp_path / "empty_workspace.yaml")],
                cwd=tmp_path,
                env=env,
                stdout=logs[3].open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            processes.append(daemon)
            wait_for(
                f"the next sync to run, once the dead runs' {POOL} slots are freed",
                lambda: survivor.poll() is not None,
                FREED_SECONDS,
                logs[2:],
            )
            assert survivor.returncode == 0, logs[2].read_text(errors="replace")[-3000:]
            for account in KILLED:
                assert run_of(instance, account).status == dg.DagsterRunStatus.FAILURE
            assert run_of(instance, SURVIVOR).status == dg.DagsterRunStatus.SUCCESS
            assert slot_holders(instance) == set()
        finally:
            for process in processes:
                kill(process)
            world.request_delay_seconds = 0.0
    with warehouse.connect(read_only=True) as con:
        outcomes = con.execute(
            "SELECT ad_account_id, outcome FROM meta_sync_runs WHERE outcome = 'ok'"
        ).fetchall()
    assert outcomes == [(SURVIVOR, "ok")]

"""Runs SIGKILLed while they hold `meta_api` slots do not stop every later sync.

The repo's `dagster.yaml` caps Meta work at two slots of the `meta_api` pool. A run worker
killed mid-step (an OOM kill, a host restart) never gives its slot back; run monitoring
later marks the run failed, and only the monitoring daemon's slot sweep
(`run_monitoring.free_slots_after_run_end_seconds`) frees what a finished run still holds.

In each test two wave runs each take a slot, stay in their step (Meta answers slowly) and are
SIGKILLed there. A third wave then waits on the pool ("Step blocked by limit for pool
meta_api") until a real `dagster-daemon` on the repo's run monitoring settings fails the
dead runs and frees their slots, and then it completes. Only the waits are shortened: the
poll interval and the sweep's delay where the config sets one.

- Runs no launcher started (`dagster job execute` processes, each its run's worker) leave
  monitoring nothing to ask: it fails them once they outlive `dagster/max_runtime`, which
  these dead runs have shortened.
- Runs the instance's run launcher starts through a code server, killed with it (a host
  restart, an OOM kill of the whole group), keep their `dagster/max_runtime` as shipped: the
  launcher's health check must tell monitoring that their workers are gone.

The daemon serves an empty workspace: the product's sensors would launch syncs of their
own, and monitoring needs no code location. The waiting sync is a `dagster job execute`
process in both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._cli.job import _create_run
from dagster._core.workspace.context import BaseWorkspaceRequestContext, WorkspaceProcessContext
from dagster._core.workspace.load_target import GrpcServerTarget
from dagster._grpc.client import DagsterGrpcClient

from rastro_assets.defs.keys import MAX_RUNTIME_TAG
from rastro_assets.timekeeping import local_date
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.e2e.daemon_harness import linked_warehouse
from rastro_fake_graph.server import serve
from rastro_fake_graph.world import FakeWorld

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POOL = "meta_api"
TIMEZONE = "UTC"
JOB = "meta_sync_wave"
LOCATION = "rastro"
KILLED = ("act_201", "act_202")
SURVIVOR = "act_203"
# Long enough that a killed run is still in its step when it dies.
SLOW_META_SECONDS = 120.0
# The runtime limit of the dead runs no launcher started: monitoring fails them at its first
# poll after it.
DEAD_RUN_MAX_RUNTIME = 1
POLL_SECONDS = 1
SWEEP_SECONDS = 1
# A run worker's start (Dagster and the definitions imported, the run begun): beside the
# suite's end-to-end tests on two cores it took a full minute.
START_SECONDS = 180
FREED_SECONDS = 40


@dataclass(frozen=True)
class Stage:
    """An instance home, a fake Meta with the three accounts, and their warehouse."""

    tmp_path: Path
    home: Path
    world: FakeWorld
    warehouse: Warehouse
    snapshot_path: Path

    def log(self, name: str) -> Path:
        return self.tmp_path / f"{name}.log"


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


def stage(tmp_path: Path) -> Stage:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config(home)))
    (tmp_path / "empty_workspace.yaml").write_text("load_from: []\n")

    world = FakeWorld(seed=5)
    for account in (*KILLED, SURVIVOR):
        world.add_account(account, timezone=TIMEZONE, currency="USD", n_ads=2, token=TOKEN)
    warehouse, snapshot_path = linked_warehouse(tmp_path, [*KILLED, SURVIVOR], TIMEZONE, "USD")
    return Stage(tmp_path, home, world, warehouse, snapshot_path)


def environment(staged: Stage, graph_url: str, secrets_key: str) -> dict:
    return {
        **os.environ,
        "DAGSTER_HOME": str(staged.home),
        "RASTRO_DUCKDB_PATH": str(staged.warehouse.path),
        "RASTRO_META_GRAPH_URL": graph_url,
        "RASTRO_SECRETS_KEY": secrets_key,
        "RASTRO_ANALYTICS_PATH": str(staged.snapshot_path),
    }


def sync_config(account: str) -> dict:
    """Run config of a wave that syncs `account`'s last two days."""
    today = local_date(datetime.now(UTC), TIMEZONE)
    sync = {
        "ad_account_id": account,
        "kind": "manual",
        "since": (today - timedelta(days=1)).isoformat(),
        "until": today.isoformat(),
    }
    return {"ops": {"sync_wave": {"config": {"syncs": [sync]}}}}


def wave(staged: Stage, env: dict, account: str, tags: dict, name: str) -> subprocess.Popen:
    """A `meta_sync_wave` run of `account`, as its own run worker."""
    config_file = staged.tmp_path / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(sync_config(account)))
    return subprocess.Popen(
        [str(BIN / "dagster"), "job", "execute", "-m", "rastro_assets.definitions",
         "-j", JOB, "-c", str(config_file), "--tags", json.dumps(tags)],
        cwd=REPO,
        env=env,
        stdout=staged.log(name).open("wb"),
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


def wait_until_killed_runs_hold_the_pool(
    instance: dg.DagsterInstance, logs: list[Path]
) -> set[str]:
    holders = wait_for(
        f"both runs to hold a {POOL} slot",
        lambda: len(slot_holders(instance)) == 2 and slot_holders(instance),
        START_SECONDS,
        logs,
    )
    dead = {run_of(instance, account).run_id for account in KILLED}
    assert holders == dead
    return dead


def next_sync_completes(
    staged: Stage,
    env: dict,
    instance: dg.DagsterInstance,
    dead: set[str],
    processes: list[subprocess.Popen],
) -> None:
    """A sync waits on the pool the dead runs hold, until a daemon frees it; then it completes."""
    staged.world.request_delay_seconds = 0.0
    logs = [staged.log("next"), staged.log("daemon")]
    survivor = wave(staged, env, SURVIVOR, {"test/account": SURVIVOR}, "next")
    processes.append(survivor)
    wait_for(
        f"the next sync to wait on the {POOL} pool",
        lambda: (run := run_of(instance, SURVIVOR)) is not None
        and run.run_id in instance.event_log_storage.get_concurrency_info(POOL).pending_run_ids,
        START_SECONDS,
        logs[:1],
    )
    assert slot_holders(instance) == dead

    daemon = subprocess.Popen(
        [str(BIN / "dagster-daemon"), "run", "-w", str(staged.tmp_path / "empty_workspace.yaml")],
        cwd=staged.tmp_path,
        env=env,
        stdout=logs[1].open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    processes.append(daemon)
    wait_for(
        f"the next sync to run, once the dead runs' {POOL} slots are freed",
        lambda: survivor.poll() is not None,
        FREED_SECONDS,
        logs,
    )
    assert survivor.returncode == 0, logs[0].read_text(errors="replace")[-3000:]
    for account in KILLED:
        assert run_of(instance, account).status == dg.DagsterRunStatus.FAILURE
    assert run_of(instance, SURVIVOR).status == dg.DagsterRunStatus.SUCCESS
    assert slot_holders(instance) == set()


def assert_only_the_next_sync_wrote(staged: Stage) -> None:
    with staged.warehouse.connect(read_only=True) as con:
        outcomes = con.execute(
            "SELECT ad_account_id, outcome FROM meta_sync_runs WHERE outcome = 'ok'"
        ).fetchall()
    assert outcomes == [(SURVIVOR, "ok")]


@contextmanager
def slow_meta_world(
    tmp_path: Path, secrets_key: str
) -> Iterator[tuple[Stage, dg.DagsterInstance, dict, list[subprocess.Popen]]]:
    """The staged accounts, Meta answering slowly, the instance, the processes' environment
    and a list of processes killed on exit; afterwards, only the next sync may have written."""
    staged = stage(tmp_path)
    processes: list[subprocess.Popen] = []
    with (
        serve(staged.world) as server,
        dg.DagsterInstance.from_config(str(staged.home)) as instance,
    ):
        env = environment(staged, server.base_url, secrets_key)
        try:
            staged.world.request_delay_seconds = SLOW_META_SECONDS
            yield staged, instance, env, processes
        finally:
            for process in processes:
                kill(process)
            staged.world.request_delay_seconds = 0.0
    assert_only_the_next_sync_wrote(staged)


@pytest.mark.timeout(180)
def test_two_runs_killed_holding_meta_api_slots_then_a_sync_completes(tmp_path, secrets_key):
    with slow_meta_world(tmp_path, secrets_key) as (staged, instance, env, processes):
        killed = [
            wave(
                staged,
                env,
                account,
                {MAX_RUNTIME_TAG: str(DEAD_RUN_MAX_RUNTIME), "test/account": account},
                f"killed-{index}",
            )
            for index, account in enumerate(KILLED)
        ]
        processes += killed
        dead = wait_until_killed_runs_hold_the_pool(
            instance, [staged.log("killed-0"), staged.log("killed-1")]
        )
        for process in killed:
            kill(process)
            assert process.returncode == -signal.SIGKILL
        next_sync_completes(staged, env, instance, dead, processes)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def serves(port: int) -> bool:
    with suppress(Exception):
        DagsterGrpcClient(port=port, host="localhost").ping("")
        return True
    return False


def launch(
    instance: dg.DagsterInstance, context: BaseWorkspaceRequestContext, account: str
) -> dg.DagsterRun:
    """A wave run of `account`, started by the instance's run launcher as the daemon would."""
    location = context.get_code_location(LOCATION)
    (repository,) = location.get_repositories().values()
    job = repository.get_full_job(JOB)
    run = _create_run(
        instance, location, repository, job, sync_config(account), {"test/account": account},
        None, None,
    )
    return instance.launch_run(run.run_id, context)


@pytest.mark.timeout(120)
def test_runs_killed_with_their_code_server_fail_at_the_next_poll(tmp_path, secrets_key):
    with slow_meta_world(tmp_path, secrets_key) as (staged, instance, env, processes):
        port = free_port()
        code_server = subprocess.Popen(
            [str(BIN / "dagster"), "api", "grpc", "-m", "rastro_assets.definitions",
             "--host", "localhost", "--port", str(port), "--location-name", LOCATION],
            cwd=REPO,
            env=env,
            stdout=staged.log("code-server").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        processes.append(code_server)
        server_logs = [staged.log("code-server")]
        wait_for("the code server", lambda: serves(port), START_SECONDS, server_logs)
        target = GrpcServerTarget(
            host="localhost", port=port, socket=None, location_name=LOCATION
        )
        with WorkspaceProcessContext(instance, target) as workspace:
            context = workspace.create_request_context()
            for account in KILLED:
                launch(instance, context, account)
        dead = wait_until_killed_runs_hold_the_pool(instance, server_logs)
        for account in KILLED:
            # Far beyond this test's waits: only the health check can fail these runs.
            assert float(run_of(instance, account).tags[MAX_RUNTIME_TAG]) > 10 * FREED_SECONDS
        # The code server and its run workers share its process group.
        kill(code_server)
        assert code_server.returncode == -signal.SIGKILL
        next_sync_completes(staged, env, instance, dead, processes)

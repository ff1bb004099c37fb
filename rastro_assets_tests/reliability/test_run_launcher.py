"""The run launcher's health check, against real processes: alive, dead, unreaped, and a pid
whose number now belongs to another process.

`test_dead_run_slots.py` runs it end to end (a code server, a daemon); here each answer is
checked on its own, fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, replace

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from dagster._core.launcher import LaunchRunContext, WorkerStatus

from rastro_assets.defs import run_launcher
from rastro_assets.instance.run_launcher import (
    WORKER_TAG,
    Worker,
    WorkerCheckingRunLauncher,
    find_worker,
    worker_health,
)


@pytest.fixture
def child():
    """A live process started by the test, as a code server starts a run worker."""
    before = time.time()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process, before
    process.kill()
    process.wait()


@pytest.fixture
def launcher():
    with dg.DagsterInstance.ephemeral() as instance:
        launcher = WorkerCheckingRunLauncher()
        launcher.register_instance(instance)
        yield launcher


def noted(process: subprocess.Popen, before: float) -> Worker:
    worker = find_worker(process.pid, before, time.time())
    assert worker is not None and worker.pid == process.pid
    return worker


def run_tagged(worker: Worker | None) -> dg.DagsterRun:
    tags = {WORKER_TAG: json.dumps(asdict(worker)) if worker else ""}
    return dg.DagsterRun(job_name="meta_sync_wave", tags=tags)


def test_a_live_worker_is_running_and_a_killed_one_failed(child, launcher):
    process, before = child
    run = run_tagged(noted(process, before))
    assert launcher.supports_check_run_worker_health
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING

    process.kill()
    # Unreaped, the dead worker is a zombie that still has its /proc entry.
    time.sleep(0.2)
    health = launcher.check_run_worker_health(run)
    assert (health.status, health.msg) == (
        WorkerStatus.FAILED,
        f"run worker process {process.pid} has exited",
    )
    process.wait()
    health = launcher.check_run_worker_health(run)
    assert (health.status, health.msg) == (
        WorkerStatus.FAILED,
        f"run worker process {process.pid} is gone",
    )


def test_a_pid_now_held_by_another_process_is_a_dead_worker(child):
    process, before = child
    worker = noted(process, before)
    # The process that holds the pid now started at another tick than the one noted.
    health = worker_health(replace(worker, start_ticks=worker.start_ticks - 1))
    assert health.status == WorkerStatus.FAILED
    assert "reused" in health.reason


def test_a_process_that_started_outside_the_launch_is_not_taken_for_the_worker(child):
    process, _ = child
    # A process with the worker's number in this pid namespace, while the worker lives in
    # another: it started long before the launch.
    later = time.time() + 60
    assert find_worker(process.pid, later, later + 1) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"host": "elsewhere"}, "the run worker is on elsewhere, not here"),
        ({"pid_namespace": 1}, "the run worker is in another container"),
        ({"boot": "another-boot", "pid_namespace": 1}, "the run worker is on another machine"),
    ],
)
def test_a_worker_out_of_sight_is_left_to_its_max_runtime(child, launcher, change, reason):
    process, before = child
    worker = replace(noted(process, before), **change)
    process.kill()
    process.wait()
    assert worker_health(worker).status == WorkerStatus.UNKNOWN
    # Dagster fails a run on any answer but RUNNING and SUCCESS, UNKNOWN included.
    health = launcher.check_run_worker_health(run_tagged(worker))
    assert health.status == WorkerStatus.RUNNING
    assert reason in health.msg


def test_a_run_with_no_worker_noted_is_left_to_its_max_runtime(launcher):
    for run in (run_tagged(None), dg.DagsterRun(job_name="meta_sync_wave")):
        health = launcher.check_run_worker_health(run)
        assert health.status == WorkerStatus.RUNNING
        assert "cannot tell" in health.msg


def test_a_host_restart_took_the_worker(child):
    process, before = child
    worker = replace(noted(process, before), boot="the boot before")
    assert worker_health(worker).status == WorkerStatus.FAILED


@dg.op
def noop():
    pass


@dg.job
def one_op():
    noop()


def test_launch_notes_the_worker_over_a_planted_tag(launcher, monkeypatch):
    """The launcher writes the tag itself: a value the run was launched with is not kept."""
    instance = launcher._instance
    planted = Worker("here", "boot", 1, 1, 1)
    workers = []

    def start_worker(self, context):
        # What the code server's run worker logs at its start (dagster/_grpc/impl.py).
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        workers.append(process)
        instance.report_engine_event(
            f"Started process for run (pid: {process.pid}).",
            context.dagster_run,
            EngineEventData.in_process(process.pid),
        )

    monkeypatch.setattr(dg.DefaultRunLauncher, "launch_run", start_worker)
    try:
        run = instance.create_run_for_job(
            one_op, tags={WORKER_TAG: json.dumps(asdict(planted))}
        )
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        (process,) = workers
        worker = json.loads(instance.get_run_by_id(run.run_id).tags[WORKER_TAG])
        assert worker["pid"] == process.pid
    finally:
        for process in workers:
            process.kill()
            process.wait()

    # A worker that never logs its pid (it could not start) leaves no worker noted.
    monkeypatch.setattr(dg.DefaultRunLauncher, "launch_run", lambda self, context: None)
    monkeypatch.setattr(run_launcher, "PID_WAIT_SECONDS", 0.2)
    run = instance.create_run_for_job(one_op, tags={WORKER_TAG: json.dumps(asdict(planted))})
    launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    assert instance.get_run_by_id(run.run_id).tags[WORKER_TAG] == ""

"""Dagster's default run launcher, with a health check that sees a dead run worker.

`DefaultRunLauncher` answers no health check, so run monitoring fails a run only once it
outlives its `dagster/max_runtime`. The code server fails a run whose worker it saw exit,
but when the code server dies with its workers (a host restart, an OOM kill of the whole
process group), nothing does: the run stays STARTED for up to its limit and keeps its
`meta_api` pool slots that long, and as many dead runs as the pool's limit stop every Meta
sync.

This launcher notes the run worker at launch and lets monitoring ask whether it still
lives, so the dead run fails at the next poll and the slot sweep then frees its slots.

The worker: the code server's worker logs "Started process for run (pid: N)" with the pid in
its metadata before the run starts. Right after launching, the launcher looks that process
up in `/proc` and records in `WORKER_TAG` which kernel boot and pid namespace it lives in
and its start time in clock ticks: a pid is only judged by a process that shares both, and
a live process with that pid but another start time is another process that took the
number. The launcher runs in the daemon or the webserver, not in the run, and writes the
tag itself, over any value the run was launched with.

It only ever answers FAILED when it is sure. When it cannot tell (a worker on another host
or in another container, a run it did not launch), it answers RUNNING: Dagster's monitoring
fails a run on any other answer, UNKNOWN included, and the run's `dagster/max_runtime` still
ends it as before.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from rastro_assets.defs.dagster_private import (
    CheckRunHealthResult,
    LaunchRunContext,
    WorkerStatus,
    plugin_instance,
)

WORKER_TAG = "rastro/run_worker"
"""Where the run worker lives: written by this launcher only, `""` when it could not tell."""
STARTED_MESSAGE = "Started process for run"
# The worker logs its pid just after the code server answers the launch: a few database
# round trips, unless the host is swamped.
PID_WAIT_SECONDS = 5.0
# /proc gives start times in ticks since boot; against the wall clock they are only this good.
CLOCK_SLACK_SECONDS = 1.0
PROC = Path("/proc")


@dataclass(frozen=True)
class Worker:
    """A process, named so a different process with the same pid cannot pass for it."""

    host: str
    boot: str
    pid_namespace: int
    pid: int
    start_ticks: int


@dataclass(frozen=True)
class Health:
    status: WorkerStatus
    reason: str


def _here() -> tuple[str, str, int] | None:
    """This process's host, kernel boot and pid namespace, or None off Linux."""
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat(PROC / "self/ns/pid").st_ino
    except OSError:
        return None
    return socket.gethostname(), boot, namespace


def _stat(pid: int) -> tuple[str, int] | None:
    """A live pid's state letter and start time in ticks since boot, or None if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name in parentheses may itself hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _started_at(start_ticks: int) -> float:
    """A start time in ticks since boot, as a wall-clock timestamp."""
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start


def worker_health(worker: Worker | None) -> Health:
    """FAILED only when this process can see that the worker is gone."""
    if worker is None:
        return Health(WorkerStatus.UNKNOWN, "no run worker was noted at launch")
    here = _here()
    if here is None:
        return Health(WorkerStatus.UNKNOWN, "no /proc to look in")
    host, boot, namespace = here
    if worker.host != host:
        return Health(WorkerStatus.UNKNOWN, f"the run worker is on {worker.host}, not here")
    if worker.boot != boot:
        if worker.pid_namespace == namespace:
            # Same host name and the host's own pid namespace, whose number never changes: the
            # machine restarted since, and took every process of the old boot with it.
            return Health(WorkerStatus.FAILED, "the host restarted since the run was launched")
        return Health(WorkerStatus.UNKNOWN, "the run worker is on another machine")
    if worker.pid_namespace != namespace:
        return Health(WorkerStatus.UNKNOWN, "the run worker is in another container")
    stat = _stat(worker.pid)
    if stat is None:
        return Health(WorkerStatus.FAILED, f"run worker process {worker.pid} is gone")
    state, start_ticks = stat
    if start_ticks != worker.start_ticks:
        return Health(
            WorkerStatus.FAILED, f"run worker process {worker.pid} is gone; its pid was reused"
        )
    if state in ("Z", "X"):
        return Health(WorkerStatus.FAILED, f"run worker process {worker.pid} has exited")
    return Health(WorkerStatus.RUNNING, f"run worker process {worker.pid} is alive")


def read_worker(run: dg.DagsterRun) -> Worker | None:
    raw = run.tags.get(WORKER_TAG)
    if not raw:
        return None
    try:
        return Worker(**json.loads(raw))
    except (TypeError, ValueError):
        return None


def find_worker(pid: int, not_before: float, not_after: float) -> Worker | None:
    """The process `pid` if it lives here and started in the window, else None.

    The window is what tells the run worker from a process that has the same number in this
    pid namespace while the worker lives in another one.
    """
    here = _here()
    stat = _stat(pid)
    if here is None or stat is None or stat[0] in ("Z", "X"):
        return None
    started_at = _started_at(stat[1])
    if not not_before - CLOCK_SLACK_SECONDS <= started_at <= not_after + CLOCK_SLACK_SECONDS:
        return None
    return Worker(*here, pid=pid, start_ticks=stat[1])


class WorkerCheckingRunLauncher(dg.DefaultRunLauncher):
    """`DefaultRunLauncher`, whose runs monitoring fails within a poll of their worker's death."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if run.tags.get(WORKER_TAG):
            plugin_instance(self).add_run_tags(run.run_id, {WORKER_TAG: ""})
        launched_at = time.time()
        super().launch_run(context)
        worker = self._note_worker(run.run_id, launched_at)
        plugin_instance(self).add_run_tags(
            run.run_id, {WORKER_TAG: json.dumps(asdict(worker)) if worker else ""}
        )

    def _note_worker(self, run_id: str, launched_at: float) -> Worker | None:
        deadline = time.monotonic() + PID_WAIT_SECONDS
        while True:
            started = self._started_event(run_id)
            if started is not None:
                pid, logged_at = started
                return find_worker(pid, launched_at, logged_at)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _started_event(self, run_id: str) -> tuple[int, float] | None:
        """The pid the run worker logged at its start, and when (dagster/_grpc/impl.py)."""
        logs = plugin_instance(self).all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
        for entry in logs:
            event = entry.dagster_event
            if event is None or not (event.message or "").startswith(STARTED_MESSAGE):
                continue
            pid: Any = event.engine_event_data.metadata.get("pid")
            try:
                return int(pid.value), entry.timestamp
            except (AttributeError, TypeError, ValueError):
                continue
        return None

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        health = worker_health(read_worker(run))
        if health.status is WorkerStatus.UNKNOWN:
            return CheckRunHealthResult(
                WorkerStatus.RUNNING, f"cannot tell: {health.reason}; left to its max runtime"
            )
        return CheckRunHealthResult(health.status, health.reason)

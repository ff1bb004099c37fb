"""The runs in flight on an instance, stopped because whoever started Dagster stops it: each
is marked as canceled by the user, not failed, and its worker is asked to stop.

`python -m rastro_assets.instance.runs_in_flight` does it for the instance at `DAGSTER_HOME`
(`rastro demo` runs it when it is stopped, before Dagster is): once, then again every
`SWEEP_SECONDS` for the runs the daemon launches meanwhile, until its stdin closes once
Dagster has stopped; then the runs it stopped that no worker marked canceled are marked so.
It prints `swept` after the first pass, and for each run it stopped how that run ended, once it
has: `canceled RUN_ID JOB`, or `ended RUN_ID JOB STATUS` for a run whose worker finished it
before the request to stop reached it.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading

import dagster as dg

IN_FLIGHT = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
"""Runs a worker is executing. Queued runs stay queued: the next start runs them."""
ENDED = [dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
STOPPED_BY_THE_USER = "stopped by the user: Dagster is stopping"
SWEEP_SECONDS = 0.5


def cancel_runs_in_flight(
    instance: dg.DagsterInstance, message: str, handled: dict[str, dg.DagsterRunStatus]
) -> list[dg.DagsterRun]:
    """Stop each run in flight, with `message`: one still starting is marked canceled (its
    worker, once up, finds it so and exits), one started is marked canceling and its worker
    asked to stop. The runs stopped; `handled` notes each run's status when it was, so a
    run stopped while starting and started meanwhile is stopped again."""
    stopped = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT)):
        if handled.get(run.run_id) == run.status:
            continue
        handled[run.run_id] = run.status
        if run.status == dg.DagsterRunStatus.STARTING:
            instance.report_run_canceled(run, message=message)
        else:
            instance.report_run_canceling(run, message=message)
            # Its code server may be gone: the worker then dies with Dagster, and the run
            # is marked canceled once Dagster has stopped (`end_canceling`).
            with contextlib.suppress(dg.DagsterError):
                instance.run_launcher.terminate(run.run_id)
        stopped.append(run)
    return stopped


def end_canceling(instance: dg.DagsterInstance, message: str, run_ids: list[str]) -> None:
    """Mark canceled the runs of `run_ids` still canceling: their workers stopped with
    Dagster before they could say so."""
    if not run_ids:
        return
    still = dg.RunsFilter(run_ids=run_ids, statuses=[dg.DagsterRunStatus.CANCELING])
    for run in instance.get_runs(filters=still):
        instance.report_run_canceled(run, message=message)


def newly_ended(
    instance: dg.DagsterInstance, stopped: dict[str, str], told: set[str]
) -> list[str]:
    """A line for each run of `stopped` (run id: job) that has ended since the last call:
    a worker may finish its run in the moment between the request to stop and its arrival,
    and the run then ended as its worker says, not canceled."""
    pending = [run_id for run_id in stopped if run_id not in told]
    if not pending:
        return []
    lines = []
    for run in instance.get_runs(filters=dg.RunsFilter(run_ids=pending, statuses=ENDED)):
        told.add(run.run_id)
        if run.status == dg.DagsterRunStatus.CANCELED:
            lines.append(f"canceled {run.run_id} {stopped[run.run_id]}")
        else:
            lines.append(f"ended {run.run_id} {stopped[run.run_id]} {run.status.value}")
    return lines


def main() -> int:
    stdin_closed = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stdin_closed.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    handled: dict[str, dg.DagsterRunStatus] = {}
    stopped: dict[str, str] = {}
    told: set[str] = set()
    with dg.DagsterInstance.get() as instance:
        for sweep in itertools.count():
            for run in cancel_runs_in_flight(instance, STOPPED_BY_THE_USER, handled):
                stopped[run.run_id] = run.job_name
            for line in newly_ended(instance, stopped, told):
                print(line, flush=True)
            if sweep == 0:
                print("swept", flush=True)
            if stdin_closed.wait(SWEEP_SECONDS):
                break
        end_canceling(instance, STOPPED_BY_THE_USER, list(handled))
        for line in newly_ended(instance, stopped, told):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

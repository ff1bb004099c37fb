"""What the sweep that stops the runs in flight says of each run it stopped: how the run
ended, once it has, and nothing before. A run its worker finished before the request to stop
arrived is told as it ended, not as canceled."""

from __future__ import annotations

import dagster as dg

from rastro_assets.instance.runs_in_flight import (
    STOPPED_BY_THE_USER,
    cancel_runs_in_flight,
    end_canceling,
    newly_ended,
)


@dg.op
def step() -> None:
    pass


@dg.job
def work() -> None:
    step()


def started_run(instance: dg.DagsterInstance) -> dg.DagsterRun:
    run = instance.create_run_for_job(work)
    instance.handle_new_event(
        dg.EventLogEntry(
            error_info=None, level="DEBUG", user_message="", run_id=run.run_id,
            timestamp=0.0, dagster_event=dg.DagsterEvent(
                event_type_value=dg.DagsterEventType.RUN_START.value, job_name=run.job_name,
            ),
        )
    )
    started = instance.get_run_by_id(run.run_id)
    assert started.status == dg.DagsterRunStatus.STARTED
    return started


def test_each_stopped_run_is_told_once_as_it_ended():
    with dg.instance_for_test() as instance:
        finished_first = started_run(instance)
        canceled = started_run(instance)
        handled: dict = {}
        stopped = {
            run.run_id: run.job_name
            for run in cancel_runs_in_flight(instance, STOPPED_BY_THE_USER, handled)
        }
        assert set(stopped) == {finished_first.run_id, canceled.run_id}
        told: set[str] = set()
        assert newly_ended(instance, stopped, told) == []

        # The worker's success lands after the request to stop: the run ended as it says.
        instance.report_dagster_event(
            dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_SUCCESS.value,
                            job_name="work"),
            run_id=finished_first.run_id,
        )
        assert newly_ended(instance, stopped, told) == [
            f"ended {finished_first.run_id} work SUCCESS"
        ]
        end_canceling(instance, STOPPED_BY_THE_USER, list(handled))
        assert newly_ended(instance, stopped, told) == [f"canceled {canceled.run_id} work"]
        assert newly_ended(instance, stopped, told) == []

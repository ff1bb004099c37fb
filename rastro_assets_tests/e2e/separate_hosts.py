"""A run launcher for the end-to-end tests that starts each run as if on a machine of its own.

`K8sRunLauncher` starts each run as a Kubernetes Job: a new container runs
`dagster api execute_run` with the instance's `dagster.yaml` (a ConfigMap) as its only file,
the environment the launcher names, and an empty working directory that goes away with the
pod. This launcher does the same with local processes, so a test can show that a run needs
nothing of the launching host's disk: each run worker gets a new empty working directory, a
new empty `TMPDIR`, and a new `DAGSTER_HOME` holding only a copy of the launcher's
`dagster.yaml`; its environment is the launcher's variables of the named prefixes (the
ConfigMap and Secret a pod gets), never `RASTRO_DUCKDB_PATH`.
What the run leaves in those directories stays for the test to look at.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.launcher import (
    CheckRunHealthResult,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, ConfigurableClassData, serialize_value

# What a pod's image gives every process, beside the variables the launcher passes on.
BASE_VARIABLES = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ", "VIRTUAL_ENV")


class SeparateHostRunLauncher(RunLauncher, ConfigurableClass):
    """Each run a `dagster api execute_run` process with its own empty directories."""

    def __init__(
        self,
        hosts_dir: str,
        env_prefixes: list[str],
        inst_data: ConfigurableClassData | None = None,
    ) -> None:
        self._inst_data = inst_data
        self._hosts_dir = Path(hosts_dir)
        self._env_prefixes = tuple(env_prefixes)
        self._workers: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {
            # Where each run's directories are made, one directory a run.
            "hosts_dir": str,
            # The launcher's variables a run gets (a pod's `env_config_maps`, `env_secrets`).
            "env_prefixes": dg.Field(
                [str], is_required=False, default_value=["RASTRO_", "DAGSTER_"]
            ),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> SeparateHostRunLauncher:
        return cls(inst_data=inst_data, **config_value)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = context.job_code_origin
        assert origin is not None, "a run without a code origin"
        host = self._hosts_dir / run.run_id
        work, tmp, home = host / "work", host / "tmp", host / "dagster_home"
        for directory in (work, tmp, home):
            directory.mkdir(parents=True)
        shutil.copyfile(Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml", home / "dagster.yaml")
        env = {
            name: value
            for name, value in os.environ.items()
            if (name in BASE_VARIABLES or name.startswith(self._env_prefixes))
            and name not in ("RASTRO_DUCKDB_PATH", "DAGSTER_HOME")
        }
        env.update(DAGSTER_HOME=str(home), TMPDIR=str(tmp), HOME=str(work))
        # The code's own Python, as the image's entry point would be; PATH need not hold it.
        args = ExecuteRunArgs(job_origin=origin, run_id=run.run_id, instance_ref=None)
        command = [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)]
        self._instance.report_engine_event(
            f"Starting the run worker in {work}", run, cls=self.__class__
        )
        with (host / "worker.log").open("ab") as log:
            worker = subprocess.Popen(
                command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT,
            )
        with self._lock:
            self._workers[run.run_id] = worker

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        with self._lock:
            worker = self._workers.get(run.run_id)
        if worker is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not launched by this process")
        code = worker.poll()
        if code is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if code == 0:
            return CheckRunHealthResult(WorkerStatus.SUCCESS)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"the run worker exited with {code}")

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        with self._lock:
            worker = self._workers.get(run_id)
        if run is None or run.is_finished or worker is None or worker.poll() is not None:
            return False
        self._instance.report_run_canceling(run)
        worker.send_signal(signal.SIGINT)
        return True

    def dispose(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.poll()

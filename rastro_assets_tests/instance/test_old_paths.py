"""A `dagster.yaml` written before the instance plug-ins moved out of `defs/` still loads,
and says in one line what to write instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PLUG_INS = {
    "run_queue": "AccountRunCoordinator",
    "run_launcher": "WorkerCheckingRunLauncher",
    "postgres_storage": "PooledPostgresStorage",
    "daemon_logs": "summarise_backfill_logs",
}


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", **env},
        check=False,
    )


@pytest.mark.parametrize(("module", "name"), sorted(PLUG_INS.items()))
def test_an_old_path_loads_the_moved_module_with_one_warning(module: str, name: str):
    old, new = f"rastro_assets.defs.{module}", f"rastro_assets.instance.{module}"
    done = _python(
        f"import importlib\n"
        f"old = importlib.import_module({old!r}); new = importlib.import_module({new!r})\n"
        f"assert old is new and getattr(old, {name!r}).__module__ == {new!r}\n"
        f"importlib.import_module({old!r})\n"
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "MovedPlugInWarning" in line]
    assert len(warnings) == 1, done.stderr
    assert f"write `module: {new}`" in warnings[0]


def test_an_instance_whose_dagster_yaml_names_the_old_paths_runs(tmp_path: Path):
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    for part in ("run_coordinator", "run_launcher"):
        config[part]["module"] = config[part]["module"].replace(".instance.", ".defs.")
        assert config[part]["module"].startswith("rastro_assets.defs.")
    config["storage"] = {"sqlite": {"base_dir": str(tmp_path / "storage")}}
    for part, key in (("local_artifact_storage", "base_dir"), ("compute_logs", "base_dir")):
        config[part]["config"][key] = str(tmp_path / part)
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    done = _python(
        "import dagster as dg\n"
        "with dg.DagsterInstance.get() as instance:\n"
        "    print(type(instance.run_coordinator).__module__,"
        " type(instance.run_launcher).__module__)\n",
        DAGSTER_HOME=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "rastro_assets.instance.run_queue",
        "rastro_assets.instance.run_launcher",
    ]
    assert "write `module: rastro_assets.instance.run_queue`" in done.stderr

"""The queue's coordinator closes the instance's local directories to other users.

A second line behind the service's umask: an operator who starts `dagster dev` or
`dagster-daemon` under a loose umask still gets directories no other local user enters.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import dagster as dg
import yaml

from rastro_assets.instance.run_queue import AccountRunCoordinator

REPO = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_loading_the_coordinator_closes_the_instances_directories(tmp_path, monkeypatch):
    # The repo's dagster.yaml as is: relative paths, from the repo root's stand-in.
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    directories = [
        Path(config["local_artifact_storage"]["config"]["base_dir"]),
        Path(config["storage"]["sqlite"]["base_dir"]),
        Path(config["compute_logs"]["config"]["base_dir"]),
    ]
    previous = os.umask(0)
    try:
        for directory in directories:
            directory.mkdir(mode=0o777, parents=True, exist_ok=True)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert {mode(directory) for directory in directories} == {0o777}
            assert isinstance(instance.run_coordinator, AccountRunCoordinator)
    finally:
        os.umask(previous)
    assert {str(directory): mode(directory) for directory in directories} == {
        str(directory): 0o700 for directory in directories
    }

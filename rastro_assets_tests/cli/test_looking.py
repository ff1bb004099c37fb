"""A command that only looks creates nothing: no warehouse, no directory, no file at all.

In a fresh clone (the repo's workspace.yaml, no data/), `rastro shard move --dry-run` once
created data/rastro.duckdb, and `rastro status` then said "no linked accounts yet" where
the truth was "no warehouse at ...". Opening the file, even read-only, creates and migrates
a missing one, so each such command asks first whether it is there. A command that writes
but is refused for want of a warehouse (an unknown site, a link that is not there) leaves
nothing behind either.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from rastro_assets_tests.cli.conftest import assert_usage_error

REPO = Path(__file__).resolve().parents[2]

LOOKING = [
    ("status",),
    ("status", "--json"),
    ("plan",),
    ("plan", "--json"),
    ("shard",),
    ("shard", "list"),
    ("shard", "list", "--json"),
    ("shard", "move", "--dry-run"),
    ("shard", "move"),
    ("site", "list"),
    ("site", "list", "--json"),
]

REFUSED = [
    (("site", "rename", "s1", "Shop"), "unknown site 's1'"),
    (("site", "remove", "s1"), "unknown site 's1'"),
    (("unlink", "s1", "act_1"), "site 's1' is not linked to act_1"),
    (
        ("link", "s1", "act_1", "--connection", "c1", "--timezone", "UTC", "--currency", "USD",
         "--no-verify"),
        "unknown site 's1'",
    ),
    (
        ("link", "s1", "act_1", "act_2", "--connection", "c1", "--timezone", "UTC",
         "--currency", "USD", "--no-verify"),
        "unknown site 's1'",
    ),
    (("sync-now", "act_1"), "act_1 is not linked to any site"),
]


@pytest.fixture
def rastro_environ() -> Mapping[str, str]:
    """No variable names a file: each command finds the project from its directory."""
    return {}


@pytest.fixture(autouse=True)
def no_path_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RASTRO_DUCKDB_PATH", "RASTRO_ANALYTICS_PATH", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh clone as the working directory: the repo's workspace.yaml and nothing else."""
    root = tmp_path / "clone"
    root.mkdir()
    shutil.copyfile(REPO / "workspace.yaml", root / "workspace.yaml")
    monkeypatch.chdir(root)
    return Path(os.getcwd())


def tree(root: Path) -> list[str]:
    """Everything under `root`, hidden files included, as paths relative to it."""
    return sorted(
        os.path.relpath(os.path.join(parent, name), root)
        for parent, directories, files in os.walk(root)
        for name in [*directories, *files]
    )


def said(args: tuple[str, ...], out: str, err: str) -> str:
    """The no-warehouse line: on stdout for people; on stderr beside `[]` for --json."""
    if "--json" in args:
        assert json.loads(out) == []
        [line] = err.splitlines()
        assert line.startswith("rastro: warning: ")
        return line
    assert err == ""
    [line] = out.splitlines()
    return line


@pytest.mark.parametrize("args", LOOKING, ids=" ".join)
def test_in_a_fresh_clone_it_says_no_warehouse_and_creates_nothing(rastro, clone, args):
    assert tree(clone) == ["workspace.yaml"]
    code, out, err = rastro(*args)
    assert code == 0, err
    line = said(args, out, err)
    assert f"no warehouse at {clone / 'data' / 'rastro.duckdb'}:" in line
    assert "no linked accounts" not in line
    assert tree(clone) == ["workspace.yaml"]


def test_a_dry_run_leaves_status_telling_the_truth(rastro, clone):
    assert rastro("shard", "move", "--dry-run")[0] == 0
    code, out, _ = rastro("status")
    assert code == 0
    assert out.startswith(f"no warehouse at {clone / 'data' / 'rastro.duckdb'}:")
    assert tree(clone) == ["workspace.yaml"]


@pytest.mark.parametrize(
    ("args", "fragment"), REFUSED, ids=[" ".join(args[:2]) for args, _ in REFUSED]
)
def test_a_refusal_for_want_of_a_warehouse_creates_nothing(rastro, clone, args, fragment):
    assert_usage_error(
        rastro(*args), fragment, f"no warehouse at {clone / 'data' / 'rastro.duckdb'}"
    )
    assert tree(clone) == ["workspace.yaml"]


def test_sql_in_a_fresh_clone_names_the_snapshot_and_creates_nothing(rastro, clone):
    assert_usage_error(
        rastro("sql", "SELECT 1"),
        f"no analytics snapshot at {clone / 'data' / 'analytics.duckdb'}",
        f"nor is the pipeline's file at {clone / 'data' / 'rastro.duckdb'}",
    )
    assert tree(clone) == ["workspace.yaml"]


@pytest.mark.parametrize("args", LOOKING, ids=" ".join)
def test_a_named_file_in_a_directory_not_there_is_not_created(rastro, tmp_path, args):
    """RASTRO_DUCKDB_PATH names a file two directories down that do not exist."""
    path = tmp_path / "srv" / "rastro" / "rastro.duckdb"
    code, out, err = rastro(*args, environ={"RASTRO_DUCKDB_PATH": str(path)})
    assert code == 0, err
    assert f"no warehouse at {path}:" in said(args, out, err)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("args", LOOKING, ids=" ".join)
def test_in_an_empty_directory_it_names_the_path_tried_and_creates_nothing(
    rastro, tmp_path, monkeypatch, args
):
    """No project upward: nothing is guessed, as test_paths.py says of status and plan."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert_usage_error(
        rastro(*args),
        "RASTRO_DUCKDB_PATH is not set",
        f"tried {Path(os.getcwd()) / 'data' / 'rastro.duckdb'}",
    )
    assert tree(tmp_path) == ["empty"]

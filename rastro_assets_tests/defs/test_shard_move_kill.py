"""`rastro shard move` SIGKILLed at each step, then run again: each account-day is recorded
once in the new shard, and no account is ever in two shards' partitions."""

from __future__ import annotations

import io
import os
import select
import shutil
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef

from rastro_assets import shards
from rastro_assets.cli import run
from rastro_assets.cli.context import Context
from rastro_assets.defs.partitions import spend_shard
from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.defs.instance_events import add_run, record_spend

REPO = Path(__file__).resolve().parents[2]
ACCOUNTS = ["act_1", "act_2", "act_3", "act_4"]
# Two shards for four accounts of shard 0: act_3 and act_4 move to shard 1.
MOVING = ["act_3", "act_4"]
SHARDS = 2
DAYS = [str(datetime(2026, 11, 30, tzinfo=UTC).date() - timedelta(days=back))
        for back in range(30)]
# Account-days of both spend assets of one moving account: 60; of both, 120.
POINTS = ["event:25", "store:before", "store:after", "place:between", "event:85"]


def _instance(home: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


@pytest.fixture(scope="module")
def recorded_world(tmp_path_factory) -> Path:
    """The Dagster home and warehouse every test starts from, built once: each test moves a
    copy of its own."""
    built = tmp_path_factory.mktemp("recorded_world")
    home = built / "home"
    home.mkdir()
    warehouse = Warehouse(built / "rastro.duckdb")
    now = datetime(2026, 12, 1, tzinfo=UTC)
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        for account in ACCOUNTS:
            link_store.link_account(con, "s1", account, "c1", "UTC", "USD", now)
    with _instance(home) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), ACCOUNTS)
        add_run(instance, "r1")
        record_spend(instance, "r1", [f"{a}|{day}" for a in ACCOUNTS for day in DAYS])
    return built


@pytest.fixture
def world(recorded_world, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(recorded_world / "home", home)
    shutil.copyfile(recorded_world / "rastro.duckdb", tmp_path / "rastro.duckdb")
    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "RASTRO_DUCKDB_PATH": warehouse.path,
        "RASTRO_ACCOUNT_SHARDS": str(SHARDS),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    return home, warehouse, env


def _holders(instance: dg.DagsterInstance) -> dict[str, list[int]]:
    held: dict[str, list[int]] = {account: [] for account in ACCOUNTS}
    for shard in range(SHARDS):
        for account in instance.get_dynamic_partitions(shards.accounts_name(shard)):
            held[account].append(shard)
    return held


def _read_line(stream, timeout_seconds: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout_seconds)
    if not ready:
        raise AssertionError(f"the child said nothing within {timeout_seconds:.0f} s")
    return stream.readline().decode().strip()


@pytest.mark.parametrize("point", POINTS)
def test_a_move_killed_and_run_again_records_each_day_once_in_one_shard(
    tmp_path, world, monkeypatch, point
):
    home, warehouse, env = world
    log = tmp_path / "child.log"
    child = subprocess.Popen(
        [sys.executable, "-m", "rastro_assets_tests.defs._move_child", point],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    try:
        said = _read_line(child.stdout, 120)
        while said.startswith("act_"):  # the accounts moved before the point
            said = _read_line(child.stdout, 60)
        assert said == f"stopped {point}", (said, log.read_text())
        with _instance(home) as instance:
            assert all(len(shards) <= 1 for shards in _holders(instance).values()), (
                point, _holders(instance))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(environ=env, stdin=io.StringIO(), stdout=out, stderr=err)
    assert run(["shard", "move"], ctx) == 0, err.getvalue()
    assert run(["shard", "move"], ctx) == 0, err.getvalue()
    assert out.getvalue().strip().endswith("nothing to move: 4 accounts over 2 shards")

    with warehouse.connect(read_only=True) as con:
        stored = shard_store.account_shards(con)
    assert stored == {"act_1": 0, "act_2": 0, "act_3": 1, "act_4": 1}
    with _instance(home) as instance:
        assert _holders(instance) == {account: [stored[account]] for account in ACCOUNTS}
        for key in spend_shard(1).keys:
            records = instance.fetch_materializations(key, limit=10_000).records
            per_day = Counter(record.partition_key for record in records)
            assert per_day == {f"{a}|{day}": 1 for a in MOVING for day in DAYS}, key

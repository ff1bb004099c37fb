"""What the daemon end-to-end tests share: one account of the fake Graph linked in a fresh
warehouse, a real `dagster-daemon` over it, and the questions the tests ask while it runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from rastro_assets.analytics.publish import Publisher
from rastro_assets.planner import cadence
from rastro_assets.planner.history import planned_accounts
from rastro_assets.timekeeping import local_date
from rastro_assets.vault import Vault
from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.engines import AnyWarehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.conftest import TOKEN, record_sync_run
from rastro_assets_tests.truth import assert_equals_truth
from rastro_fake_graph.server import serve
from rastro_fake_graph.world import FakeWorld, MutableClock

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "act_777"
TIMEZONE = "Pacific/Auckland"
POLL_SECONDS = 1.0
LAG_SECONDS = 30
LEASE_SECONDS = 30  # a killed wave's accounts are taken again this long after it started
SENSOR_INTERVAL_SECONDS = 5
MONITOR_SECONDS = 5


def instance_yaml(home: Path) -> dict:
    """The repo's instance configuration, with its storage moved into `home`."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    config["storage"] = {"sqlite": {"base_dir": str(home / "storage")}}
    config["local_artifact_storage"]["config"]["base_dir"] = str(home)
    config["compute_logs"]["config"]["base_dir"] = str(home / "logs")
    config["run_monitoring"]["poll_interval_seconds"] = MONITOR_SECONDS
    return config


def one_account_world() -> FakeWorld:
    world = FakeWorld(seed=11)
    world.add_account(ACCOUNT, timezone=TIMEZONE, currency="NZD", n_ads=3, token=TOKEN)
    return world


def linked_warehouse(
    directory: Path,
    accounts: list[str],
    timezone: str,
    currency: str,
    warehouse_url: str | None = None,
) -> tuple[AnyWarehouse, Path]:
    """A new warehouse with `accounts` linked to site `s1` through connection `c1` (TOKEN
    sealed), and its first snapshot published in `directory`: the warehouse and the
    snapshot's path. The warehouse is the database of `warehouse_url` when given, else a
    DuckDB file in `directory`."""
    snapshot_path = directory / "analytics.duckdb"
    warehouse = (
        PostgresWarehouse(warehouse_url, snapshot_path=str(snapshot_path))
        if warehouse_url
        else Warehouse(directory / "rastro.duckdb")
    )
    warehouse.migrate()
    vault = Vault.from_env()
    now = datetime.now(UTC)
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", "Site one", now)
        registry.save_connection(con, "c1", vault.seal("c1", TOKEN), now)
        for account in accounts:
            link_store.link_account(con, "s1", account, "c1", timezone, currency, now)
    Publisher(warehouse, snapshot_path).publish()
    return warehouse, snapshot_path


def freeze_today(world: FakeWorld) -> None:
    """Stop the world's clock at the wall clock's now, for a test that compares today with
    the truth: today's figures grow through the day, so a wave's read and the truth asked a
    few seconds later may differ by a cent. The product keeps its own (wall) clock."""
    world.clock = MutableClock(datetime.now(UTC))


def wait_for(what: str, predicate, timeout_seconds: float):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out after {timeout_seconds:.0f} s waiting for {what}")


class Daemon:
    """`dagster-daemon run` from the repo root, in a process group of its own."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=REPO,
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL the daemon with its code servers and run workers: nothing ends cleanly."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        # A code server busy on a loaded machine can outlive its daemon by a minute; the test's
        # servers (fake Graph, Postgres) go away next, so nothing of the daemon may stay.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


@dataclass
class LinkedWorld:
    world: FakeWorld
    warehouse: AnyWarehouse
    vault: Vault
    home: Path
    daemon: Daemon
    snapshot_path: Path


@contextlib.contextmanager
def linked_world(
    tmp_path: Path,
    secrets_key: str,
    world: FakeWorld,
    instance_config: dict,
    extra_env: dict[str, str] | None = None,
    prepare: Callable[[AnyWarehouse], None] | None = None,
    warehouse_url: str | None = None,
    snapshot_dir: Path | None = None,
) -> Iterator[LinkedWorld]:
    """`ACCOUNT` linked to site `s1` in a new warehouse, the fake Graph serving `world`, and a
    running daemon on a Dagster home holding `instance_config`; the daemon stops on exit.
    `prepare` changes the warehouse before the daemon starts.

    With `warehouse_url` the warehouse is that PostgreSQL database and no process is told of
    a DuckDB file (`RASTRO_DUCKDB_PATH` unset); the snapshot is published in `snapshot_dir`
    (default `tmp_path`)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config))
    warehouse, snapshot_path = linked_warehouse(
        snapshot_dir or tmp_path, [ACCOUNT], TIMEZONE, "NZD", warehouse_url
    )
    where = (
        {"RASTRO_WAREHOUSE_URL": warehouse_url}
        if warehouse_url
        else {"RASTRO_DUCKDB_PATH": str(warehouse.path)}
    )
    if prepare is not None:
        prepare(warehouse)
    vault = Vault.from_env()
    with serve(world) as server:
        env = {
            **{
                name: value
                for name, value in os.environ.items()
                if name not in ("RASTRO_DUCKDB_PATH", "RASTRO_WAREHOUSE_URL")
            },
            **(extra_env or {}),
            "DAGSTER_HOME": str(home),
            **where,
            "RASTRO_META_GRAPH_URL": server.base_url,
            "RASTRO_SECRETS_KEY": secrets_key,
            "RASTRO_SENSOR_INTERVAL_SECONDS": str(SENSOR_INTERVAL_SECONDS),
            "RASTRO_SYNC_LEASE_SECONDS": str(LEASE_SECONDS),
            "RASTRO_ANALYTICS_PATH": str(snapshot_path),
            "RASTRO_ANALYTICS_LAG_SECONDS": str(LAG_SECONDS),
        }
        daemon = Daemon(env, tmp_path / "daemon.log")
        daemon.start()
        try:
            yield LinkedWorld(world, warehouse, vault, home, daemon, snapshot_path)
        finally:
            daemon.stop()
            if isinstance(warehouse, PostgresWarehouse):
                warehouse.close()


def account_status(warehouse: AnyWarehouse) -> cadence.AccountStatus:
    with warehouse.connect() as con:
        [account] = planned_accounts(con)
    return cadence.status(account.state, datetime.now(UTC))


def runs(warehouse: AnyWarehouse, kind: str) -> list[tuple]:
    with warehouse.connect() as con:
        return con.execute(
            "SELECT since, until, outcome FROM meta_sync_runs WHERE kind = ? ORDER BY started_at",
            [kind],
        ).fetchall()


def wait_for_the_backfill(warehouse: AnyWarehouse, world: FakeWorld, timeout_seconds: float):
    """The new account's 90-day backfill, once done and published: 30-day blocks, all ok,
    equal to Meta.

    Published too: the run publishes the snapshot after its last block, and an analyst
    opening the snapshot before then opens the file an earlier session may hold.

    Returns its sync runs.
    """
    wait_for(
        "the 90-day backfill, published",
        lambda: (
            account_status(warehouse).state == "live"
            and len(runs(warehouse, "backfill")) >= 3
            and published_after_backfill(warehouse)
        ),
        timeout_seconds=timeout_seconds,
    )
    backfill = runs(warehouse, "backfill")
    assert [outcome for *_, outcome in backfill] == ["ok"] * len(backfill)
    assert max((until - since).days + 1 for since, until, _ in backfill) == 30
    today = local_date(datetime.now(UTC), TIMEZONE)
    with warehouse.connect() as con:
        assert_equals_truth(
            con, world, ACCOUNT, today - timedelta(days=89), today - timedelta(days=2)
        )
    return backfill


def published_after_backfill(warehouse: AnyWarehouse) -> bool:
    """A snapshot was published after the last backfill block finished."""
    with warehouse.connect() as con:
        [[published, finished]] = con.execute(
            "SELECT (SELECT max(published_at) FROM analytics_snapshot_state),"
            " (SELECT max(finished_at) FROM meta_sync_runs WHERE kind = 'backfill')"
        ).fetchall()
    return published is not None and finished is not None and published >= finished


def wave_outcome_after(warehouse: AnyWarehouse, instant: datetime) -> str | None:
    """The outcome of the first finished wave sync (live, daily, weekly) after `instant`."""
    with warehouse.connect() as con:
        row = con.execute(
            """
            SELECT outcome FROM meta_sync_runs
            WHERE kind IN ('live', 'daily', 'weekly') AND started_at > ? AND outcome IS NOT NULL
            ORDER BY started_at LIMIT 1
            """,
            [instant],
        ).fetchone()
    return row[0] if row else None


def backfilled(warehouse: AnyWarehouse) -> None:
    """The account's 90-day backfill recorded as done (with the catalog) and a sync asked for,
    so the daemon's first look starts a live wave instead of a backfill: Dagster's backfill
    daemon looks at a new partition backfill only every 30 s."""
    now = datetime.now(UTC)
    today = local_date(now, TIMEZONE)
    with warehouse.connect() as con:
        record_sync_run(
            con, "seeded-backfill", ACCOUNT, "backfill", today - timedelta(days=89), today,
            now - timedelta(minutes=1), catalog=True,
        )
        registry.request_sync(con, ACCOUNT, now)


def sync_now(warehouse: AnyWarehouse) -> datetime:
    requested_at = datetime.now(UTC)
    with warehouse.connect() as con:
        registry.request_sync(con, ACCOUNT, requested_at)
    return requested_at
